"""What a violation does: refused or let through, counted, matched against exemptions, told to
the listeners, logged and written to the report.

A ``Reporter`` is built whole from one configuration and the run it counts into; install()
swaps a new one in with one assignment, so a capture sees the old one or the new one, never a
mix. The old one closes its log and report once no violation is in flight through it; one that
arrives after the swap is handed to its successor.

Refusal is decided first, from the configuration and the exemptions alone: no failure while
building or writing a report can let a refused capture through.
"""

from __future__ import annotations

import threading
from threading import get_ident
from typing import TYPE_CHECKING, cast

from cgguard._reporting import events as _events
from cgguard._rules.record import API, BEGAN_AT, MODE, QUERIES, THREAD, Disabler
from cgguard._rules.table import BLAMES_FLAG, BLAMES_RANKS, BLAMES_THREAD, RULES, Cause
from cgguard._support.frames import Stack
from cgguard._support.threads import this_thread
from cgguard._support.warn import warn_once

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from cgguard._config.config import Action, Config
    from cgguard._data.ledger import Run
    from cgguard._data.schema import ViolationEvent
    from cgguard._errors import CaptureViolation
    from cgguard._reporting.log import EventLog
    from cgguard._reporting.metrics import Prometheus
    from cgguard._reporting.report_file import ReportFile
    from cgguard._rules.exempt_match import Exemptions, Match
    from cgguard._rules.record import Found, Record
    from cgguard._support.frames import LiveStack, Snapshot

    Acting = list[tuple[str, "Record | Disabler | None", Action]]


# How long a reconfiguration waits for violations in flight through the old reporter before it
# leaves the closing of the old log and report to the last of them.
_CLOSE_WAIT = 5.0


class Reporter:
    """One configuration's response to violations, counted into ``run``."""

    def __init__(
        self,
        config: Config,
        run: Run,
        *,
        listeners: list[Callable[[ViolationEvent], None]],
        log: EventLog | None = None,
        report: ReportFile | None = None,
        exemptions: Exemptions | None = None,
        profiles: Mapping[str, Exemptions] | None = None,
        metrics: Prometheus | None = None,
    ) -> None:
        self.config = config
        self.run = run
        self.log = log  # None: say nothing
        self.report = report  # told of every violation counted; it writes in its own thread
        # None: no exemption, and then no stack is ever matched. Consulted only once a rule is
        # found broken: an exemption costs the capture path nothing.
        self.exemptions = exemptions
        # The built-in profiles' exemptions, by profile: each applies only to the refusals
        # its own profile's windows make (cgguard._gate.profiles).
        self.profiles: Mapping[str, Exemptions] = profiles or {}
        self.listeners = listeners  # the process's (cgguard._process), shared by every reporter
        # The process's metrics, where the configuration asks for them: each violation counted.
        self.metrics = metrics
        # Taken by every violation, as a plain lock (its ``with`` costs no Python call); the
        # condition over it is waited on only by retire(), and notified only once retired.
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)
        self._users: list[int] = []  # the threads reporting through this reporter now
        self._retired = False
        self._successor: Reporter | None = None
        self._closed = False

    def violated(
        self,
        found: Found,
        api: str,
        stack: Snapshot | LiveStack,
        *,
        refuse: bool,
        why: str = "",
        more: Mapping[str, Snapshot | None] | None = None,
    ) -> CaptureViolation | None:
        """Count and report each violation; return the error to raise, if an action says raise.

        ``stack`` is the offending call's, as the capture path kept it: resolved once here, as
        far as the report needs. With ``refuse`` false (too late to refuse), a raise action is
        reported as logged. An exempted violation is counted as exempted, and neither raised
        nor reported. ``more``: the further stacks a rule's event holds (cgguard._rules.table,
        ``more_stacks``).
        """
        with self._lock:
            if self._retired:
                successor = self._successor
                if successor is None:
                    return None
            else:
                successor = None
                self._users.append(get_ident())
        if successor is not None:
            return successor.violated(found, api, stack, refuse=refuse, why=why, more=more)
        try:
            return self._violated(found, api, Stack(stack), refuse=refuse, why=why, more=more)
        finally:
            with self._lock:
                self._users.remove(get_ident())
                closing = False
                if self._retired:
                    self._left.notify_all()
                    closing = not self._users and not self._closed
                    if closing:
                        self._closed = True
            if closing:
                self._close_outputs()

    def retire(self, successor: Reporter | None) -> None:
        """Hand every later violation to ``successor`` (None: drop them), then close the log
        and the report, once no violation is in flight here."""
        me = get_ident()
        with self._lock:
            self._retired = True
            self._successor = successor
            # Not for the calling thread's own violation (a listener that reconfigures): the
            # last to leave closes then.
            self._left.wait_for(lambda: all(user == me for user in self._users), _CLOSE_WAIT)
            if self._users or self._closed:
                return
            self._closed = True
        self._close_outputs()

    def _close_outputs(self) -> None:
        try:
            if self.report is not None:
                # A later reporter writing the same file has the same run to write: this one's
                # final version would only replace that one's with an older configuration. It
                # is told of the counts made here since it last wrote instead.
                same = self._later_report(self.report.template)
                self.report.close(final=same is None)
                if same is not None:
                    same.changed(new_site=False)
            if self.log is not None:
                self.log.close()
        except Exception as exc:
            warn_once("close", f"could not close the log or the report: {exc!r}")

    def _report(self) -> ReportFile | None:
        """The report to tell of a count: this reporter's own, or once it is retired (a
        listener reconfigured while this violation was in flight) the latest later one that
        writes the same file, which must not be replaced by this older configuration."""
        report = self.report
        if report is None or not self._retired:
            return report
        return self._later_report(report.template) or report

    def _later_report(self, template: str) -> ReportFile | None:
        """The report of the latest reporter after this one that writes ``template``."""
        found = None
        successor = self._successor
        while successor is not None:
            if successor.report is not None and successor.report.template == template:
                found = successor.report
            successor = successor._successor
        return found

    def close(self) -> None:
        """The final report and the log let go: at exit, and when the installation ends."""
        self.retire(None)

    def _violated(
        self,
        found: Found,
        api: str,
        stack: Stack,
        *,
        refuse: bool,
        why: str,
        more: Mapping[str, Snapshot | None] | None = None,
    ) -> CaptureViolation | None:
        acting: Acting = []
        profiled = False  # whether a built-in profile's windows alone refused the capture
        config = self.config
        for rule, cause in found:
            action = config.action(rule)
            if type(cause) is Disabler and cause.profile is not None:
                profiled = True
                if action == "raise" and config.profiles != "raise":
                    # A built-in profile's first release: it reports what it would refuse, so
                    # that a server that ran yesterday still runs today (docs/integrations.md).
                    action = "log"
            if action != "off":
                acting.append((rule, cause, action))
        if profiled and self.profiles and acting:
            acting = self._profile_exempted(acting, api, stack)
        if self.exemptions is not None and acting:
            acting = self._exempted(acting, api, stack, self.exemptions)
        if not acting:
            return None
        try:
            return self._report_each(acting, api, stack, refuse=refuse, why=why, more=more)
        except Exception as exc:
            warn_once("guard:report", f"internal error while reporting a violation: {exc!r}")
            refusing = next((r for r, _, a in acting if refuse and a == "raise"), None)
            if refusing is None:
                return None
            # Refused all the same, with what is known without the report.
            message = f"{refusing}: {api} refused (cgguard could not build the report: {exc!r})"
            return RULES[refusing].error(message, {"rule": refusing, "api": api})

    def _profile_exempted(self, acting: Acting, api: str, stack: Stack) -> Acting:
        """The violations no built-in exemption lets through: each profile's exemptions are
        matched against the violations its own windows caused, and counted as any other."""
        kept: Acting = []
        for item in acting:
            profile = _profile_of(item[1])
            exemptions = self.profiles.get(profile) if profile is not None else None
            if exemptions is None:
                kept.append(item)
                continue
            kept += self._exempted([item], api, stack, exemptions)
        return kept

    def _exempted(self, acting: Acting, api: str, stack: Stack, exemptions: Exemptions) -> Acting:
        """The violations no exemption lets through.

        Each one exempted is counted, logged at debug level the first time at its site, and
        told to the report. A failure to match is one warning, and the violation stands.
        """
        try:
            if not any(exemptions.covers(rule) for rule, _, _ in acting):
                return acting
            matched = [(item, exemptions.match(item[0], stack)) for item in acting]
        except Exception as exc:
            warn_once("guard:exempt", f"internal error while matching exemptions: {exc!r}")
            return acting
        for (rule, _, _), match in matched:
            if match is not None:
                try:
                    self._count_exempted(rule, api, stack, match)
                except Exception as exc:
                    warn_once("guard:exempted", f"could not count an exempted capture: {exc!r}")
        return [item for item, match in matched if match is None]

    def _count_exempted(self, rule: str, api: str, stack: Stack, match: Match) -> None:
        code, lasti = stack.site
        site, count = self.run.tally.count(rule, code, lasti, api, match.exemption)
        if count == 1:
            site.first = _events.exempted(rule, api, stack, match.exemption, match.frame())
            if self.log is not None:
                self.log.emit(site.first)
        report = self._report()
        if report is not None:
            # As a count, never as a new site: a violation's new site is on disk before the
            # program goes on, which costs a write per site; what an exemption let through
            # follows within half a second, and never costs the capture a write.
            report.changed(new_site=False)

    def _report_each(
        self,
        acting: Acting,
        api: str,
        stack: Stack,
        *,
        refuse: bool,
        why: str,
        more: Mapping[str, Snapshot | None] | None = None,
    ) -> CaptureViolation | None:
        code, lasti = stack.site
        ledger = self.run.ledger
        error: CaptureViolation | None = None
        for rule, cause, action in acting:
            raising = action == "raise" and refuse
            taken = "raised" if raising else "logged"
            site, count = ledger.count(rule, code, lasti, api, taken)
            if self.metrics is not None:
                metrics = self.metrics.active()
                if metrics is not None:
                    metrics.violated(rule, taken)
            event: ViolationEvent | None = None  # built only where needed
            # Rendering is the expensive part: only for the first at a site, a raise, or
            # listeners that must see every violation in full.
            if count == 1 or raising or self.listeners:
                event = _event(
                    rule, api, stack, cause, action=taken, count=count, why=why, more=more
                )
                if count == 1:
                    site.first = event
                self._publish(event)
            report = self._report()
            if report is not None:
                report.changed(new_site=count == 1)
            if self.log is not None:
                if count == 1 and event is not None:
                    self.log.emit(event)
                elif count & (count - 1) == 0:  # a repeat, said briefly at 2, 4, 8, 16, ...
                    self.log.emit(_events.repeat(site, count, site.frame()))
            if raising and error is None and event is not None:
                error = RULES[rule].error(event["message"], event)
        return error

    def _publish(self, event: ViolationEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception as exc:
                warn_once("listener", f"a violation listener failed: {exc!r}")


def _profile_of(cause: Record | Disabler | None) -> str | None:
    """The built-in profile whose windows alone refused the capture, or None."""
    return cause.profile if type(cause) is Disabler else None


def _event(
    rule: str,
    api: str,
    stack: Stack,
    cause: Record | Disabler | None,
    *,
    action: str,
    count: int,
    why: str = "",
    more: Mapping[str, Snapshot | None] | None = None,
) -> ViolationEvent:
    """The full event of one violation, its cause told as its rule's table entry says."""
    blames = RULES[rule].blames
    if blames == BLAMES_RANKS:
        # The cause is on other ranks: what the check found, told in ``why``.
        told = Cause("", why=why)
        return _events.violation(rule, api, stack, None, told, action=action, count=count)
    if blames == BLAMES_FLAG or cause is None:
        disabler = cast("Disabler | None", cause)
        label, origin, how = disabler[:3] if disabler is not None else (None, None, "")
        if origin is not None:
            told = Cause("capture was disabled at {where}" + how)
        elif label is None:
            told = Cause("capture was disabled by cgguard's configuration at start")
        else:
            told = Cause(f"capture was disabled by {label}")
        cause_stack = Stack(origin) if origin is not None else None
        return _events.violation(rule, api, stack, cause_stack, told, action=action, count=count)
    record = cast("Record", cause)
    thread = record[THREAD]
    if blames == BLAMES_THREAD:
        told = Cause(f"thread {thread.name!r} ({thread.ident})", thread.ident, record[MODE])
        return _events.violation(
            rule,
            api,
            stack,
            None,
            told,
            action=action,
            count=count,
            thread=(thread.name, thread.ident),
        )
    told = Cause(
        f"begun at {{where}} via {record[API]}",
        thread.ident,
        record[MODE],
        query=api in QUERIES,
        elsewhere=thread is not this_thread(),
        why=why,
    )
    more_stacks = {k: Stack(v) if v is not None else None for k, v in (more or {}).items()}
    return _events.violation(
        rule,
        api,
        stack,
        Stack(record[BEGAN_AT]),
        told,
        action=action,
        count=count,
        more=more_stacks,
    )
