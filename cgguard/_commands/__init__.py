"""The command line: ``cgguard run``, ``cgguard info`` and ``cgguard report``, one module each,
and ``main``."""
