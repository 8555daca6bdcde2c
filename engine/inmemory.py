"""In-memory implementation of every storage protocol, with the lifecycle a worker applies.

Used by the engine's tests and by :mod:`engine.testing`, the helper workflow authors run
their unit tests with. It keeps the same rules as the database store: fenced writes,
histories that are always a prefix, effects atomic with their events, signals and updates
consumed only when the segment that used them is finalized.
"""

from __future__ import annotations

import itertools
import json
import secrets
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

from engine import compaction, lifecycle
from engine.cron import cron_error, timezone_error
from engine.errors import Denied, FenceLost, Refused, StorageError
from engine.events import AdminActionEvent, EncodedEvent, Event, decode, encode
from engine.policies import (
    Quota,
    Quotas,
    external_signal_refusal,
    guest_signal_refusal,
    quota_refusal,
)
from engine.session import SegmentResult, Suspended
from engine.status import TERMINAL_STATUSES, AbiStatus, RunStatus
from engine.storage import (
    AcquireLock,
    ChildOutcome,
    CreatePromise,
    CreateSchedule,
    DeleteSchedule,
    DeleteState,
    DispatchTask,
    EnqueueInvocation,
    IncrState,
    Interrupts,
    Mutation,
    PromiseState,
    ReleaseLock,
    RunRef,
    SendSignal,
    SetState,
    SettlePromise,
    SignalMessage,
    StartChild,
    StartDetached,
    TaskCallRecord,
    UpdateRequest,
    child_outcome,
)
from engine.task_calls import Disposition, TaskCallState, disposition
from engine.versions import (
    STABLE_TAG,
    DeployedVersion,
    NoSuchVersion,
    choose_version,
    move_refusal,
    resolve_child_version,
)

DEFAULT_POLICY = lifecycle.RunPolicy()


class History:
    """A run's history in memory, stored as the database store stores it: a compaction
    checkpoint (:mod:`engine.compaction`: the folded prefix) and the events after it, read as
    one list of encoded events. :meth:`fold` applies the same rule as the database finalize."""

    def __init__(self) -> None:
        self.checkpoint: compaction.CompactionState | None = None
        self.tail: list[EncodedEvent] = []
        self.compacted = 0

    def __len__(self) -> int:
        return self.compacted + len(self.tail)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[EncodedEvent]:
        return iter(compaction.with_tail(self.checkpoint, self.tail))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, History | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"History({self.compacted} compacted, {len(self.tail)} after)"

    @overload
    def __getitem__(self, index: int) -> EncodedEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[EncodedEvent]: ...

    def __getitem__(self, index: int | slice) -> EncodedEvent | list[EncodedEvent]:
        if isinstance(index, slice):
            return list(self)[index]
        position = index + len(self) if index < 0 else index
        if position < 0 or position >= len(self):
            raise IndexError(index)
        if position >= self.compacted:
            return self.tail[position - self.compacted]
        return compaction.expand(self.checkpoint)[position]

    def __setitem__(self, index: int, event: EncodedEvent) -> None:
        if index < self.compacted:  # folds never take a write-ahead intent, the only rewrite
            raise StorageError(f"step {index} is in the compaction checkpoint")
        self.tail[index - self.compacted] = event

    def append(self, event: EncodedEvent) -> None:
        self.tail.append(event)

    def pop(self) -> EncodedEvent:
        return self.tail.pop()  # the last step: a fold always leaves at least one as a row

    def fold(self, threshold: int) -> int:
        """Fold what :func:`engine.compaction.fold_count` says into the checkpoint."""
        n = compaction.fold_count(self.tail, threshold)
        if n:
            self.checkpoint = compaction.fold(self.checkpoint, self.tail[:n])
            self.tail = self.tail[n:]
            self.compacted += n
        return n


@dataclass
class RunRecord:
    run_id: str
    workflow_id: str
    definition: str
    version: int
    input: str
    created_ms: int
    tenant_id: str = "default"
    entry_point: str = "run"
    status: RunStatus = RunStatus.READY
    result: str | None = None
    error: str | None = None
    error_code: str | None = None
    history: History = field(default_factory=History)
    generation: int = 0
    worker_id: str = ""
    due_ms: int | None = 0  # None: waits to be woken (signal, child, promise, update)
    waiting_on: dict[str, Any] | None = None
    parent_run_id: str | None = None
    # Started by run_detached: the run that started it, which its end wakes.
    detached_from: str | None = None
    parent_close_policy: str = "terminate"
    cancel_reason: str | None = None
    query_state: dict[str, str] = field(default_factory=dict)
    continued_as: str | None = None
    priority: int = 0
    segments: int = 0
    attempt: int = 1


@dataclass
class StoredSignal:
    signal_id: str
    run_id: str
    name: str
    payload: str
    correlation_id: str = ""
    consumed: bool = False


@dataclass
class StoredUpdate:
    update_id: str
    run_id: str
    name: str
    payload: str
    status: str = "pending"  # pending, done, failed
    result: str = ""


class InMemoryStorage:
    """Thread-safe in-memory storage for any number of runs of one tenant."""

    def __init__(self, clock: Callable[[], int], tenant_id: str = "default") -> None:
        self.clock = clock
        self.tenant_id = tenant_id
        # CLEAT_COMPACT_AFTER_EVENTS's twin: a run that goes on with this many events as rows
        # has its prefix folded into its checkpoint (engine.compaction); 0: never.
        self.compact_after_events = 0
        self._lock = threading.RLock()
        self.runs: dict[str, RunRecord] = {}
        self.signals: list[StoredSignal] = []
        self.promises: dict[str, dict[str, str]] = {}
        self.state: dict[tuple[str, str], str] = {}
        self.locks: dict[str, tuple[str, int | None]] = {}
        self.schedules: dict[str, dict[str, Any]] = {}
        self.invocations: list[EnqueueInvocation] = []
        # (run id, step) -> a task call's record (engine.task_calls)
        self.task_calls: dict[tuple[str, int], dict[str, Any]] = {}
        self.updates: dict[str, StoredUpdate] = {}
        # name -> {version: deprecated}; filled by whoever deploys definitions.
        self.definitions: dict[str, dict[int, bool]] = {}
        # (name, version) -> the definition's policies (retry); the defaults otherwise.
        self.policies: dict[tuple[str, int], lifecycle.RunPolicy] = {}
        # (name, version) -> what deploy declared (min_version, exports, child binding), for
        # the rules of engine.versions; a version without an entry declares nothing.
        self.declared: dict[tuple[str, int], DeployedVersion] = {}
        # (name, tag) -> version ("stable", "canary")
        self.tags: dict[tuple[str, str], int] = {}
        # Policies (engine/policies.py), as CLEAT_REQUIRE_SIGNAL_AUTH and CLEAT_MAX_* set them.
        self.require_signal_auth = False
        # What a policy refused, as the database store's audit rows: action, run, reason.
        self.audit: list[dict[str, Any]] = []
        # 0: unlimited; the schedules default is CLEAT_MAX_SCHEDULES_PER_TENANT's.
        self.quotas = Quotas(schedules=100)
        self._ids = itertools.count(1)

    # --- run lifecycle (the worker's side) ---

    def create_run(
        self,
        definition: str,
        version: int,
        input: str,
        *,
        run_id: str | None = None,
        workflow_id: str | None = None,
        parent_run_id: str | None = None,
        parent_close_policy: str = "terminate",
        priority: int = 0,
        detached_from: str | None = None,
    ) -> RunRecord:
        with self._lock:
            rid = run_id or str(uuid.uuid4())
            record = RunRecord(
                run_id=rid,
                workflow_id=workflow_id or rid,
                definition=definition,
                version=version,
                input=input,
                created_ms=self.clock(),
                parent_run_id=parent_run_id,
                detached_from=detached_from,
                parent_close_policy=parent_close_policy,
                priority=priority,
                tenant_id=self.tenant_id,
            )
            self.runs[rid] = record
            return record

    def claim(self, worker_id: str, now_ms: int) -> RunRecord | None:
        """Claim the most urgent due run: priority, then age. Bumps the generation."""
        with self._lock:
            due = [
                r
                for r in self.runs.values()
                if r.status == RunStatus.READY and r.due_ms is not None and r.due_ms <= now_ms
            ]
            if not due:
                return None
            run = min(due, key=lambda r: (-r.priority, r.due_ms or 0, r.created_ms))
            run.status = RunStatus.RUNNING
            run.worker_id = worker_id
            run.generation += 1
            run.segments += 1
            return run

    def ref(self, run: RunRecord) -> RunRef:
        return RunRef(self.tenant_id, run.workflow_id, run.run_id, run.worker_id, run.generation)

    def _fenced(self, ref: RunRef) -> RunRecord:
        run = self.runs.get(ref.run_id)
        if run is None:
            raise StorageError(f"no run {ref.run_id}")
        if (
            run.generation != ref.generation
            or run.worker_id != ref.worker_id
            or run.status != RunStatus.RUNNING
        ):
            raise FenceLost(
                f"run {ref.run_id} is no longer owned by {ref.worker_id}@{ref.generation}"
            )
        return run

    def _wake(self, run_id: str | None) -> None:
        run = self.runs.get(run_id or "")
        if run is not None and run.status == RunStatus.READY:
            run.due_ms = min(run.due_ms, self.clock()) if run.due_ms is not None else self.clock()

    def finalize(self, ref: RunRef, result: SegmentResult) -> str | None:
        """Apply a segment's outcome in one step (fenced), as :mod:`engine.lifecycle` rules.
        Returns a new run id for continue-as-new."""
        with self._lock:
            run = self._fenced(ref)
            self._append(run, result.new_events)
            run.query_state = dict(result.query_state)
            for signal in self.signals:
                if signal.signal_id in result.consumed_signals:
                    signal.consumed = True
            for applied in result.applied_updates:
                update = self.updates.get(applied.update_id)
                if update is not None and update.status == "pending":
                    update.status = "done" if applied.status == AbiStatus.OK else "failed"
                    update.result = applied.payload
            run.worker_id = ""
            outcome = result.outcome
            arrived = isinstance(outcome, Suspended) and self._has_wakeup(
                run, outcome.wait.as_dict()
            )
            state = lifecycle.RunState(run.workflow_id, run.version, run.attempt, arrived)
            policy = self.policies.get((run.definition, run.version), DEFAULT_POLICY)
            transition = lifecycle.after_segment(outcome, state, policy, self.clock())
            successor = self._apply(run, transition)
            if not transition.ended:  # as the database finalize: only a run that goes on
                run.history.fold(self.compact_after_events)
            return successor

    def _apply(self, run: RunRecord, transition: lifecycle.Transition) -> str | None:
        """Apply a transition of :mod:`engine.lifecycle` to ``run``; returns the successor's
        run id, if it made one."""
        if transition.successor is not None and transition.successor.version != run.version:
            target = transition.successor.version
            refusal = move_refusal(
                run.definition,
                self.deployed(run.definition, run.version) or DeployedVersion(run.version),
                self.deployed(run.definition, target),
                target,
                entry_point=run.entry_point,
            )
            if refusal is not None:
                code, message = refusal
                transition = lifecycle.successor_refused(run.workflow_id, code.value, message)
        run.status = transition.status
        if transition.attempt is not None:
            run.attempt = transition.attempt
        run.waiting_on = transition.waiting_on
        run.due_ms = transition.wake_at_ms if transition.status == RunStatus.READY else None
        run.result = transition.result
        run.error, run.error_code = transition.error, transition.error_code
        if transition.forget_failed_call:
            self._forget_failed_call(run)
        successor: str | None = None
        if transition.successor is not None:
            successor = self.create_run(
                run.definition,
                transition.successor.version,
                transition.successor.input,
                workflow_id=run.workflow_id,
                parent_run_id=run.parent_run_id,
                parent_close_policy=run.parent_close_policy,
                priority=run.priority,
                detached_from=run.detached_from,
            ).run_id
            run.continued_as = successor
            # Signals that reached this run unconsumed belong to the chain: move them on.
            for signal in self.signals:
                if signal.run_id == run.run_id and not signal.consumed:
                    signal.run_id = successor
        if transition.release_locks_of is not None:
            holder = transition.release_locks_of
            for key in [k for k, (held_by, _) in self.locks.items() if held_by == holder]:
                del self.locks[key]
        if transition.ended:
            for (owner, _), call in self.task_calls.items():
                if owner == run.run_id and call["state"] == TaskCallState.PENDING:
                    call["state"] = TaskCallState.ABANDONED
            self._close_children(run)
            self._wake(run.parent_run_id or run.detached_from)  # either may await it
            for update in self.updates.values():
                if update.run_id == run.run_id and update.status == "pending":
                    update.status, update.result = "failed", transition.updates_failure
        return successor

    def _forget_failed_call(self, run: RunRecord) -> None:
        if run.history and lifecycle.is_forgettable_failed_call(decode(run.history[-1])):
            run.history.pop()

    def _has_wakeup(self, run: RunRecord, wait: dict[str, Any]) -> bool:
        """Something that arrived while the segment ran and may satisfy its wait."""
        names = set(wait.get("signals", ()))
        if any(s.run_id == run.run_id and not s.consumed and s.name in names for s in self.signals):
            return True
        if any(u.run_id == run.run_id and u.status == "pending" for u in self.updates.values()):
            return True
        if run.cancel_reason is not None:
            return True
        for rid in wait.get("run_ids", ()):
            child = self.runs.get(rid)
            if child is None or self.chain_end(child).status in TERMINAL_STATUSES:
                return True
        task_id = wait.get("task_id")
        if task_id and any(
            c["task_id"] == task_id and c["state"] == TaskCallState.REPORTED
            for c in self.task_calls.values()
        ):
            return True
        promise = self.promises.get(wait.get("promise_id") or "")
        return bool(promise and promise["status"] != "pending")

    def _close_children(self, parent: RunRecord) -> None:
        for child in list(self.runs.values()):
            if child.parent_run_id != parent.run_id or child.status in TERMINAL_STATUSES:
                continue
            close = lifecycle.child_close(child.parent_close_policy, parent.run_id)
            if close is None:
                continue
            if close.action == "terminate":
                self.terminate(child.run_id, close.reason)
            else:
                self.cancel(child.run_id, close.reason)

    def release(self, ref: RunRef) -> None:
        """Give a claimed run back untouched (the segment failed for a host reason)."""
        with self._lock:
            run = self._fenced(ref)
            run.status, run.worker_id, run.due_ms = RunStatus.READY, "", self.clock()

    def _close(
        self,
        run_id: str,
        action: str,
        transition: lifecycle.Transition,
        operator: str | None,
        reason: str,
    ) -> None:
        """Close a run from outside its segment, whoever holds it: the generation bump
        fences out its worker. An operator's close is kept in the history (an
        ``admin_action`` annotation, as the database store's audit writes it)."""
        run = self._run(run_id)
        refusal = lifecycle.close_refusal(action, run.status)
        if refusal is not None:
            raise Refused(AbiStatus.PERMANENT, f"run {run_id} is {refusal}")
        if operator is not None:
            step = len(run.history)
            self._append(
                run,
                [
                    AdminActionEvent(
                        step=step, ts=self.clock(), action=action, operator=operator, reason=reason
                    )
                ],
            )
        run.generation += 1
        run.worker_id = ""
        self._apply(run, transition)

    def _run(self, run_id: str) -> RunRecord:
        run = self.runs.get(run_id)
        if run is None:
            raise Refused(AbiStatus.NOT_FOUND, f"no run {run_id}")
        return run

    def terminate(self, run_id: str, reason: str, *, operator: str | None = None) -> None:
        """Terminate a run: by an operator (``operator``), or as its parent's close policy
        (a child already ended is left alone)."""
        with self._lock:
            run = self._run(run_id)
            if operator is None and run.status in TERMINAL_STATUSES:
                return
            transition = lifecycle.terminate(run.workflow_id, reason)
            self._close(run_id, "terminate", transition, operator, reason)

    def force_complete(
        self, run_id: str, result: str, *, operator: str = "operator", reason: str = ""
    ) -> None:
        with self._lock:
            transition = lifecycle.force_complete(self._run(run_id).workflow_id, result)
            self._close(run_id, "force_complete", transition, operator, reason)

    def force_fail(
        self,
        run_id: str,
        message: str,
        code: str = "error",
        *,
        operator: str = "operator",
        reason: str = "",
    ) -> None:
        with self._lock:
            transition = lifecycle.force_fail(self._run(run_id).workflow_id, message, code)
            self._close(run_id, "force_fail", transition, operator, reason)

    def move_to_version(
        self, run_id: str, version: int, *, operator: str = "operator", reason: str = ""
    ) -> None:
        """An operator's move of a run to another deployed version of its definition: its
        history replays on that version's code from the next segment on. Refused (Refused,
        nothing changed) for a run that is running or finished, a version that is not
        deployed, or one :func:`engine.versions.move_refusal` finds incompatible."""
        with self._lock:
            run = self._run(run_id)
            refused = lifecycle.move_refusal_by_status(run.status)
            if refused is not None:
                raise Refused(AbiStatus.PERMANENT, f"run {run_id} is {refused}")
            refusal = move_refusal(
                run.definition,
                self.deployed(run.definition, run.version) or DeployedVersion(run.version),
                self.deployed(run.definition, version),
                version,
                entry_point=run.entry_point,
            )
            if refusal is not None:
                code, message = refusal
                status = AbiStatus.NOT_FOUND if code == "not_found" else AbiStatus.PERMANENT
                raise Refused(status, message)
            self._append(
                run,
                [
                    AdminActionEvent(
                        step=len(run.history),
                        ts=self.clock(),
                        action="move_to_version",
                        operator=operator,
                        reason=reason,
                    )
                ],
            )
            run.version = version

    def cancel(self, run_id: str, reason: str) -> None:
        with self._lock:
            run = self.runs[run_id]
            if run.status not in TERMINAL_STATUSES:
                run.cancel_reason = reason
                self._wake(run_id)

    def deliver_signal(
        self, target_id: str, name: str, payload: str, correlation_id: str = ""
    ) -> str:
        with self._lock:
            run = self._target(target_id)
            if run is None:
                raise Refused(AbiStatus.NOT_FOUND, f"no running workflow {target_id}")
            signal = StoredSignal(
                f"sig-{next(self._ids)}", run.run_id, name, payload, correlation_id
            )
            self.signals.append(signal)
            self._wake(run.run_id)
            return signal.signal_id

    def deliver_external_signal(
        self, target_id: str, name: str, payload: str, *, permitted: bool, caller: str = "test"
    ) -> str:
        """A signal from outside the workflows (an API client, an operator), held to signal
        authorization's permission (:func:`engine.policies.external_signal_refusal`)."""
        with self._lock:
            refusal = external_signal_refusal(
                require_auth=self.require_signal_auth, permitted=permitted, who=caller
            )
            if refusal is not None:
                self.audit.append(
                    {
                        "action": "signal_denied",
                        "run_id": target_id,
                        "reason": refusal,
                        "signal": name,
                    }
                )
                raise Refused(AbiStatus.DENIED, refusal)
            return self.deliver_signal(target_id, name, payload)

    def _target(self, target_id: str) -> RunRecord | None:
        run = self.runs.get(target_id)
        if run is None:
            candidates = [r for r in self.runs.values() if r.workflow_id == target_id]
            run = max(candidates, key=lambda r: r.created_ms, default=None)
        if run is None or run.status in TERMINAL_STATUSES:
            return None
        return run

    def request_update(self, run_id: str, name: str, payload: str) -> str:
        with self._lock:
            update = StoredUpdate(f"upd-{next(self._ids)}", run_id, name, payload)
            self.updates[update.update_id] = update
            self._wake(run_id)
            return update.update_id

    def settle_promise(
        self, promise_id: str, value: str = "", error: str = "", rejected: bool = False
    ) -> None:
        with self._lock:
            promise = self.promises.get(promise_id)
            if promise is None:
                raise Refused(AbiStatus.NOT_FOUND, f"no promise {promise_id}")
            if promise["status"] != "pending":
                raise Refused(
                    AbiStatus.PERMANENT, f"promise {promise_id} is already {promise['status']}"
                )
            promise.update(status="rejected" if rejected else "resolved", value=value, error=error)
            self._wake(promise["owner"])

    # --- WorkflowStorage ---

    def _append(self, run: RunRecord, events: Sequence[Event]) -> None:
        for event in events:
            stored = encode(event)
            if stored.step < len(run.history):
                continue  # already there (ON CONFLICT DO NOTHING)
            if stored.step != len(run.history):
                raise StorageError(
                    f"history of {run.run_id} would have a gap: step {stored.step} after "
                    f"{len(run.history)} events"
                )
            run.history.append(stored)

    def append_events(self, run: RunRef, events: Sequence[Event]) -> None:
        with self._lock:
            self._append(self._fenced(run), events)

    def complete_intent(self, run: RunRef, event: Event) -> None:
        with self._lock:
            record = self._fenced(run)
            if event.step >= len(record.history) or record.history[event.step].checksum:
                raise StorageError(f"no pending intent at step {event.step} of {run.run_id}")
            record.history[event.step] = encode(event)

    def task_call(self, run: RunRef, step: int) -> TaskCallRecord | None:
        call = self.task_calls.get((run.run_id, step))
        if call is None:
            return None
        reported = call["state"] in (TaskCallState.REPORTED, TaskCallState.SETTLED)
        return TaskCallRecord(
            call["task_id"],
            call["token"],
            call["sent"],
            call["deadline_ms"],
            call["status"] if reported else None,
            call["payload"],
        )

    def task_sent(self, run: RunRef, step: int) -> None:
        with self._lock:
            self.task_calls[(run.run_id, step)]["sent"] = True

    def settle_task_call(self, run: RunRef, event: Event) -> None:
        with self._lock:
            self.complete_intent(run, event)
            self.task_calls[(run.run_id, event.step)]["state"] = TaskCallState.SETTLED

    def report_task_outcome(
        self, task_id: str, token: str, status: int, payload: str
    ) -> Disposition:
        """What the hook in a task's worker does: record the task's outcome (the rule is
        :func:`engine.task_calls.disposition`) and wake the run."""
        with self._lock:
            found = next(
                ((key, c) for key, c in self.task_calls.items() if c["task_id"] == task_id),
                None,
            )
            if found is None:
                return disposition(None, False, had_outcome=False, run_ended=False)
            (run_id, _), call = found
            run = self.runs[run_id]
            verdict = disposition(
                call["state"],
                secrets.compare_digest(call["token"], token),
                had_outcome=call["status"] is not None,
                run_ended=run.status in TERMINAL_STATUSES,
            )
            if verdict is Disposition.RECORDED:
                call.update(state=TaskCallState.REPORTED, status=int(status), payload=payload)
                self._wake(run_id)
            return verdict

    def apply(
        self,
        run: RunRef,
        mutation: Mutation,
        pending: Sequence[Event],
        record: Callable[[Any], Event],
    ) -> Any:
        with self._lock:
            owner = self._fenced(run)
            try:
                result = self._mutate(run, mutation)
            except Denied as denied:
                self.audit.append(
                    {
                        "action": denied.action,
                        "run_id": run.run_id,
                        "reason": denied.message,
                        **denied.detail,
                    }
                )
                raise
            self._append(owner, [*pending, record(result)])
            return result

    def _mutate(self, ref: RunRef, m: Mutation) -> Any:
        match m:
            case DispatchTask():
                self.task_calls[(ref.run_id, m.step)] = {
                    "task_id": m.task_id,
                    "token": m.token,
                    "service": m.service,
                    "operation": m.operation,
                    "idempotency_key": m.idempotency_key,
                    "deadline_ms": m.deadline_ms,
                    "sent": False,
                    "state": TaskCallState.PENDING,
                    "status": None,
                    "payload": "",
                }
                return None
            case SetState():
                self.state[(m.scope, m.key)] = m.value
                return None
            case DeleteState():
                return self.state.pop((m.scope, m.key), None) is not None
            case IncrState():
                current = self.state.get((m.scope, m.key), "0")
                try:
                    value = int(current) + m.delta
                except ValueError:
                    raise Refused(
                        AbiStatus.PERMANENT, f"the value of {m.key!r} is not an integer"
                    ) from None
                self.state[(m.scope, m.key)] = str(value)
                return value
            case AcquireLock():
                held = self.locks.get(m.key)
                if held and held[0] != m.holder and (held[1] is None or held[1] > m.now_ms):
                    return False
                holding = [
                    key
                    for key, (holder, expires) in self.locks.items()
                    if holder == m.holder
                    and key != m.key
                    and (expires is None or expires > m.now_ms)
                ]
                refusal = quota_refusal(self.quotas, Quota.LOCKS, len(holding))
                if refusal is not None:
                    raise Refused(AbiStatus.DENIED, refusal)
                self.locks[m.key] = (m.holder, m.now_ms + m.ttl_ms if m.ttl_ms else None)
                return True
            case ReleaseLock():
                if self.locks.get(m.key, ("",))[0] == m.holder:
                    del self.locks[m.key]
                return None
            case StartChild():
                if m.run_id in self.runs:
                    return m.run_id
                started = sum(1 for r in self.runs.values() if r.parent_run_id == ref.run_id)
                refusal = quota_refusal(self.quotas, Quota.CHILDREN, started)
                if refusal is not None:
                    raise Refused(AbiStatus.DENIED, refusal)
                version = self._child_version(ref, m)
                self.create_run(
                    m.name,
                    version,
                    m.input,
                    run_id=m.run_id,
                    parent_run_id=ref.run_id,
                    parent_close_policy=m.parent_close_policy,
                    priority=m.priority,
                )
                return m.run_id
            case StartDetached():
                if m.run_id not in self.runs:
                    version = self._resolve_version(m.name)
                    self.create_run(
                        m.name, version, m.input, run_id=m.run_id, detached_from=ref.run_id
                    )
                return m.run_id
            case SendSignal():
                target = self._target(m.target_id)
                if target is not None:
                    declared = self.deployed(target.definition, target.version)
                    refusal = guest_signal_refusal(
                        require_auth=self.require_signal_auth,
                        allowed_callers=declared.allowed_signal_callers if declared else (),
                        caller=self.runs[ref.run_id].definition,
                        target=target.definition,
                    )
                    if refusal is not None:
                        raise Denied(refusal, "signal_denied", target=target.run_id, signal=m.name)
                self.deliver_signal(m.target_id, m.name, m.payload, m.correlation_id)
                return None
            case CreatePromise():
                self.promises.setdefault(
                    m.promise_id, {"owner": ref.run_id, "name": m.name, "status": "pending"}
                )
                return None
            case SettlePromise():
                self.settle_promise(m.promise_id, m.value, m.error, m.rejected)
                return None
            case CreateSchedule():
                problem = cron_error(m.cron) or timezone_error(m.timezone)
                if problem:
                    raise Refused(AbiStatus.PERMANENT, problem)
                if m.workflow_name not in self.definitions:
                    raise Refused(
                        AbiStatus.NOT_FOUND, f"no workflow definition named {m.workflow_name!r}"
                    )
                refusal = quota_refusal(self.quotas, Quota.SCHEDULES, len(self.schedules))
                if refusal is not None:
                    raise Refused(AbiStatus.DENIED, refusal)
                self.schedules[m.schedule_id] = {
                    "id": m.schedule_id,
                    "workflow_name": m.workflow_name,
                    "cron": m.cron,
                    "timezone": m.timezone,
                    "input": m.input,
                }
                return m.schedule_id
            case DeleteSchedule():
                if self.schedules.pop(m.schedule_id, None) is None:
                    raise Refused(AbiStatus.NOT_FOUND, f"no schedule {m.schedule_id}")
                return None
            case EnqueueInvocation():
                self.invocations.append(m)
                return None
        raise RuntimeError(f"unrecognised mutation {m!r}")

    def _resolve_version(self, name: str) -> int:
        try:
            return choose_version(name, self.definitions.get(name, {}))
        except NoSuchVersion as exc:
            raise Refused(AbiStatus.NOT_FOUND, exc.message) from None

    def deployed(self, name: str, version: int) -> DeployedVersion | None:
        """A deployed version as the rules of :mod:`engine.versions` see it."""
        deprecated = self.definitions.get(name, {}).get(version)
        if deprecated is None:
            return None
        declared = self.declared.get((name, version), DeployedVersion(version))
        return replace(declared, version=version, deprecated=deprecated)

    def _child_version(self, ref: RunRef, m: StartChild) -> int:
        parent = self.runs[ref.run_id]
        spec = self.deployed(parent.definition, parent.version) or DeployedVersion(0)
        versions = [self.deployed(m.name, v) for v in self.definitions.get(m.name, {})]
        try:
            return resolve_child_version(
                m.name,
                [v for v in versions if v is not None],
                version=m.version,
                parent_version=m.parent_version,
                binding=spec.child_binding,
                pins=spec.child_versions,
                stable=self.tags.get((m.name, STABLE_TAG)),
            )
        except NoSuchVersion as exc:
            raise Refused(AbiStatus.NOT_FOUND, exc.message) from None

    def next_signal(
        self, run: RunRef, names: Sequence[str], exclude: Collection[str]
    ) -> SignalMessage | None:
        with self._lock:
            for s in self.signals:
                if (
                    s.run_id == run.run_id
                    and not s.consumed
                    and s.name in names
                    and s.signal_id not in exclude
                ):
                    return SignalMessage(s.signal_id, s.name, s.payload, s.correlation_id)
            return None

    def cancellation(self, run: RunRef) -> str | None:
        record = self.runs.get(run.run_id)
        return record.cancel_reason if record else None

    def child_outcomes(
        self, run: RunRef, child_run_ids: Sequence[str]
    ) -> list[ChildOutcome | None]:
        with self._lock:
            return [self._child_outcome(child_run_id) for child_run_id in child_run_ids]

    def _child_outcome(self, child_run_id: str) -> ChildOutcome | None:
        child = self.runs.get(child_run_id)
        if child is None:
            return ChildOutcome(AbiStatus.NOT_FOUND, error=f"no run {child_run_id}")
        end = self.chain_end(child)
        return child_outcome(end.status, end.result, end.error, end.error_code)

    def chain_end(self, run: RunRecord) -> RunRecord:
        """The run that ends ``run``'s continue-as-new chain: itself, or the last run it
        was continued as."""
        while run.continued_as:
            run = self.runs[run.continued_as]
        return run

    def promise_state(self, run: RunRef, promise_id: str) -> PromiseState | None:
        promise = self.promises.get(promise_id)
        if promise is None:
            return None
        return PromiseState(promise["status"], promise.get("value", ""), promise.get("error", ""))

    def get_state(self, run: RunRef, scope: str, key: str) -> str | None:
        return self.state.get((scope, key))

    def list_state(self, run: RunRef, scope: str, prefix: str) -> list[str]:
        return sorted(k for (s, k) in list(self.state) if s == scope and k.startswith(prefix))

    def list_schedules(self, run: RunRef) -> list[dict[str, Any]]:
        return [dict(s) for s in self.schedules.values()]

    def pending_updates(self, run: RunRef, exclude: Collection[str]) -> list[UpdateRequest]:
        with self._lock:
            return [
                UpdateRequest(u.update_id, u.name, u.payload)
                for u in self.updates.values()
                if u.run_id == run.run_id and u.status == "pending" and u.update_id not in exclude
            ]

    def interrupts(self, run: RunRef, exclude: Collection[str]) -> Interrupts:
        return Interrupts(self.cancellation(run), self.pending_updates(run, exclude))

    def heartbeat(self, run: RunRef) -> bool:
        with self._lock:
            try:
                self._fenced(run)
            except FenceLost:
                return False
            return True

    # --- views ---

    def describe(self, run_id: str) -> dict[str, Any]:
        run = self.runs[run_id]
        return {
            "id": run.run_id,
            "workflow_id": run.workflow_id,
            "definition": run.definition,
            "version": run.version,
            "status": run.status,
            "result": run.result,
            "error": run.error,
            "error_code": run.error_code,
            "waiting_on": (run.waiting_on or {}).get("description"),
            "attempt": run.attempt,
            "query_state": dict(run.query_state),
            "continued_as": run.continued_as,
            "events": len(run.history),
            "compacted_events": run.history.compacted,
        }


def dumps(value: Any) -> str:
    """JSON text for a value; text is taken as already being JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
