"""The command line, one module per subcommand: ``run`` (a program, guarded), ``info`` (this
environment), ``report`` (a job's reports merged), and ``main``.

Imports any layer below the composition root; nothing imports it but ``__main__``."""
