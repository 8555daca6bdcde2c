"""The run's state machine: what a segment's outcome, or a close from outside, does to a run.

One rule for every store. The in-memory store (:mod:`engine.inmemory`, behind
:mod:`engine.testing`) and the database store (``workflows/store/lifecycle.py`` and the
operator paths of ``workflows/services.py``) call :func:`after_segment` or :func:`close`
and *apply* the :class:`Transition` they get back; neither decides a status, a wake time,
an attempt or what a run's end gives back by itself. The worker's report of a segment
(:func:`outcome_kind`) comes from here too.

Pure code: no storage, no clock (``now_ms`` is an argument), no Django.

What a transition covers:

- a segment that suspends: ``ready``, due at the earliest of its wait's deadline and the
  store's recheck, or at once when something that may satisfy the wait arrived while the
  segment ran; the attempt counter starts again;
- a segment that completes: ``done`` with its result;
- a segment that fails: non-determinism dead-letters at once (a fixed version can be
  retried from the dead-letter queue); a retryable failure is retried after the policy's
  backoff (forgetting the failed call, so the retry makes it again), then dead-lettered
  after the last attempt; a permanent failure fails;
- continue-as-new: ``done``, and a successor run with the new input and version;
- terminate, force-complete, force-fail from outside (:func:`close`).

A run's end (``done``, ``failed``, ``dead_lettered``, ``terminated``) closes its open
children by their parent-close policy (:func:`child_close`), fails its pending updates,
clears its timer and releases the locks (concurrency keys) its workflow holds. Continue-as-new
keeps the locks: they are held by the workflow id, which the successor carries on. Defers
run inside the segment, before its outcome exists, so no transition carries any; a close
from outside runs no guest code, so a terminated run's defers do not run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ErrorCode
from engine.events import AcquireLockEvent, Event, EventType, ReleaseLockEvent
from engine.outcomes import Completed, ContinuedAsNew, Failed, Outcome, Suspended
from engine.status import TERMINAL_STATUSES, AbiStatus, RunStatus

# The result a continued run keeps (its real answer is its successor's), as the database
# store has always written it.
CONTINUED_RESULT = '{"continued_as_new": true}'


@dataclass(frozen=True)
class RetryPolicy:
    """Segments attempted for a retryable failure, and the backoff between them."""

    max_attempts: int = 3
    initial_interval_s: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval_s: float = 300.0

    def delay_s(self, attempt: int) -> float:
        """Backoff before the retry that follows failed attempt ``attempt`` (1-based)."""
        delay = self.initial_interval_s * self.backoff_coefficient ** max(0, attempt - 1)
        return min(delay, self.max_interval_s)

    def problems(self) -> list[str]:
        """What is wrong with the policy, each naming its field (empty when it is sound)."""
        found = []
        if self.max_attempts < 1:
            found.append("max_attempts must be at least 1")
        if self.initial_interval_s < 0:
            found.append("initial_interval_s must not be negative")
        if self.backoff_coefficient < 1:
            found.append("backoff_coefficient must be at least 1")
        if self.max_interval_s < 0:
            found.append("max_interval_s must not be negative")
        return found


@dataclass(frozen=True)
class RunPolicy:
    """The definition's policies, and the store's recheck of waiting runs."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # The longest a waiting run sleeps before its store looks at it again (a safety net for
    # a lost wake-up); None: a waiting run sleeps until something wakes it.
    wait_recheck_ms: int | None = None


@dataclass(frozen=True)
class RunState:
    """What the rule needs to know about the run whose segment ended."""

    workflow_id: str
    version: int
    attempt: int = 1
    # Something that may satisfy the wait (a signal, an update, a cancellation request, a
    # child's end, a settled promise) arrived while the segment ran.
    wakeup_arrived: bool = False


@dataclass(frozen=True)
class Successor:
    """The run continue-as-new starts: same workflow id, parent and priority."""

    input: str
    version: int  # the version asked for; the current one when the guest asked for none


@dataclass(frozen=True)
class Transition:
    status: RunStatus
    # When ``ready``: due at this time; None: waits until something wakes it.
    wake_at_ms: int | None = None
    # The segment attempt the run is at next; None: unchanged (it ended, and keeps the
    # number of attempts it took).
    attempt: int | None = None
    waiting_on: dict[str, Any] | None = None
    result: str | None = None
    error: str | None = None
    error_code: str | None = None
    successor: Successor | None = None
    # A retry makes the failed call again instead of replaying its recorded failure.
    forget_failed_call: bool = False
    # The locks (concurrency keys) held by this workflow id are given back.
    release_locks_of: str | None = None

    @property
    def ended(self) -> bool:
        """The run ended: close its children, fail its pending updates, wake its parent."""
        return self.status in TERMINAL_STATUSES

    @property
    def updates_failure(self) -> str:
        """What a pending update the run can no longer answer is failed with."""
        return f"the run ended ({self.status}) before answering"


def completion(outcome: Outcome, workflow_id: str) -> Transition | None:
    """The transition of a completed segment (None for any other outcome): it depends on
    nothing else, so a store may apply it without reading the run first."""
    if not isinstance(outcome, Completed):
        return None
    return Transition(RunStatus.DONE, result=outcome.result, release_locks_of=workflow_id)


def suspension(
    outcome: Suspended, policy: RunPolicy, now_ms: int, wakeup_arrived: bool
) -> Transition:
    """The transition of a suspended segment: it depends on nothing of the run but whether
    something that may satisfy the wait arrived while the segment ran
    (``RunState.wakeup_arrived``), so a store may take it both ways and let the read under
    its lock choose (``cleat.finalize_wait``, workflows/store/sql/postgresql.py)."""
    wait = outcome.wait
    wake = wait.wake_at_ms
    if policy.wait_recheck_ms is not None:
        recheck = now_ms + policy.wait_recheck_ms
        wake = recheck if wake is None else min(wake, recheck)
    if wakeup_arrived:
        wake = now_ms
    return Transition(RunStatus.READY, wake_at_ms=wake, attempt=1, waiting_on=wait.as_dict())


def after_segment(outcome: Outcome, run: RunState, policy: RunPolicy, now_ms: int) -> Transition:
    """The transition a segment's outcome makes (see the module docstring)."""
    if isinstance(outcome, Completed):
        done = completion(outcome, run.workflow_id)
        assert done is not None
        return done
    if isinstance(outcome, Suspended):
        return suspension(outcome, policy, now_ms, run.wakeup_arrived)
    if isinstance(outcome, ContinuedAsNew):
        return Transition(
            RunStatus.DONE,
            result=CONTINUED_RESULT,
            successor=Successor(outcome.input, outcome.version or run.version),
        )
    if isinstance(outcome, Failed):
        return _after_failure(outcome, run, policy.retry, now_ms)
    raise TypeError(f"unrecognised segment outcome {outcome!r}")


def _after_failure(outcome: Failed, run: RunState, retry: RetryPolicy, now_ms: int) -> Transition:
    message, code = outcome.message, outcome.code.value
    if outcome.code is ErrorCode.NONDETERMINISM:
        final = RunStatus.DEAD_LETTERED
    elif not outcome.retryable:
        final = RunStatus.FAILED
    elif run.attempt >= retry.max_attempts:
        final = RunStatus.DEAD_LETTERED
    else:
        return Transition(
            RunStatus.READY,
            wake_at_ms=now_ms + int(retry.delay_s(run.attempt) * 1000),
            attempt=run.attempt + 1,
            waiting_on={
                "kind": "retry",
                "description": f"retry {run.attempt + 1} of {retry.max_attempts} after {code}",
            },
            error=message,
            error_code=code,
            forget_failed_call=True,
        )
    return Transition(
        final,
        error=message,
        error_code=code,
        release_locks_of=run.workflow_id,
    )


# --- closes from outside the segment -----------------------------------------------------------


def terminate(workflow_id: str, reason: str) -> Transition:
    return Transition(
        RunStatus.TERMINATED,
        error=reason,
        error_code=ErrorCode.TERMINATED.value,
        release_locks_of=workflow_id,
    )


def force_complete(workflow_id: str, result: str) -> Transition:
    return Transition(RunStatus.DONE, result=result, release_locks_of=workflow_id)


def force_fail(workflow_id: str, message: str, code: str) -> Transition:
    return Transition(
        RunStatus.FAILED, error=message, error_code=code, release_locks_of=workflow_id
    )


def successor_refused(workflow_id: str, code: str, message: str) -> Transition:
    """Continue-as-new to a version the run may not move to (``engine.versions``'s
    ``move_refusal``): the run fails with the reason instead, and no successor starts."""
    return Transition(
        RunStatus.FAILED, error=message, error_code=code, release_locks_of=workflow_id
    )


def move_refusal_by_status(status: str) -> str | None:
    """Why an operator may not move a run in ``status`` to another version (None: they
    may). A waiting, paused or dead-lettered run can move (the last is how a fixed version
    takes over a run that failed with non-determinism); a running one is mid-segment on its
    code; a finished one has nothing left to run."""
    if status == RunStatus.RUNNING:
        return "running; pause it or wait until its segment ends"
    if status in TERMINAL_STATUSES and status != RunStatus.DEAD_LETTERED:
        return f"already {status}"
    return None


def close_refusal(action: str, status: str) -> str | None:
    """Why ``action`` (terminate, force_complete, force_fail, cancel) cannot apply to a run
    in ``status``; None when it can. A done run can be neither reopened nor re-closed; a
    failed one can still be force-completed (an operator's answer for it)."""
    if action == "force_complete":
        return "already done" if status == RunStatus.DONE else None
    if status in TERMINAL_STATUSES:
        return f"already {status}"
    return None


# --- children, retried calls, reports ----------------------------------------------------------


@dataclass(frozen=True)
class ChildClose:
    action: str  # "terminate" or "request_cancel"
    reason: str


def child_close(parent_close_policy: str, parent_run_id: str) -> ChildClose | None:
    """What an open child gets when its parent's run ends (None: ``abandon``, it goes on)."""
    reason = f"parent {parent_run_id} closed"
    if parent_close_policy == "terminate":
        return ChildClose("terminate", reason)
    if parent_close_policy == "request_cancel":
        return ChildClose("request_cancel", reason)
    return None


# Steps a retry makes again rather than replays: an external call whose failure may not repeat.
RETRIED_CALLS = frozenset(
    {EventType.CALL, EventType.HEARTBEAT, EventType.FETCH, EventType.PLUGIN_CALL}
)
RETRIED_CALL_CODES = frozenset(t.code for t in RETRIED_CALLS)
_RETRIED_STATUSES = (
    AbiStatus.ERROR,
    AbiStatus.TIMEOUT,
    AbiStatus.AMBIGUOUS,
    AbiStatus.RETRIES_EXHAUSTED,
)


def is_forgettable_failed_call(event: Event) -> bool:
    """A last event that a retry forgets: an external call that failed retryably (replay is
    deterministic, so a retry that replayed the recorded failure would fail the same way
    forever). Streaming calls are kept (their chunks were delivered)."""
    if event.TYPE not in RETRIED_CALLS:
        return False
    if getattr(event, "streaming", False):
        return False
    return getattr(event, "status", AbiStatus.OK) in _RETRIED_STATUSES


# The history's lock steps: a reopened run re-takes what its history says it holds.
LOCK_CODES = frozenset({EventType.ACQUIRE_LOCK.code, EventType.RELEASE_LOCK.code})


@dataclass(frozen=True)
class HeldLock:
    key: str
    expires_ms: int | None  # None: held until released


def locks_held(events: Iterable[Event], now_ms: int) -> list[HeldLock]:
    """The locks a history says its run holds at ``now_ms``: acquired and not released since,
    and not past their TTL. A run's end releases its locks; an operator's retry re-takes these
    before the run replays, since replay answers ``acquire_lock`` from the history without
    asking the lock table again. In the order last acquired."""
    held: dict[str, HeldLock] = {}
    for event in events:
        if isinstance(event, AcquireLockEvent) and event.acquired:
            ttl = event.ttl_ms
            held[event.key] = HeldLock(event.key, event.ts + ttl if ttl else None)
        elif isinstance(event, ReleaseLockEvent):
            held.pop(event.key, None)
    return [h for h in held.values() if h.expires_ms is None or h.expires_ms > now_ms]


# How an operator's retry treats the run's last step (``retry_plan``).
RETRY_REPLAY = "replay"
RETRY_REEXECUTE_LAST_CALL = "reexecute_last_call"
RETRY_MODES = (RETRY_REPLAY, RETRY_REEXECUTE_LAST_CALL)


@dataclass(frozen=True)
class RetryPlan:
    """What an operator's retry of a failed or dead-lettered run will do."""

    mode: str
    forgets_step: int | None  # the last step, removed so it is executed again; None: replay all
    effect: str  # for the operator: what the worker will do with the run


def retry_plan(last: Event | None, mode: str = RETRY_REPLAY) -> RetryPlan:
    """The one rule for an operator's retry, given the run's last recorded event.

    ``replay`` (the default) forgets the last step only when it is an external call that
    failed retryably (:func:`is_forgettable_failed_call`); anything else is replayed as
    recorded, so a run that failed on a recorded answer fails the same way again unless its
    code changed. ``reexecute_last_call`` also forgets a last external call that failed in
    any other way (permanent, not found, denied: a service configured wrongly, since fixed),
    so the worker makes that call again."""
    if mode not in RETRY_MODES:
        raise ValueError(f"retry mode must be one of {', '.join(RETRY_MODES)}, not {mode!r}")
    if last is not None and last.TYPE in RETRIED_CALLS and not getattr(last, "streaming", False):
        failed = getattr(last, "status", AbiStatus.OK) != AbiStatus.OK
        if is_forgettable_failed_call(last) or (mode == RETRY_REEXECUTE_LAST_CALL and failed):
            return RetryPlan(
                mode,
                last.step,
                f"re-executes step {last.step}, {last.describe()}, which failed; the steps "
                "before it are replayed from the history",
            )
        if failed:
            return RetryPlan(
                mode,
                None,
                f"replays the history, including the recorded failure of step {last.step} "
                f"({last.describe()}): the run will fail the same way unless its code changed "
                f"(retry with mode {RETRY_REEXECUTE_LAST_CALL!r} to make that call again)",
            )
    return RetryPlan(
        mode, None, "replays the history as recorded and carries on from where it stopped"
    )


def outcome_kind(outcome: Outcome) -> tuple[str, str]:
    """The worker's one-word report of a segment's outcome and its detail."""
    if isinstance(outcome, Completed):
        return "completed", ""
    if isinstance(outcome, Failed):
        return "failed", f"{outcome.code.value}: {outcome.message[:200]}"
    if isinstance(outcome, Suspended):
        return "suspended", outcome.wait.describe()
    if isinstance(outcome, ContinuedAsNew):
        return "continued", ""
    raise TypeError(f"unrecognised segment outcome {outcome!r}")
