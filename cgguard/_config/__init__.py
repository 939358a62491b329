"""Configuration: ``settings`` (one record per setting, and the one parser of the environment,
cheap enough for start-up) and ``config`` (``Config``, the frozen configuration).

Imports cgguard._rules, cgguard._boot (the variable that switches cgguard on) and below."""
