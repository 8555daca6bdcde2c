"""What a segment ends with: the outcomes a segment reports (``Completed``, ``Failed``,
``Suspended`` with its ``WaitCondition``, ``ContinuedAsNew``), the ``SegmentResult`` that
carries one to the finalize, and the exceptions a host function raises out of the guest to
end the segment (``Suspend``, ``ContinueAsNew``).

Plain values: the session makes them, the backends and the trap classification return them,
and storage (``engine.inmemory``, the Django store) applies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from engine.errors import RETRYABLE_CODES, ErrorCode, WorkflowExit
from engine.events import Event


class WaitKind(StrEnum):
    TIMER = "timer"
    RETRY_BACKOFF = "retry_backoff"
    SIGNALS = "signals"
    SIGNAL_REPLY = "signal_reply"
    CHILD = "child"
    CHILDREN = "children"
    ANY_CHILD = "any_child"
    PROMISE = "promise"
    TASK = "task"  # a durable call running as a task elsewhere (a Celery task)


def _clock_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class WaitCondition:
    """What a suspended run waits for. ``wake_at_ms`` makes it due regardless (timers and
    timeouts); signals, children, promises and updates wake it earlier."""

    kind: WaitKind
    wake_at_ms: int | None = None
    signals: tuple[str, ...] = ()
    run_ids: tuple[str, ...] = ()
    promise_id: str = ""
    # TASK: the call it waits on, and the task's id in the system running it.
    service: str = ""
    operation: str = ""
    task_id: str = ""

    def describe(self) -> str:
        until = f" until {_clock_text(self.wake_at_ms)}" if self.wake_at_ms is not None else ""
        timeout = f" (timeout {_clock_text(self.wake_at_ms)})" if self.wake_at_ms else ""
        match self.kind:
            case WaitKind.TIMER:
                return f"timer{until}"
            case WaitKind.RETRY_BACKOFF:
                return f"retry backoff{until}"
            case WaitKind.SIGNALS:
                return f"signals {'/'.join(self.signals)}{timeout}"
            case WaitKind.SIGNAL_REPLY:
                return f"reply to a signal{timeout}"
            case WaitKind.CHILD:
                return f"child {self.run_ids[0][:8]}…"
            case WaitKind.CHILDREN:
                return f"all of {len(self.run_ids)} children"
            case WaitKind.ANY_CHILD:
                return f"any of {len(self.run_ids)} children"
            case WaitKind.PROMISE:
                return f"promise {self.promise_id[:8]}…{timeout}"
            case WaitKind.TASK:
                return f"task {self.service}.{self.operation} (task id {self.task_id}){timeout}"
        raise RuntimeError(f"unrecognised wait kind {self.kind!r}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "wake_at_ms": self.wake_at_ms,
            "signals": list(self.signals),
            "run_ids": list(self.run_ids),
            "promise_id": self.promise_id,
            **(
                {"service": self.service, "operation": self.operation, "task_id": self.task_id}
                if self.kind is WaitKind.TASK
                else {}
            ),
            "description": self.describe(),
        }


# --- Outcomes -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completed:
    result: str


@dataclass(frozen=True, slots=True)
class Failed:
    code: ErrorCode
    message: str
    retryable: bool = False


@dataclass(frozen=True, slots=True)
class Suspended:
    wait: WaitCondition


@dataclass(frozen=True, slots=True)
class ContinuedAsNew:
    input: str
    version: int  # 0: the same version


Outcome = Completed | Failed | Suspended | ContinuedAsNew


def failed(code: ErrorCode, message: str) -> Failed:
    return Failed(code, message, code in RETRYABLE_CODES)


@dataclass(frozen=True, slots=True)
class AppliedUpdate:
    update_id: str
    status: int
    payload: str


@dataclass(frozen=True)
class SegmentResult:
    outcome: Outcome
    # Recorded in this segment and not yet in storage: the finalize writes them.
    new_events: tuple[Event, ...]
    # Every event recorded in this segment (persisted already or not).
    recorded: tuple[Event, ...]
    query_state: dict[str, str]
    replayed_steps: int
    next_step: int
    applied_updates: tuple[AppliedUpdate, ...] = ()
    consumed_signals: tuple[str, ...] = ()
    elapsed_s: float = 0.0


# --- Segment-ending exceptions raised out of host functions ----------------------------------


class Suspend(WorkflowExit):
    def __init__(self, wait: WaitCondition) -> None:
        super().__init__(f"suspended: {wait.describe()}")
        self.wait = wait


class ContinueAsNew(WorkflowExit):
    def __init__(self, new_input: str, version: int) -> None:
        super().__init__("continue as new")
        self.new_input = new_input
        self.version = version
