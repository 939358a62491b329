"""The event log: each event rendered by structlog, as JSON or for the console, then written.

structlog is imported when the first event is rendered, never before, and cgguard builds its own
logger: the host program's structlog configuration is never read or changed, and the standard
library's logging is only used when asked for (log target "logging").
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from cgguard._config.settings import LEVELS, shown
from cgguard._data.census_merge import counted, place_text, site_text, skip_text
from cgguard._rules.table import RULES
from cgguard._support.frames import format_frames
from cgguard._support.text import safe
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, MutableMapping

    from cgguard._support.frames import FrameInfo

    Processor = Callable[[Any, str, MutableMapping[str, Any]], Any]


class _StderrSink:
    """Writes each rendered event as one line to the current sys.stderr."""

    def msg(self, message: str) -> None:
        # Looked up per event: test runners and daemons replace sys.stderr after start-up.
        stream = sys.stderr
        stream.write(message + "\n")
        stream.flush()

    error = warning = info = debug = msg


class _FileSink:
    """Appends each rendered event to a file with a single write(2).

    O_APPEND makes each write land whole at the end, so processes sharing the file never
    interleave their lines.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        # Opened by the first event, from whichever thread: two threads opening it at once
        # would leave one descriptor open for good.
        self._opening = threading.Lock()

    def msg(self, message: str) -> None:
        fd = self.fd
        if fd is None:
            with self._opening:
                if self.fd is None:
                    self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                fd = self.fd
        data = memoryview((message + "\n").encode("utf-8", "backslashreplace"))
        # write(2) may write less than asked (a disk nearly full): finish the line, or fail,
        # which EventLog reports once before going on with stderr.
        whole = len(data)
        try:
            while data:
                written = os.write(fd, data)
                if written <= 0:
                    raise OSError(f"wrote {whole - len(data)} of {whole} bytes")
                data = data[written:]
        except OSError:
            if len(data) < whole:
                # End the cut line, so that the next line in a shared file still parses.
                with contextlib.suppress(OSError):
                    os.write(fd, b"\n")
            raise

    error = warning = info = debug = msg

    def close(self) -> None:
        with self._opening:
            fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)


class _LoggingSink:
    """Hands each rendered event to the standard library logger "cgguard", at its level.

    The whole event rides along as ``record.cgguard``, for handlers that want the fields.
    """

    def _log(self, level: int, message: str, event: dict[str, object]) -> None:
        import logging

        logging.getLogger("cgguard").log(level, "%s", message, extra={"cgguard": event})

    def error(self, message: str, event: dict[str, object]) -> None:
        self._log(40, message, event)  # logging.ERROR, without importing logging to say so

    def warning(self, message: str, event: dict[str, object]) -> None:
        self._log(30, message, event)

    # The exit summary of a run whose captures were all exempted, and exempted captures.
    def info(self, message: str, event: dict[str, object]) -> None:
        self._log(20, message, event)

    def debug(self, message: str, event: dict[str, object]) -> None:
        self._log(10, message, event)


_ORIGINAL = "__cgguard_event__"


def _stash_event(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Keep the event as it came, before console rendering folds its stacks into text."""
    event_dict[_ORIGINAL] = dict(event_dict)
    return event_dict


def _keep_event(renderer: Processor) -> Processor:
    """Render, then pass the event itself too: structlog calls the sink with (*args, **kwargs)."""

    def render(logger: object, name: str, event_dict: MutableMapping[str, Any]) -> Any:
        event = event_dict.pop(_ORIGINAL)
        return (renderer(logger, name, event_dict),), {"event": event}

    return render


def _event_first(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog adds ``event`` last; the schema has it first, where a reader looks."""
    return {"event": event_dict.pop("event"), **event_dict}


def _stacks_as_text(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Fold the stacks into one traceback-like block; ConsoleRenderer prints it below the line."""
    rule = RULES.get(str(event_dict.get("rule")))
    if rule is None or not isinstance(event_dict.get("stack"), list):
        return event_dict  # a repeat or a summary: no stacks to fold
    frames: list[FrameInfo] = event_dict.pop("stack")
    blocks = [f"{rule.attempt_title}\n" + format_frames(frames)]
    if rule.cause_key is not None and rule.cause_key in event_dict:
        cause: list[FrameInfo] | None = event_dict.pop(rule.cause_key)
        body = format_frames(cause) if cause is not None else "  (by configuration at start)"
        blocks.append(f"{rule.cause_title}\n{body}")
    for key, title in rule.more_stacks:
        more: list[FrameInfo] | None = event_dict.pop(key, None)
        blocks.append(f"{title}\n" + (format_frames(more) if more else "  (not known)"))
    event_dict["stack"] = "\n\n".join(blocks)
    return event_dict


def _census_as_text(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """The census's sites as lines below its one line of totals, for a person."""
    if event_dict.get("event") != "cgguard.census":
        return event_dict
    event_dict.pop("totals", None)
    lines = ["top capture sites (by seconds):"]
    for site in event_dict.pop("captures", None) or []:
        lines.append(f"  {site_text(site)}")
    skips = event_dict.pop("cudagraph_skips", None) or []
    if skips:
        lines.append("torch.compile's skipped cudagraphs:")
        lines += [f"  {skip_text(skip)}" for skip in skips]
    event_dict["stack"] = "\n".join(lines)
    return event_dict


def _summary_as_text(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """The exit summary as the census is shown: one line of totals, then a line per site."""
    if event_dict.get("event") != "cgguard.summary":
        return event_dict
    totals: dict[str, int] = event_dict.pop("totals", None) or {}
    sites: list[dict[str, Any]] = event_dict.pop("sites", None) or []
    exempted_totals: dict[str, int] = event_dict.pop("exempted_totals", None) or {}
    exempted: list[dict[str, Any]] = event_dict.pop("exempted_sites", None) or []
    said = counted(sum(totals.values()), "violation")
    if totals:
        said += f" at {counted(len(sites), 'site')}: " + ", ".join(
            f"{safe(rule)} {count}" for rule, count in totals.items()
        )
    if exempted_totals:
        said += f"; {counted(sum(exempted_totals.values()), 'exempted capture')}"
    event_dict["message"] = said
    lines = []
    if sites:
        lines.append("violations by site:")
        lines += [f"  {place_text(site)}: {safe(site['rule'])} {site['count']}" for site in sites]
    if exempted:
        lines.append("exempted captures by site:")
        lines += [
            f"  {place_text(site)}: {safe(site['rule'])} {site['count']} "
            f"(exemption {shown(site['exemption'])})"
            for site in exempted
        ]
    if lines:
        event_dict["stack"] = "\n".join(lines)
    return event_dict


class _Quoted:
    """A field's text that a terminal would act on: the console shows it as repr() writes it.

    Not a str: structlog's console renderer prints a str bare unless it holds a space or a
    quote, and calls repr() on anything else, so the field is escaped whatever structlog's
    version decides for text.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return repr(self.text)


# Printed with str() by the console renderer's own columns, not through repr().
_COLUMNS = ("event", "level", "timestamp")


def _safe_fields(_: object, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Fields holding control characters or bidi overrides, escaped before the console sees
    them. The folded stack is already safe (format_frames); other values are repr()'d."""
    for key, value in event_dict.items():
        if key == "stack" or not isinstance(value, str) or value.isprintable():
            continue
        event_dict[key] = safe(value) if key in _COLUMNS else _Quoted(value)
    return event_dict


def format_stacks(event: dict[str, object]) -> str:
    """An event's stacks as the console shows them: one traceback-like block per stack."""
    text = _stacks_as_text(None, "", dict(event)).get("stack")
    return text if isinstance(text, str) else ""


def console_processors(colors: bool) -> list[Processor]:
    """The processors that render an event for a person."""
    import structlog

    return [
        _stacks_as_text,
        _summary_as_text,
        _census_as_text,
        _safe_fields,
        structlog.dev.ConsoleRenderer(colors=colors),
    ]


def json_processors() -> list[Processor]:
    """The processors that render an event as one JSON line."""
    import structlog

    return [_event_first, structlog.processors.JSONRenderer()]


class EventLog:
    """Renders events with structlog and writes them to stderr or a file.

    ``processors`` replaces the rendering chain (tests end it with structlog's LogCapture).
    """

    def __init__(
        self,
        log_format: str | None = None,
        log_file: str | None = None,
        *,
        target: str | None = None,
        level: str = "debug",
        processors: list[Processor] | None = None,
    ) -> None:
        self.log_format = log_format
        # Events less severe than this are not written (CGGUARD_LOG_LEVEL).
        self.level = level
        self._quiet = frozenset(LEVELS[: LEVELS.index(level)])
        # Resolved once: a program that changes directory must not scatter its log.
        self.log_file = os.path.abspath(log_file) if log_file else log_file
        self.target = target or ("file" if log_file else "stderr")
        self._processors = processors
        self._sink: _StderrSink | _FileSink | _LoggingSink | None = None
        self._logger: Any = None
        # The logger is made by the first event, from whichever thread: two threads making it
        # at once would each open the log file, and one descriptor would stay open for good.
        self._making = threading.Lock()

    def emit(self, event: Mapping[str, object]) -> None:
        """Report one event; cgguard's own failures here are a warning, never an exception."""
        level = str(event.get("level", "error"))
        if level in self._quiet:
            return
        fields = dict(event)
        name = fields.pop("event")
        try:
            getattr(self._bound(), level)(name, **fields)
        except OSError as exc:
            if not isinstance(self._sink, _FileSink):
                warn_once("report", f"could not report a violation: {exc!r}")
                return
            warn_once(
                f"log_file:{self.log_file}",
                f"cannot write to log file {shown(self.log_file)} "
                f"({getattr(exc, 'strerror', None) or exc}); events go to stderr",
            )
            self._use(_StderrSink())
            self.emit(event)
        except Exception as exc:
            warn_once("report", f"could not report a violation: {exc!r}")

    def anew(self) -> EventLog:
        """The same log, made again: a forked child's, whose locks no parent thread holds."""
        return EventLog(
            self.log_format,
            self.log_file,
            target=self.target,
            level=self.level,
            processors=self._processors,
        )

    def close(self) -> None:
        """Release the log file, if one was opened."""
        if isinstance(self._sink, _FileSink):
            self._sink.close()

    def _bound(self) -> Any:
        logger = self._logger
        if logger is not None:
            return logger
        with self._making:
            if self._logger is None:
                self._make()
        return self._logger

    def _make(self) -> None:
        if self.target == "logging":
            self._use(_LoggingSink())
        elif self.target == "file" and self.log_file:
            self._use(_FileSink(self.log_file))
        else:
            self._use(_StderrSink())

    def _use(self, sink: _StderrSink | _FileSink | _LoggingSink) -> None:
        import structlog

        self._sink = sink
        processors = self._processors
        if processors is None:
            fmt = self.log_format
            if fmt is None:
                # A person at a terminal gets the console rendering; pipes, files and logging
                # handlers get JSON unless told otherwise.
                interactive = isinstance(sink, _StderrSink) and _isatty(sys.stderr)
                fmt = "console" if interactive else "json"
            if fmt == "console":
                colors = isinstance(sink, _StderrSink) and wants_colors(sys.stderr, os.environ)
                processors = console_processors(colors)
            else:
                processors = json_processors()
            if isinstance(sink, _LoggingSink):
                processors = [_stash_event, *processors[:-1], _keep_event(processors[-1])]
        # Built directly, not through structlog.get_logger(): that would read the host
        # program's global structlog configuration.
        self._logger = structlog.BoundLogger(sink, processors, context={})


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except Exception:
        return False


def wants_colors(stream: object, environ: Mapping[str, str]) -> bool:
    """Whether console events on ``stream`` are coloured, in the order Python 3.13 decides for
    its own tracebacks: ``PYTHON_COLORS`` (``0`` off, ``1`` on), then ``NO_COLOR`` set and not
    empty (no-color.org) off, then ``FORCE_COLOR`` set and not empty on, even off a terminal (a
    CI log), then a ``TERM`` of ``dumb`` off; otherwise a terminal gets them."""
    python = environ.get("PYTHON_COLORS")
    if python in ("0", "1"):
        return python == "1"
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    if environ.get("TERM") == "dumb":
        return False
    return _isatty(stream)
