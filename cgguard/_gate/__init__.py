"""The gate: may a capture begin now. ``flags`` (cgguard's flag, the frameworks' flags and
windows followed, and which of them disables capture), ``windows`` (entries resolved into
windows), ``profiles`` (the built-in frameworks'), ``follow`` (frameworks' flags followed),
``gate`` (one ``Gate`` holding them, the process's).

Imports cgguard._config, cgguard._rules, cgguard._boot (the post-import hook) and below."""
