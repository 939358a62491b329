"""One line on stderr when cgguard itself goes wrong: never an exception, never a warning."""

# Imported on the start-up path: standard library only.
# Not warnings.warn: under ``python -W error`` that would turn cgguard's trouble into the
# program's crash, the one thing an agent must never cause.
import sys

_said: set[str] = set()

# A line is cut after this many characters of its message. The values cgguard quotes are cut
# shorter where they are quoted (cgguard._config.settings.SHOWN); this keeps any other message, one
# that repeats a long path or holds a long exception's text, to one readable line as well.
LONGEST = 1000


def warn_once(key: str, message: str) -> None:
    """Print ``cgguard: message`` to stderr the first time ``key`` is seen in this process."""
    if key in _said:
        return
    _said.add(key)
    if len(message) > LONGEST:
        message = f"{message[:LONGEST]}... ({len(message)} characters)"
    try:
        sys.stderr.write(f"cgguard: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110 - a closed stderr must not become the program's problem
        pass


def forget() -> None:
    """Nothing said yet, as the process started (cgguard._process.reset, for tests)."""
    _said.clear()
