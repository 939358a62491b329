"""cgguard's bootstrap sitecustomize: activate cgguard here, then run the next sitecustomize.

The folder holding this file, put on PYTHONPATH, switches cgguard on in every Python process
started with that environment; CGGUARD_ENABLED=0 switches it off. A Python in which cgguard is
not installed starts normally and silently. Either way, the sitecustomize that this one shadows
on sys.path still runs, as it would have without it.
"""

import os
import sys


def _run_next_sitecustomize() -> None:
    # Kept here, not in cgguard: it must run even where cgguard cannot be imported, in any
    # Python 3 that a child process may be (so nothing newer than its oldest). The plain
    # import statement, with this folder off sys.path for a moment, finds the next one at no
    # cost beyond its own: importlib.util alone would add milliseconds to every start.
    here = os.path.dirname(os.path.abspath(__file__))
    ours = [(i, p) for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
    for i, _ in reversed(ours):
        del sys.path[i]
    this = sys.modules.pop("sitecustomize", None)
    try:
        __import__("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if this is not None:
            sys.modules["sitecustomize"] = this
    finally:
        # Back where they were; the next sitecustomize's own changes to sys.path stay.
        for i, entry in ours:
            sys.path.insert(i, entry)


try:
    from cgguard import activate
except Exception:  # noqa: S110 - no cgguard in this Python: start as if we were absent
    pass
else:
    activate("sitecustomize", default=True)

_run_next_sitecustomize()
del _run_next_sitecustomize
