"""Threads as captures remember them: by an object that dies with the thread, not by its id."""

from __future__ import annotations

import threading
import weakref
from threading import current_thread


class _Mark:
    """An object that lives exactly as long as its thread."""

    __slots__ = ("__weakref__",)


class ThreadRef(weakref.ref[_Mark]):
    """A thread as captures remember it: its name and id, and whether it still runs (the
    reference is dead once the thread has ended)."""

    __slots__ = ("ident", "name")

    def __new__(cls, mark: _Mark, thread: threading.Thread) -> ThreadRef:
        # weakref.ref's own __new__ would take ``thread`` for a callback.
        return super().__new__(cls, mark)

    def __init__(self, mark: _Mark, thread: threading.Thread) -> None:
        # No super().__init__(): weakref.ref does all its work in __new__.
        self.name = thread.name
        self.ident = thread.ident


# One mark per running thread, held only by that thread's local storage, which Python clears
# when the thread ends, whoever started it (threading, _thread, C code). A weak reference to it
# dies with the thread: neither the thread's id, which the next thread may reuse at once, nor
# threading's _DummyThread, which never says it ended, nor the main thread, which threading
# counts as stopped while exit handlers still run on it, could tell that.
class _Marks(threading.local):
    """Each thread's mark and its ThreadRef, made at the thread's first read of them."""

    def __init__(self) -> None:
        self.mark = _Mark()
        self.ref = ThreadRef(self.mark, current_thread())


# ``marks.ref`` is the calling thread's ThreadRef: the capture path reads it without a call.
marks = _Marks()


def this_thread() -> ThreadRef:
    """The calling thread, as captures remember it: the same object for every call on it."""
    return marks.ref
