"""Exemptions at work: matched against the stack of a capture that broke a rule.

Nothing here runs on the capture path: a stack is matched only once the guard has found a
rule broken, and only for the rules some exemption names. Every frame of the offending call's
stack is matched, not only the innermost one, and torch's frames too: a library that captures
through helpers, or through torch.cuda.graph, is still that library.
"""

from __future__ import annotations

import linecache
import sys
import threading
from typing import TYPE_CHECKING

from cgguard._rules.exempt_syntax import FILE, MODULE, kind, text
from cgguard._support.frames import _line_of

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import CodeType

    from cgguard._rules.exempt_syntax import Pair
    from cgguard._support.frames import FrameInfo, Stack

# Per code object, which exemption matches its frame: code made at run time (inductor, exec)
# would grow the cache without end, so it starts again past this size.
_CACHE_MAX = 4096


class Place:
    """One exemption's place, ready to match a frame's code."""

    __slots__ = ("glob", "kind", "label", "module", "qualname")

    def __init__(self, pair: Pair) -> None:
        place = pair[1]
        self.label = text(pair)
        self.kind = kind(place)
        self.glob = place if self.kind == FILE else ""
        module, _, qualname = place.partition(":")
        self.module = module.removesuffix(".") if self.kind != FILE else ""
        self.qualname = qualname

    def matches(self, code: CodeType, module: str | None) -> bool:
        """Whether a frame running ``code``, of ``module`` (None: not known), is this place."""
        if self.kind == FILE:
            from fnmatch import fnmatchcase  # re with it: only once a violation is matched

            return fnmatchcase(code.co_filename, self.glob)
        if module is None:
            return False
        if self.kind == MODULE:
            return module == self.module or module.startswith(self.module + ".")
        # co_qualname is 3.11's; 3.10's code knows only its own name, the qualname's last part.
        qualname = getattr(code, "co_qualname", None)
        if qualname is None:
            return module == self.module and self.qualname.rsplit(".", 1)[-1] == code.co_name
        return module == self.module and qualname == self.qualname


class Match:
    """The exemption that let a violation through, and the frame it matched."""

    __slots__ = ("code", "exemption", "lasti")

    def __init__(self, exemption: str, code: CodeType, lasti: int) -> None:
        self.exemption = exemption
        self.code = code
        self.lasti = lasti

    def frame(self) -> FrameInfo:
        """The matched frame, rendered: torch's own frames too, which an event's stack hides."""
        filename = self.code.co_filename
        line = _line_of(self.code, self.lasti)
        source = linecache.getline(filename, line).strip()
        return {
            "file": filename,
            "line": line,
            "function": self.code.co_name,
            "code": source or None,
        }


class Modules:
    """Which module a code object belongs to, found from its file: snapshots keep code objects,
    not frames, and a code object does not know its module."""

    def __init__(self) -> None:
        self._by_file: dict[str, str] = {}
        self._seen = -1  # len(sys.modules) when _by_file was built

    def of(self, code: CodeType) -> str | None:
        """The name of the module whose file ``code`` comes from; None if none is imported."""
        filename = code.co_filename
        name = self._by_file.get(filename)
        if name is None and len(sys.modules) != self._seen:
            self._rebuild()
            name = self._by_file.get(filename)
        return name

    def _rebuild(self) -> None:
        by_file: dict[str, str] = {}
        modules = list(sys.modules.values())
        for module in modules:
            try:
                # From the module's own namespace: getattr would call a module __getattr__
                # (PEP 562), which may import, for a module without a __file__.
                namespace = vars(module)
                filename = namespace.get("__file__")
                # The module's own name, not its key: a module aliased under a second name
                # (vllm.compilation.monitor, in vLLM's main branch) is known by its real one.
                name = namespace.get("__name__")
            except Exception:  # noqa: S112 - not a module (sys.modules may hold anything)
                continue
            if isinstance(filename, str) and isinstance(name, str):
                by_file.setdefault(filename, name)
        self._by_file = by_file
        self._seen = len(modules)


class Exemptions:
    """An installation's exemptions, by rule, ready to match a violating call's stack.

    What they let through is counted in the run's tally (cgguard._data.ledger), which outlives them.
    """

    def __init__(self, pairs: Iterable[Pair]) -> None:
        self.pairs = tuple(pairs)
        self._places: dict[str, list[Place]] = {}
        for pair in self.pairs:
            self._places.setdefault(pair[0], []).append(Place(pair))
        self._modules = Modules()
        self._lock = threading.Lock()
        # Per rule: id(code) -> (code, the first of the rule's places that matches it, or -1).
        # Each entry holds its code object, so that its id() is not reused while it stands.
        self._cache: dict[str, dict[int, tuple[CodeType, int]]] = {r: {} for r in self._places}

    def covers(self, rule: str) -> bool:
        """Whether any exemption names ``rule``."""
        return rule in self._places

    def match(self, rule: str, stack: Stack) -> Match | None:
        """The exemption of ``rule`` whose place is on ``stack``, innermost frame first."""
        places = self._places.get(rule)
        if not places:
            return None
        cache = self._cache[rule]
        frames = stack.snapshot
        for i in range(0, len(frames), 2):
            code = frames[i]
            if isinstance(code, int):
                break  # the count of outer frames a deep stack left out
            cached = cache.get(id(code))
            if cached is None:
                cached = (code, self._first_match(places, code))
                with self._lock:
                    if len(cache) >= _CACHE_MAX:
                        cache.clear()
                    cache[id(code)] = cached
            if cached[1] >= 0:
                lasti = frames[i + 1]
                assert isinstance(lasti, int)  # noqa: S101 - a snapshot pairs code with an int
                return Match(places[cached[1]].label, code, lasti)
        return None

    def _first_match(self, places: list[Place], code: CodeType) -> int:
        module = None
        if any(p.kind != FILE for p in places):
            with self._lock:
                module = self._modules.of(code)
        for index, place in enumerate(places):
            if place.matches(code, module):
                return index
        return -1
