"""What a violation does once found: ``reporter`` (refused or let through, counted, told,
logged, written), ``events`` (the one builder of events and of the report's document),
``log``, ``report_file``, ``metrics`` and ``tracebacks`` (a raised violation's traceback shown
ending at the user's line, and the exception hooks that show uncaught ones so).

Imports cgguard._data, cgguard._config, cgguard._boot (the post-import hook) and below; not
cgguard._gate, beside which it stands."""
