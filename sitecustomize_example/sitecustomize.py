"""cgguard's bootstrap sitecustomize: activate cgguard here, then run the next sitecustomize.

The folder holding this file, put on PYTHONPATH, switches cgguard on in every Python process
started with that environment; CGGUARD_ENABLED=0 switches it off. A Python in which cgguard is
not installed starts normally and silently. Either way, the sitecustomize that this one shadows
on sys.path still runs, as it would have without it.
"""

import os
import sys


def _run_next_sitecustomize() -> None:
    # Kept here, not in cgguard: it must run even where cgguard cannot be imported.
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    from cgguard._bootstrap import activate
except Exception:  # noqa: S110 - no cgguard in this Python: start as if we were absent
    pass
else:
    activate("sitecustomize", default=True)

_run_next_sitecustomize()
del _run_next_sitecustomize
