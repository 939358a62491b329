"""What a violation does once found: ``reporter`` (refused or let through, counted, told,
logged, written), ``events`` (the one builder of events and of the report's document),
``log``, ``report_file`` and ``metrics``.

Imports cgguard._data, cgguard._config, cgguard._boot (the post-import hook) and below; not
cgguard._gate, beside which it stands."""
