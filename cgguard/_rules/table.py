"""Which rules exist: one record per rule, everything else about rules is derived from here.

Adding a rule is one entry in ``RULES`` plus its check in cgguard._rules.checks. The environment
variables, Config validation, the runner's ``--rule``, the pytest marker, event keys, console
titles and the exception raised all come from this table.
"""

# Read at start-up whenever a CGGUARD_* variable other than a plain CGGUARD_ENABLED=1 is set:
# standard library only, no ``typing``.
from cgguard._errors import (
    AbandonedCaptureError,
    CaptureDisabledError,
    CaptureViolation,
    ConcurrentCaptureError,
    DeadInputError,
    FirstUseInCaptureError,
    ImplicitSyncError,
    NestedCaptureError,
    RankDivergenceError,
    RngDuringCaptureError,
    StaleBindingError,
    SyncDuringCaptureError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

# Why a synchronize or query breaks a capture, where the message must say more than that the
# calling thread may not make it: the event it waits on was recorded into the capture, or the
# stream it waits on is the one capturing.
WHY_CAPTURED_EVENT = "captured_event"
WHY_CAPTURING_STREAM = "capturing_stream"

# What a rule's violation is blamed on, which decides what its report says of the cause.
BLAMES_FLAG = "flag"  # the flag that disables capture, and where it was disabled
BLAMES_CAPTURE = "capture"  # another capture, and where it began
BLAMES_THREAD = "thread"  # the thread that ended while its capture was active
BLAMES_RANKS = "ranks"  # the other ranks of the job, which captured otherwise

# vLLM's own words for the same rule, so that searches for its error find this one too.
DISABLED_SENTENCE = (
    "CUDA graph capturing detected at an inappropriate time. This operation is currently disabled."
)


class Cause:
    """What a message may say about a violation's cause: where, which thread, which mode, and
    for a synchronize or query, whether it queries and whether another thread captures."""

    __slots__ = ("elsewhere", "mode", "query", "thread_id", "where", "why")

    def __init__(
        self,
        where: str,
        thread_id: "int | None" = None,
        mode: str = "",
        *,
        query: bool = False,
        elsewhere: bool = False,
        why: str = "",
    ) -> None:
        # "begun at {where} via API" ({where} is filled in once the cause's stack is
        # rendered), or why capture was disabled.
        self.where = where
        self.thread_id = thread_id
        self.mode = mode
        self.query = query  # the offending call queries rather than synchronizes
        self.elsewhere = elsewhere  # the capture is another thread's
        # What the call waits on that breaks the capture: WHY_CAPTURED_EVENT (an event
        # recorded into it), WHY_CAPTURING_STREAM (its stream), or "" (a call the thread may
        # not make).
        self.why = why

    def explained(self, why: str) -> "Cause":
        """This cause with ``why`` in place of its own."""
        return self._with(self.where, why)

    def completed(self, where: str) -> "Cause":
        """This cause with ``{where}`` filled in."""
        return self._with(self.where.format(where=where), self.why)

    def _with(self, where: str, why: str) -> "Cause":
        return Cause(
            where,
            self.thread_id,
            self.mode,
            query=self.query,
            elsewhere=self.elsewhere,
            why=why,
        )


class Rule:
    """One rule: its name, its error, its default action, and how its reports read."""

    __slots__ = (
        "attempt_title",
        "blames",
        "cause_key",
        "cause_title",
        "diagnostic",
        "error",
        "message",
        "more_stacks",
        "name",
        "thread_key",
    )

    def __init__(
        self,
        error: "type[CaptureViolation]",
        *,
        diagnostic: bool,
        blames: str,
        cause_key: "str | None",
        cause_title: str,
        attempt_title: str,
        message: "Callable[[str, Cause], str]",
        thread_key: "str | None" = None,
        more_stacks: "tuple[tuple[str, str], ...]" = (),
    ) -> None:
        self.name = error.rule  # named once, on the exception users catch
        self.error = error
        # A diagnostic logs whatever the global mode; the others take the mode (raise or log).
        self.diagnostic = diagnostic
        self.blames = blames  # BLAMES_FLAG, BLAMES_CAPTURE or BLAMES_THREAD
        # The event key that holds the cause's stack, and its title in the console rendering;
        # None for a rule whose only stack is the offending one.
        self.cause_key = cause_key
        self.cause_title = cause_title
        self.attempt_title = attempt_title  # the console title of the offending call's stack
        # The event key that holds the id of the thread whose capture is the cause, where the
        # cause is another thread's capture.
        self.thread_key = thread_key
        # Further stacks the event holds, as (event key, console title): a dead input's first
        # read in the capture and where its storage was freed. Each may be None: not known.
        self.more_stacks = more_stacks
        # (head, cause) -> the exception's and the event's one-sentence message; ``head`` is
        # "API at FILE:LINE (in F)".
        self.message = message

    def __repr__(self) -> str:
        return f"<cgguard rule {self.name}>"


def _disabled(head: str, cause: Cause) -> str:
    return f"{DISABLED_SENTENCE} {head} began a capture; {cause.where}."


def _nested(head: str, cause: Cause) -> str:
    return (
        f"Nested CUDA graph capture is not supported: {head} began a capture while this "
        f"thread's capture {cause.where} is still active."
    )


def _concurrent(head: str, cause: Cause) -> str:
    return (
        f"Concurrent CUDA graph capture: {head} began a capture while thread {cause.thread_id} "
        f"has a capture {cause.where}, and one of them uses capture_error_mode 'global', in "
        f"which one thread's unsafe call invalidates the other's capture."
    )


_PROHIBITED = "'operation not permitted when stream is capturing'"


def _sync(head: str, cause: Cause) -> str:
    # Says only what CUDA documents (docs/cuda-behaviour.md); what relaxed mode does with a
    # synchronize that waits on neither the capturing stream nor a captured event is not.
    verb = "queries" if cause.query else "synchronizes"
    start = "Synchronize during CUDA graph capture:"
    whose = f"thread {cause.thread_id}'s" if cause.elsewhere else "this thread's"
    if cause.why == WHY_CAPTURED_EVENT:
        return (
            f"{start} {head} {verb} an event last recorded in {whose} capture {cause.where}, "
            f"which is active; CUDA fails it in every capture_error_mode ('operation not "
            f"permitted on an event last recorded in a capturing stream')."
        )
    if cause.why == WHY_CAPTURING_STREAM:
        return (
            f"{start} {head} {verb} the stream of {whose} capture {cause.where}, which is "
            f"active; CUDA fails it in every capture_error_mode ({_PROHIBITED}) and "
            f"invalidates the capture."
        )
    if cause.elsewhere:
        return (
            f"{start} {head} {verb} while thread {cause.thread_id}'s capture {cause.where} is "
            f"active in capture_error_mode 'global', in which CUDA fails an unsafe call on any "
            f"thread ({_PROHIBITED}) and invalidates the capture."
        )
    said = f"{start} {head} {verb} while this thread's capture {cause.where} is active"
    if cause.mode == "relaxed" and not cause.query:
        return (
            f"{said}; in capture_error_mode 'relaxed' CUDA fails it if it waits on the capturing "
            f"stream or on an event recorded in the capture, and where it goes through it does "
            f"not wait for the captured work, which has not run."
        )
    return f"{said}; CUDA fails it ({_PROHIBITED}) and invalidates the capture."


def _abandoned(head: str, cause: Cause) -> str:
    return (
        f"Abandoned CUDA graph capture: {head} began a capture on {cause.where}, which ended "
        f"while the capture was active. cgguard no longer counts it; CUDA may still be "
        f"capturing on its stream."
    )


def _implicit_sync(head: str, cause: Cause) -> str:
    # ``why`` holds what the user wrote to reach the op (cgguard._inspect.sync_ops).
    return (
        f"Implicit synchronize during CUDA graph capture: {head} ({cause.why}) waits for the "
        f"device while this thread's capture {cause.where} is active; CUDA fails it "
        f"({_PROHIBITED}) and invalidates the capture."
    )


def _dead_input(head: str, cause: Cause) -> str:
    # ``why`` says which tensor, where the capture first read it and where it was freed.
    return (
        f"Dead input at CUDA graph replay: {head} replays a graph whose capture {cause.where} "
        f"read a tensor allocated outside it that {cause.why}; the replay would read memory "
        f"that is no longer that tensor's."
    )


def _stale_binding(head: str, cause: Cause) -> str:
    # ``why`` names the binding, what changed, and where it was rebound. Found at a replay, or
    # by a check (cgguard.check_bindings(), after a framework's lifecycle function).
    if head.startswith("CUDAGraph.replay "):
        found = f"Stale binding at CUDA graph replay: {head} replays a graph"
    else:
        found = f"Stale binding: {head} finds a graph"
    return (
        f"{found} whose capture {cause.where} read {cause.why}; a replay would read the tensor "
        f"the graph baked in, not the one the name holds now. Copy into the old tensor (copy_, "
        f"load_state_dict), or capture the graph again."
    )


def _rng(head: str, cause: Cause) -> str:
    return (
        f"CUDA random-number generator used during CUDA graph capture: {head} while this "
        f"thread's capture {cause.where} is active; torch refuses it in CUDAGeneratorImpl "
        f"(seed and state cannot change while a graph captures its offsets)."
    )


def _first_use(head: str, cause: Cause) -> str:
    # ``why`` names the resource (a group and its ranks and backend, a peer, symmetric memory)
    # and what its first use does inside a capture, as far as torch's sources say (cgguard._ranks).
    return (
        f"First use of a communication resource inside CUDA graph capture: {head}, while this "
        f"thread's capture {cause.where} is active, uses {cause.why}. Use it once before "
        f"capture (a warm-up collective; init_process_group(device_id=...) creates NCCL's "
        f"communicator eagerly; a symmetric-memory rendezvous of the buffer before capture)."
    )


def _rank_divergence(head: str, cause: Cause) -> str:
    # ``why`` says which ranks differ from which, and where they first part.
    return (
        f"Ranks captured differently: {head} finds {cause.why}. Every rank must capture the "
        f"same graphs with the same collectives, or the job hangs or corrupts data."
    )


_ATTEMPT = "The capture was attempted at (most recent call last):"
_CAPTURE_BEGAN = "The capture began at (most recent call last):"

RULES: "dict[str, Rule]" = {
    rule.name: rule
    for rule in (
        Rule(
            CaptureDisabledError,
            diagnostic=False,
            blames=BLAMES_FLAG,
            cause_key="disabled_stack",
            cause_title="Capture was disabled at (most recent call last):",
            attempt_title=_ATTEMPT,
            message=_disabled,
        ),
        Rule(
            NestedCaptureError,
            diagnostic=False,
            blames=BLAMES_CAPTURE,
            cause_key="outer_stack",
            cause_title="The outer capture began at (most recent call last):",
            attempt_title=_ATTEMPT,
            message=_nested,
        ),
        Rule(
            ConcurrentCaptureError,
            diagnostic=True,
            blames=BLAMES_CAPTURE,
            thread_key="other_thread_id",
            cause_key="other_stack",
            cause_title="The other thread's capture began at (most recent call last):",
            attempt_title=_ATTEMPT,
            message=_concurrent,
        ),
        Rule(
            SyncDuringCaptureError,
            diagnostic=True,
            blames=BLAMES_CAPTURE,
            thread_key="capture_thread_id",
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The synchronize or query was made at (most recent call last):",
            message=_sync,
        ),
        # Found when cgguard next looks at the active captures: there is nothing to refuse, so
        # it is reported and never raised.
        Rule(
            AbandonedCaptureError,
            diagnostic=True,
            blames=BLAMES_THREAD,
            cause_key=None,
            cause_title="",
            attempt_title="The abandoned capture began at (most recent call last):",
            message=_abandoned,
        ),
        # The inspection's rules (cgguard._inspect.inspector): each a certain failure, so they take
        # the global mode.
        Rule(
            ImplicitSyncError,
            diagnostic=False,
            blames=BLAMES_CAPTURE,
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The synchronizing operation was called at (most recent call last):",
            message=_implicit_sync,
        ),
        Rule(
            DeadInputError,
            diagnostic=False,
            blames=BLAMES_CAPTURE,
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The replay was called at (most recent call last):",
            message=_dead_input,
            more_stacks=(
                ("read_stack", "The capture first read the tensor at (most recent call last):"),
                ("freed_stack", "The tensor's storage was freed at (most recent call last):"),
            ),
        ),
        Rule(
            StaleBindingError,
            diagnostic=False,
            blames=BLAMES_CAPTURE,
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The replay was called at (most recent call last):",
            message=_stale_binding,
            more_stacks=(("rebound_stack", "The name was rebound at (most recent call last):"),),
        ),
        Rule(
            RngDuringCaptureError,
            diagnostic=False,
            blames=BLAMES_CAPTURE,
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The random-number generator was called at (most recent call last):",
            message=_rng,
        ),
        # The ranks' rules (cgguard._ranks): what a rank cannot know alone is reported, never
        # refused by default.
        Rule(
            FirstUseInCaptureError,
            diagnostic=True,
            blames=BLAMES_CAPTURE,
            cause_key="capture_stack",
            cause_title=_CAPTURE_BEGAN,
            attempt_title="The resource was first used at (most recent call last):",
            message=_first_use,
        ),
        Rule(
            RankDivergenceError,
            diagnostic=True,
            blames=BLAMES_RANKS,
            cause_key=None,
            cause_title="",
            attempt_title="The ranks were compared at (most recent call last):",
            message=_rank_divergence,
        ),
    )
}

NAMES = tuple(RULES)
ACTIONS = ("raise", "log", "off")
