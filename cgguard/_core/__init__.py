"""The capture path on torch: ``hooks`` (the plain functions on the capture entry points),
``tracker`` (their state, and the checks of each attempt), ``book`` (the captures under way),
``fanout`` (their watchers told), ``captured_events``, ``syncs`` (synchronizes and queries
checked), ``watcher`` (what a watcher is), ``probes`` (what is asked of torch and the device:
the one seam), ``patches`` (the only module that touches torch) and ``installation``.

Imports cgguard._reporting, cgguard._gate and below."""
