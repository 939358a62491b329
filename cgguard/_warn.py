"""One line on stderr when cgguard itself goes wrong: never an exception, never a warning."""

# Imported on the start-up path: standard library only.
# Not warnings.warn: under ``python -W error`` that would turn cgguard's trouble into the
# program's crash, the one thing an agent must never cause.
import sys

_said: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Print ``cgguard: message`` to stderr the first time ``key`` is seen in this process."""
    if key in _said:
        return
    _said.add(key)
    try:
        sys.stderr.write(f"cgguard: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110 - a closed stderr must not become the program's problem
        pass
