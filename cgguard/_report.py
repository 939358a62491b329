"""How a violation is spoken: a structlog event rendered as JSON or for the console, then written.

structlog is imported when the first event is rendered, never before, and cgguard builds its own
logger: the host program's structlog and logging configuration are never read or changed.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from cgguard._frames import format_frames
from cgguard._warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, MutableMapping

    from cgguard._frames import FrameInfo

    Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]

_CAUSES = (
    ("outer_stack", "The outer capture began at (most recent call last):"),
    ("disabled_stack", "Capture was disabled at (most recent call last):"),
)


class _StderrSink:
    """Writes each rendered event as one line to the current sys.stderr."""

    def msg(self, message: str) -> None:
        # Looked up per event: test runners and daemons replace sys.stderr after start-up.
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    error = warning = msg


class _FileSink:
    """Appends each rendered event to a file with a single write(2).

    O_APPEND makes each write land whole at the end, so processes sharing the file never
    interleave their lines.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None

    def msg(self, message: str) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self.fd, (message + "\n").encode("utf-8", "backslashreplace"))

    error = warning = msg

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _event_first(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog adds ``event`` last; the schema has it first, where a reader looks."""
    return {"event": event_dict.pop("event"), **event_dict}


def _stacks_as_text(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Fold the stacks into one traceback-like block; ConsoleRenderer prints it below the line."""
    frames: list[FrameInfo] = event_dict.pop("stack")
    blocks = ["The capture was attempted at (most recent call last):\n" + format_frames(frames)]
    for key, title in _CAUSES:
        if key in event_dict:
            cause: list[FrameInfo] | None = event_dict.pop(key)
            body = format_frames(cause) if cause is not None else "  (by configuration at start)"
            blocks.append(f"{title}\n{body}")
    event_dict["stack"] = "\n\n".join(blocks)
    return event_dict


def console_processors(colors: bool) -> list[Processor]:
    """The processors that render an event for a person."""
    import structlog

    return [_stacks_as_text, structlog.dev.ConsoleRenderer(colors=colors)]


def json_processors() -> list[Processor]:
    """The processors that render an event as one JSON line."""
    import structlog

    return [_event_first, structlog.processors.JSONRenderer()]


class Reporter:
    """Renders violation events with structlog and writes them to stderr or a file.

    ``processors`` replaces the rendering chain (tests end it with structlog's LogCapture).
    """

    def __init__(
        self,
        log_format: str | None = None,
        log_file: str | None = None,
        *,
        processors: list[Processor] | None = None,
    ) -> None:
        self.log_format = log_format
        self.log_file = log_file
        self._processors = processors
        self._sink: _StderrSink | _FileSink | None = None
        self._logger: Any = None

    def emit(self, event: dict[str, object]) -> None:
        """Report one event; cgguard's own failures here are a warning, never an exception."""
        fields = dict(event)
        name = fields.pop("event")
        level = str(fields.get("level", "error"))
        try:
            getattr(self._bound(), level)(name, **fields)
        except OSError as exc:
            if not isinstance(self._sink, _FileSink):
                warn_once("report", f"could not report a violation: {exc!r}")
                return
            warn_once(
                f"log_file:{self.log_file}",
                f"cannot write to log file {self.log_file!r} ({exc}); events go to stderr",
            )
            self._use(_StderrSink())
            self.emit(event)
        except Exception as exc:
            warn_once("report", f"could not report a violation: {exc!r}")

    def close(self) -> None:
        """Release the log file, if one was opened."""
        if isinstance(self._sink, _FileSink):
            self._sink.close()

    def _bound(self) -> Any:
        if self._logger is None:
            self._use(_FileSink(self.log_file) if self.log_file else _StderrSink())
        return self._logger

    def _use(self, sink: _StderrSink | _FileSink) -> None:
        import structlog

        self._sink = sink
        processors = self._processors
        if processors is None:
            fmt = self.log_format
            if fmt is None:
                fmt = "console" if _isatty(sys.stderr) else "json"
            if fmt == "console":
                colors = isinstance(sink, _StderrSink) and _isatty(sys.stderr)
                processors = console_processors(colors)
            else:
                processors = json_processors()
        # Built directly, not through structlog.get_logger(): that would read the host
        # program's global structlog configuration.
        self._logger = structlog.BoundLogger(sink, processors, context={})


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except Exception:
        return False
