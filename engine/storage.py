"""What an execution needs from storage: narrow protocols, and the values they exchange.

The engine never touches a database. A segment talks to one :class:`WorkflowStorage`, which
``engine.inmemory`` implements in memory (tests, the authoring helper) and
``workflows.store`` implements on the Django ORM.

Two rules every implementation keeps:

* **Fencing.** Every write names the run's ``RunRef`` (worker and generation). When the
  claim it was made under is no longer current, the write touches nothing and raises
  :class:`~engine.errors.FenceLost`.
* **Prefix.** Events are appended in step order, so the stored history is always a prefix
  of what the guest did. ``apply`` performs a state change in storage *and* appends the
  events leading up to it plus the event recording it, in one transaction: either the
  effect and its record both exist, or neither does, and replay redoes it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.events import Event
from engine.status import TERMINAL_STATUSES, AbiStatus, RunStatus


@dataclass(frozen=True, slots=True)
class RunRef:
    """Identity of the run a segment executes, and the claim it executes under."""

    tenant_id: str
    workflow_id: str  # stable across continue-as-new
    run_id: str  # this run
    worker_id: str = ""
    generation: int = 0


@dataclass(frozen=True, slots=True)
class SignalMessage:
    signal_id: str
    name: str
    payload: str
    correlation_id: str = ""


@dataclass(frozen=True, slots=True)
class ChildOutcome:
    """A finished child: ``status`` is an ABI status (OK, ERROR, PERMANENT, CANCELLED, ...)."""

    status: int
    result: str = ""
    error: str = ""


# How a failed child's error code is reported to the parent awaiting it (as a status).
_CHILD_STATUS_BY_CODE = {
    "permanent": AbiStatus.PERMANENT,
    "cancelled": AbiStatus.CANCELLED,
    "timeout": AbiStatus.TIMEOUT,
    "retries_exhausted": AbiStatus.RETRIES_EXHAUSTED,
    "ambiguous": AbiStatus.AMBIGUOUS,
    "denied": AbiStatus.DENIED,
    "not_found": AbiStatus.NOT_FOUND,
}


def child_status(error_code: str | None) -> AbiStatus:
    """The status ``await_child`` reports for a child that failed with ``error_code``."""
    return _CHILD_STATUS_BY_CODE.get(error_code or "", AbiStatus.ERROR)


def child_outcome(
    status: str, result: str | None, error: str | None, error_code: str | None
) -> ChildOutcome | None:
    """What a parent awaiting a child is told about the run that ended its chain (the child,
    or the last run it continued as), by that run's status and columns: None while it has
    not ended. Every store reads the columns and calls this."""
    if status == RunStatus.DONE:
        return ChildOutcome(AbiStatus.OK, result=result or "")
    if status == RunStatus.TERMINATED:
        return ChildOutcome(AbiStatus.CANCELLED, error=error or "terminated")
    if status in TERMINAL_STATUSES:
        return ChildOutcome(child_status(error_code), error=error or "")
    return None


@dataclass(frozen=True, slots=True)
class PromiseState:
    status: str  # "pending", "resolved", "rejected"
    value: str = ""
    error: str = ""


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    update_id: str
    name: str
    payload: str


@dataclass(frozen=True, slots=True)
class Interrupts:
    """What a fresh blocking call looks at first, read together (``WorkflowStorage.interrupts``):
    the cancellation request's reason (None: none) and the updates waiting for the run."""

    cancellation: str | None
    updates: list[UpdateRequest]


# --- Mutations: state changes ``apply`` performs atomically with their events -----------


@dataclass(frozen=True, slots=True)
class SetState:
    scope: str
    key: str
    value: str


@dataclass(frozen=True, slots=True)
class DeleteState:
    scope: str
    key: str


@dataclass(frozen=True, slots=True)
class IncrState:
    scope: str
    key: str
    delta: int


@dataclass(frozen=True, slots=True)
class AcquireLock:
    key: str
    holder: str
    ttl_ms: int
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReleaseLock:
    key: str
    holder: str


@dataclass(frozen=True, slots=True)
class StartChild:
    run_id: str  # chosen by the engine, deterministic for (workflow, run, step)
    name: str
    input: str
    version: int  # <= 0: default resolution (parent's version, else latest compatible)
    priority: int
    parent_close_policy: str
    parent_version: int
    # The child's trace context (engine.tracing): the child-start span; "" with tracing off.
    traceparent: str = ""


@dataclass(frozen=True, slots=True)
class StartDetached:
    run_id: str
    name: str
    input: str


@dataclass(frozen=True, slots=True)
class SendSignal:
    target_id: str
    name: str
    payload: str
    correlation_id: str = ""


@dataclass(frozen=True, slots=True)
class CreatePromise:
    promise_id: str
    name: str


@dataclass(frozen=True, slots=True)
class SettlePromise:
    promise_id: str
    value: str = ""
    error: str = ""
    rejected: bool = False


@dataclass(frozen=True, slots=True)
class CreateSchedule:
    schedule_id: str
    workflow_name: str
    cron: str
    timezone: str
    input: str


@dataclass(frozen=True, slots=True)
class DeleteSchedule:
    schedule_id: str


@dataclass(frozen=True, slots=True)
class EnqueueInvocation:
    """A call made by the host on the workflow's behalf later (``durable_send``,
    ``durable_schedule_invoke``), delivered at least once even if the workflow has ended."""

    invocation_id: str
    service: str
    operation: str
    request: str
    idempotency_key: str
    deliver_at_ms: int


@dataclass(frozen=True, slots=True)
class DispatchTask:
    """A durable call sent as a task (``engine.services.TaskService``): the record the
    task's outcome is written to, created with the call's write-ahead event. A call made
    again at the same step (a retry that forgot its failure) replaces the record."""

    step: int
    task_id: str
    token: str
    service: str
    operation: str
    idempotency_key: str
    deadline_ms: int | None


@dataclass(frozen=True, slots=True)
class TaskCallRecord:
    """The record of a task call, as the session reads it when it replays the call."""

    task_id: str
    token: str
    sent: bool
    deadline_ms: int | None
    # The outcome the task's worker reported (an ABI status and its payload), or None.
    status: int | None = None
    payload: str = ""


Mutation = (
    SetState
    | DeleteState
    | IncrState
    | AcquireLock
    | ReleaseLock
    | StartChild
    | StartDetached
    | SendSignal
    | CreatePromise
    | SettlePromise
    | CreateSchedule
    | DeleteSchedule
    | EnqueueInvocation
    | DispatchTask
)


class WorkflowStorage(Protocol):
    """Everything one execution segment reads and writes."""

    # History -----------------------------------------------------------------------------
    def append_events(self, run: RunRef, events: Sequence[Event]) -> None:
        """Append events (in step order) now; fenced."""

    def complete_intent(self, run: RunRef, event: Event) -> None:
        """Write the outcome of a write-ahead intent recorded at ``event.step``; fenced."""

    # State changes, atomic with the events that lead up to and record them ------------------
    def apply(
        self,
        run: RunRef,
        mutation: Mutation,
        pending: Sequence[Event],
        record: Callable[[Any], Event],
    ) -> Any:
        """Perform ``mutation``; append ``pending`` and ``record(result)``; return ``result``.

        Results: SetState/ReleaseLock/CreatePromise/SendSignal/EnqueueInvocation -> None;
        DeleteState -> bool (existed); IncrState -> int; AcquireLock -> bool; StartChild,
        StartDetached -> run id; SettlePromise -> None; CreateSchedule -> schedule id;
        DeleteSchedule -> None; DispatchTask -> None. Raises :class:`~engine.errors.Refused`
        for a refusal the workflow is told about (nothing is written then).
        """

    # Reads --------------------------------------------------------------------------------
    def next_signal(
        self, run: RunRef, names: Sequence[str], exclude: Collection[str]
    ) -> SignalMessage | None:
        """The oldest undelivered signal with one of ``names``, skipping ids in ``exclude``."""

    def cancellation(self, run: RunRef) -> str | None:
        """The reason, if cancellation of this run was requested."""

    def child_outcomes(
        self, run: RunRef, child_run_ids: Sequence[str]
    ) -> list[ChildOutcome | None]:
        """The outcome of each finished child (or detached run), in order; None for one that
        has not ended. A run that continued as new answers for the last run of its chain; an
        unknown id answers NOT_FOUND. One read for all of them (an await of several
        children asks them together)."""

    def promise_state(self, run: RunRef, promise_id: str) -> PromiseState | None:
        """None for an unknown promise."""

    def get_state(self, run: RunRef, scope: str, key: str) -> str | None: ...

    def list_state(self, run: RunRef, scope: str, prefix: str) -> list[str]:
        """Keys with ``prefix``, sorted."""

    def list_schedules(self, run: RunRef) -> list[dict[str, Any]]: ...

    def pending_updates(self, run: RunRef, exclude: Collection[str]) -> list[UpdateRequest]: ...

    def interrupts(self, run: RunRef, exclude: Collection[str]) -> Interrupts:
        """``cancellation(run)`` and ``pending_updates(run, exclude)`` in one read (a fresh
        blocking call asks both: one round trip where the store can)."""

    # Task calls (``DispatchTask``) ----------------------------------------------------------
    def task_call(self, run: RunRef, step: int) -> TaskCallRecord | None:
        """The task call made at ``step`` of this run, None when there is none."""

    def task_sent(self, run: RunRef, step: int) -> None:
        """Note that the task of the call at ``step`` was published."""

    def settle_task_call(self, run: RunRef, event: Event) -> None:
        """Write the call's outcome over its write-ahead intent (``complete_intent``) and
        close its record, so an outcome reported later is dropped as stale; fenced."""

    # Lease ----------------------------------------------------------------------------------
    def heartbeat(self, run: RunRef) -> bool:
        """Keep the claim alive during a long call; False when the claim is lost."""
