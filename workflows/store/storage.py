"""The engine's storage protocol (``engine.storage.WorkflowStorage``) on the Django ORM.

Each method is one transaction in the run's tenant context (``tenant_context``: RLS on
PostgreSQL, explicit tenant filters everywhere else). Writes are **fenced**: they first lock
the instance row where ``assigned_to`` and ``generation`` still match the claim (``FOR NO KEY
UPDATE``, which does not block the foreign-key checks of other runs' inserts), and touch
nothing otherwise (:class:`~engine.errors.FenceLost`). Waking another run (a signal's target,
a promise's owner) happens after commit, in its own short transaction, so a run never holds
two instance locks at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import IntegrityError, connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Func, Q, QuerySet
from django.utils import timezone

from engine.errors import Denied, FenceLost, Refused, StorageError
from engine.events import Event, encode
from engine.faults import crash_point
from engine.policies import Quota, guest_signal_refusal, quota_refusal
from engine.status import AbiStatus
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
from engine.tracing import trace_id_of
from engine.versions import (
    STABLE_TAG,
    ChildBinding,
    DeployedVersion,
    NoSuchVersion,
    choose_version,
    resolve_child_version,
)
from workflows.crypto import open_column, seal_column
from workflows.models import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    TERMINAL_STATUSES,
    AuditLog,
    ConcurrencyKey,
    Invocation,
    Promise,
    RunStatus,
    Signal,
    TaskCall,
    VersionTag,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowState,
    chain_ends,
)
from workflows.models import (
    UpdateRequest as UpdateRequestRow,
)
from workflows.policies import quotas_for, require_signal_auth
from workflows.store import crons, group_commit, wake
from workflows.store.columns import LOCKED_COLUMNS, create_run
from workflows.store.group_commit import contiguous
from workflows.store.sql import array_literal, queries
from workflows.tenancy import tenant_context


class _IsTrue(Func):
    """``(condition) IS TRUE``: the condition's result (NULL is not true), in a form no index
    serves."""

    template = "(%(expressions)s) IS TRUE"
    output_field = BooleanField()


def held_by(worker_id: str) -> _IsTrue:
    """The fence's test that a run is ``worker_id``'s and running, for a filter beside the
    run's key. Its comparisons are wrapped in ``IS TRUE`` so that the database finds the run
    by its key: with bare ``=``, statistics in which running runs look rare let PostgreSQL
    read every running run through ``instance_due`` or ``instance_owner`` instead (the SQL
    functions' form of the test is ``_held_by`` in ``sql/postgresql.py``;
    ``tests/integration/test_fence_plans.py`` plans both)."""
    held = Q(assigned_to=worker_id, status=RunStatus.RUNNING)
    return _IsTrue(ExpressionWrapper(held, output_field=BooleanField()))


def _fenced(ref: RunRef) -> QuerySet[WorkflowInstance]:
    """The claimed instance row, locked, while the claim is still this worker's. Unordered:
    the model's ordering (``-created_at``) let PostgreSQL walk ``instance_listing`` through
    the tenant's running runs for the one row."""
    return (
        WorkflowInstance.objects.select_for_update(
            no_key=connection.features.has_select_for_no_key_update
        )
        .filter(
            held_by(ref.worker_id),
            id=ref.run_id,
            tenant_id=ref.tenant_id,
            generation=ref.generation,
        )
        .order_by()
    )


def _fence_lost(ref: RunRef) -> FenceLost:
    return FenceLost(f"run {ref.run_id} is no longer owned by {ref.worker_id}@{ref.generation}")


def lock_fenced(ref: RunRef) -> int:
    """Lock the claimed instance row; return its event count. Raises FenceLost."""
    row = next(iter(_fenced(ref).values_list("event_count", flat=True)[:1]), None)
    if row is None:
        raise _fence_lost(ref)
    return int(row)


def lock_fenced_instance(ref: RunRef) -> WorkflowInstance:
    """:func:`lock_fenced`, returning the locked row itself. Raises FenceLost."""
    # The checkpoint is deferred: the finalize's save() then writes the loaded fields only,
    # not the blob back (engine.compaction's fold writes it itself).
    statement = queries(connection).get("lock_fenced_instance")
    if statement is None:
        instance = next(iter(_fenced(ref).defer("compaction_state")[:1]), None)
    else:
        # PostgreSQL: the same statement written once (sql/postgresql.py), instead of the
        # ORM compiling it for the model's columns at every finalize (about 0.6 ms).
        with connection.cursor() as cursor:
            cursor.execute(statement, [ref.run_id, ref.tenant_id, ref.generation, ref.worker_id])
            row = cursor.fetchone()
        instance = None if row is None else LOCKED_COLUMNS.instance(row)
    if instance is None:
        raise _fence_lost(ref)
    return instance


def append_locked(
    ref: RunRef,
    event_count: int,
    events: Sequence[Event],
    now: datetime,
    *,
    update_count: bool = True,
) -> int:
    """Append ``events`` after ``event_count`` (skipping steps already stored); the caller
    holds the fenced lock. Returns the new count. ``update_count=False``: the caller writes
    ``event_count`` and ``heartbeat_at`` itself (the finalize saves the whole row)."""
    rows = []
    expected = event_count
    for event in events:
        if event.step < expected:
            continue  # already stored (a retried flush): ON CONFLICT DO NOTHING
        if event.step != expected:
            raise StorageError(
                f"history of {ref.run_id} would have a gap: "
                f"step {event.step} after {expected} events"
            )
        stored = encode(event)
        rows.append(
            WorkflowEvent(
                tenant_id=ref.tenant_id,
                instance_id=ref.run_id,
                step=stored.step,
                type_code=stored.type_code,
                payload=stored.payload,
                timestamp_ms=stored.ts,
                checksum=stored.checksum,
                intent_at=now if not stored.checksum else None,
                created_at=now,
            )
        )
        expected += 1
    if rows:
        WorkflowEvent.objects.bulk_create(rows)
    if update_count:
        WorkflowInstance.objects.filter(id=ref.run_id).update(
            event_count=expected, heartbeat_at=now
        )
    return expected


def fenced_append(
    tenant_id: uuid.UUID, ref: RunRef, events: Sequence[Event], now: datetime
) -> bool:
    """The common case of a per-step flush in one statement (PostgreSQL: the function
    ``cleat.append_events``, with this one run), in the caller's transaction or else one of
    its own: ``events`` are consecutive and start exactly at the stored count. True when they
    were appended. False when nothing was written -- not PostgreSQL, an unusual batch, or the
    row did not match (fence lost, a gap, a retried flush): the caller then takes the general
    path (:func:`lock_fenced` + :func:`append_locked`), which tells those cases apart."""
    if "append_events" not in queries(connection) or not events or not contiguous(events):
        return False
    item = group_commit.prepared(tenant_id, ref, events, now)
    return ref.run_id in group_commit.write_batch([item])


def client_side_binding(cursor: Any) -> bool:
    """Whether the psycopg cursor merges parameters itself (and so may send several
    statements in one message)."""
    try:
        from psycopg import ClientCursor
    except ImportError:  # psycopg2: always client-side, but no nextset(); not used
        return False
    return isinstance(getattr(cursor, "cursor", None), ClientCursor)


# How long after the load its interrupts may stand in for a blocking call's read (a guest
# that computes for longer before its first blocking call reads them again).
PREFETCH_FRESH_S = 0.5


class LoadedInterrupts(NamedTuple):
    """A run's interrupts as its load read them: the rows of ``cleat.run_interrupts`` (in the
    load's message, PostgreSQL) and when, on ``time.monotonic()``."""

    rows: list[tuple[Any, ...]]
    read_at: float


class DjangoStorage:
    """``WorkflowStorage`` for runs of one tenant.

    ``interrupts``, the run's as its load read them: the segment's first read of them (a
    blocking call's, or a poll of the cancellation) takes these rows instead of asking the
    database again, provided nothing was written for the run since (the load and that read
    are then only the replay apart) and it comes within ``PREFETCH_FRESH_S`` of the load: a
    run woken from a timer costs one round trip less. A request that arrived in between is
    seen as one that arrived a moment later: by the run's next read, or, when the run
    suspends, by the finalize's check of what arrived (it wakes the run); a run that ends
    first never sees it, as when a request comes just after a blocking call's read."""

    def __init__(
        self,
        tenant_id: uuid.UUID | str,
        clock: Callable[[], datetime] | None = None,
        interrupts: LoadedInterrupts | None = None,
    ) -> None:
        self.tenant_id = uuid.UUID(str(tenant_id))
        self.now = clock or timezone.now
        self._prefetched = interrupts  # cleared by every write for the run

    def _take_prefetched(self) -> list[tuple[Any, ...]] | None:
        found, self._prefetched = self._prefetched, None
        if found is None or time.monotonic() - found.read_at > PREFETCH_FRESH_S:
            return None
        return found.rows

    # --- history ---------------------------------------------------------------------------

    def append_events(self, run: RunRef, events: Sequence[Event]) -> None:
        self._prefetched = None  # a step is written: the load's interrupts are past
        now = self.now()
        committed = group_commit.append(self.tenant_id, run, events, now)
        if committed is None:  # not batched (or its batch failed): in a transaction of its own
            committed = fenced_append(self.tenant_id, run, events, now)
        if not committed:
            with tenant_context(self.tenant_id):
                count = lock_fenced(run)
                append_locked(run, count, events, now)
        crash_point("after_append")  # committed; the call that follows has not gone out yet

    def complete_intent(self, run: RunRef, event: Event) -> None:
        self._prefetched = None
        stored = encode(event)
        with tenant_context(self.tenant_id):
            lock_fenced(run)
            updated = WorkflowEvent.objects.filter(
                instance_id=run.run_id, step=event.step, checksum=""
            ).update(
                type_code=stored.type_code,
                payload=seal_column(
                    WorkflowEvent,
                    "payload",
                    self.tenant_id,
                    (run.run_id, event.step),
                    stored.payload,
                ),
                timestamp_ms=stored.ts,
                checksum=stored.checksum,
            )
            if updated != 1:
                raise StorageError(f"no pending intent at step {event.step} of {run.run_id}")

    # --- effects atomic with their events -------------------------------------------------------

    def apply(
        self,
        run: RunRef,
        mutation: Mutation,
        pending: Sequence[Event],
        record: Callable[[Any], Event],
    ) -> Any:
        self._prefetched = None  # the run acts: the load's interrupts are past
        try:
            with tenant_context(self.tenant_id):
                count = lock_fenced(run)
                now = self.now()
                # A refusal must leave nothing behind: run the mutation in a savepoint.
                with transaction.atomic():
                    result = self._mutate(run, mutation, now)
                append_locked(run, count, [*pending, record(result)], now)
                return result
        except Denied as denied:
            # The refused change rolled back; its audit row is kept, in its own transaction.
            with tenant_context(self.tenant_id):
                AuditLog.objects.create(
                    tenant_id=self.tenant_id,
                    instance_id=run.run_id,
                    action=denied.action,
                    operator=f"run:{run.run_id}",
                    reason=denied.message,
                    detail=denied.detail,
                )
            raise

    def _mutate(self, ref: RunRef, m: Mutation, now: datetime) -> Any:
        tenant = self.tenant_id
        match m:
            case SetState():
                updated = WorkflowState.objects.filter(
                    tenant_id=tenant, scope=m.scope, key=m.key
                ).update(
                    value=seal_column(WorkflowState, "value", tenant, (m.scope, m.key), m.value),
                    updated_at=now,
                )
                if not updated:
                    _create_or_update_state(tenant, m.scope, m.key, m.value)
                return None
            case DeleteState():
                deleted, _ = WorkflowState.objects.filter(
                    tenant_id=tenant, scope=m.scope, key=m.key
                ).delete()
                return deleted > 0
            case IncrState():
                row = (
                    WorkflowState.objects.select_for_update()
                    .filter(tenant_id=tenant, scope=m.scope, key=m.key)
                    .first()
                )
                current = row.value if row else "0"
                try:
                    value = int(current) + m.delta
                except ValueError:
                    raise Refused(
                        AbiStatus.PERMANENT, f"the value of {m.key!r} is not an integer"
                    ) from None
                if row:
                    row.value = str(value)
                    row.save(update_fields=["value", "updated_at"])
                else:
                    _create_or_update_state(tenant, m.scope, m.key, str(value))
                return value
            case AcquireLock():
                expires = now + timedelta(milliseconds=m.ttl_ms) if m.ttl_ms else None
                return take_lock(
                    tenant, m.key, m.holder, expires, now, lambda: self._check_lock_quota(m, now)
                )
            case ReleaseLock():
                ConcurrencyKey.objects.filter(tenant_id=tenant, key=m.key, holder=m.holder).delete()
                return None
            case StartChild():
                return self._start_run(
                    ref,
                    m.run_id,
                    m.name,
                    m.input,
                    m.version,
                    m.parent_version,
                    priority=m.priority,
                    parent=True,
                    policy=m.parent_close_policy,
                    traceparent=m.traceparent,
                    now=now,
                )
            case StartDetached():
                return self._start_run(ref, m.run_id, m.name, m.input, 0, 0, now=now)
            case SendSignal():
                target = find_signal_target(tenant, m.target_id)
                if target is None:
                    raise Refused(AbiStatus.NOT_FOUND, f"no running workflow {m.target_id}")
                allowed = target.allowed_signals
                if allowed is not None and m.name not in allowed:
                    raise Refused(
                        AbiStatus.DENIED, f"{m.target_id} does not accept signal {m.name!r}"
                    )
                caller = (
                    WorkflowInstance.objects.filter(id=ref.run_id)
                    .values_list("definition_name", flat=True)
                    .first()
                ) or ""
                refusal = guest_signal_refusal(
                    require_auth=require_signal_auth(),
                    allowed_callers=WorkflowDefinition.objects.filter(id=target.definition_id)
                    .values_list("allowed_signal_callers", flat=True)
                    .first(),
                    caller=caller,
                    target=target.definition_name,
                )
                if refusal is not None:
                    raise Denied(refusal, "signal_denied", target=str(target.id), signal=m.name)
                Signal.objects.create(
                    tenant_id=tenant,
                    instance_id=target.id,
                    name=m.name,
                    payload=m.payload,
                    correlation_id=m.correlation_id,
                    sender=ref.run_id,
                    created_at=now,
                )
                wake.after_commit(tenant, target.id)
                return None
            case CreatePromise():
                Promise.objects.get_or_create(
                    id=m.promise_id,
                    defaults={"tenant_id": tenant, "instance_id": ref.run_id, "name": m.name},
                )
                return None
            case SettlePromise():
                settle_promise(tenant, m.promise_id, m.value, m.error, m.rejected, now)
                return None
            case CreateSchedule():
                return crons.create(tenant, ref, m, now)
            case DeleteSchedule():
                crons.delete(tenant, m)
                return None
            case DispatchTask():
                # A call made again at this step (a retry that forgot its failure) replaces
                # the old record: an outcome of the old task no longer matches a token.
                TaskCall.objects.filter(instance_id=ref.run_id, step=m.step).delete()
                TaskCall.objects.create(
                    id=m.task_id,
                    tenant_id=tenant,
                    instance_id=ref.run_id,
                    step=m.step,
                    service=m.service,
                    operation=m.operation,
                    idempotency_key=m.idempotency_key,
                    token=m.token,
                    deadline_ms=m.deadline_ms,
                    created_at=now,
                )
                return None
            case EnqueueInvocation():
                Invocation.objects.get_or_create(
                    id=m.invocation_id,
                    defaults={
                        "tenant_id": tenant,
                        "instance_id": ref.run_id,
                        "service": m.service,
                        "operation": m.operation,
                        "request": m.request,
                        "idempotency_key": m.idempotency_key,
                        "deliver_at": datetime.fromtimestamp(m.deliver_at_ms / 1000, tz=now.tzinfo),
                    },
                )
                return None
        raise RuntimeError(f"unrecognised mutation {m!r}")

    def _start_run(
        self,
        ref: RunRef,
        run_id: str,
        name: str,
        input: str,
        version: int,
        parent_version: int,
        *,
        now: datetime,
        priority: int = 0,
        parent: bool = False,
        policy: str = "terminate",
        traceparent: str = "",
    ) -> str:
        if WorkflowInstance.objects.filter(id=run_id).exists():
            return run_id  # the same step started it before a crash
        if parent:
            refusal = quota_refusal(
                quotas_for(self.tenant_id),
                Quota.CHILDREN,
                WorkflowInstance.objects.filter(
                    tenant_id=self.tenant_id, parent_id=ref.run_id
                ).count(),
            )
            if refusal is not None:
                raise Refused(AbiStatus.DENIED, refusal)
        if parent:
            definition = resolve_child_definition(
                self.tenant_id, name, version, parent_version, ref.run_id
            )
        else:
            definition = resolve_detached_definition(self.tenant_id, name)
        parent_row = WorkflowInstance.objects.filter(id=ref.run_id).values("task_queue").first()
        create_run(
            id=run_id,
            tenant_id=self.tenant_id,
            workflow_id=run_id,
            definition=definition,
            definition_name=definition.name,
            definition_version=definition.version,
            input=input,
            # A guest may ask for any i64: held to the range every start is held to.
            priority=min(max(priority, PRIORITY_MIN), PRIORITY_MAX),
            task_queue=(parent_row or {}).get("task_queue", "default"),
            parent_id=ref.run_id if parent else None,
            detached_from=None if parent else ref.run_id,
            parent_close_policy=policy,
            trace_id=trace_id_of(traceparent) if traceparent else None,
            trace_parent=traceparent or None,
            next_wake_at=now,
            created_at=now,
        )
        crash_point("child_start")  # the child row written, the start's transaction open
        wake.ready_after_commit(self.tenant_id, run_id, inserted=True)
        return run_id

    def _check_lock_quota(self, m: AcquireLock, now: datetime) -> None:
        """DENIED when the holder's other live locks fill the locks quota."""
        holding = (
            ConcurrencyKey.objects.filter(tenant_id=self.tenant_id, holder=m.holder)
            .exclude(key=m.key)
            .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
            .count()
        )
        refusal = quota_refusal(quotas_for(self.tenant_id), Quota.LOCKS, holding)
        if refusal is not None:
            raise Refused(AbiStatus.DENIED, refusal)

    # --- reads ---------------------------------------------------------------------------------

    def next_signal(
        self, run: RunRef, names: Sequence[str], exclude: Collection[str]
    ) -> SignalMessage | None:
        """The run's oldest unconsumed signal of ``names`` not in ``exclude`` (the ones the
        segment consumed already): on PostgreSQL outside a transaction one call of
        ``cleat.next_signal`` (one round trip instead of a transaction of four), elsewhere
        the ORM's read in the tenant's transaction."""
        excluded = [int(x) for x in exclude if x.isdigit()]
        sql = queries(connection).get("next_signal")
        row: Sequence[Any] | None
        if sql is not None and not connection.in_atomic_block:
            with connection.cursor() as cursor:
                cursor.execute(
                    sql,
                    [
                        str(self.tenant_id),
                        run.run_id,
                        array_literal(names),
                        array_literal(excluded),
                    ],
                )
                row = cursor.fetchone()
        else:
            with tenant_context(self.tenant_id):
                row = (
                    Signal.objects.filter(
                        tenant_id=self.tenant_id,
                        instance_id=run.run_id,
                        consumed_at__isnull=True,
                        name__in=list(names),
                    )
                    .exclude(id__in=excluded)
                    .order_by("id")
                    .values_list("id", "name", "payload", "correlation_id")
                    .first()
                )
        if row is None:
            return None
        payload = open_column(Signal, "payload", self.tenant_id, (run.run_id,), row[2]) or ""
        return SignalMessage(str(row[0]), row[1], payload, row[3])

    def cancellation(self, run: RunRef) -> str | None:
        rows = self._take_prefetched()
        if rows is not None:
            return _interrupts_cancellation(rows)
        with tenant_context(self.tenant_id):
            return self._cancellation(run)

    def _cancellation(self, run: RunRef) -> str | None:
        row = (
            WorkflowInstance.objects.filter(id=run.run_id, tenant_id=self.tenant_id)
            .values_list("cancel_requested", "cancel_reason")
            .first()
        )
        return _cancel_reason(*row) if row else None

    def child_outcomes(
        self, run: RunRef, child_run_ids: Sequence[str]
    ) -> list[ChildOutcome | None]:
        with tenant_context(self.tenant_id):
            return child_outcomes(self.tenant_id, child_run_ids)

    def promise_state(self, run: RunRef, promise_id: str) -> PromiseState | None:
        with tenant_context(self.tenant_id):
            row = (
                Promise.objects.filter(tenant_id=self.tenant_id, id=promise_id)
                .values_list("status", "value", "error", "instance_id")
                .first()
            )
        if not row:
            return None
        status, value, error, owner = row
        opened = [
            open_column(Promise, name, self.tenant_id, (owner, promise_id), text) or ""
            for name, text in (("value", value), ("error", error))
        ]
        return PromiseState(status, *opened)

    def get_state(self, run: RunRef, scope: str, key: str) -> str | None:
        with tenant_context(self.tenant_id):
            value: str | None = (
                WorkflowState.objects.filter(tenant_id=self.tenant_id, scope=scope, key=key)
                .values_list("value", flat=True)
                .first()
            )
        return open_column(WorkflowState, "value", self.tenant_id, (scope, key), value)

    def list_state(self, run: RunRef, scope: str, prefix: str) -> list[str]:
        with tenant_context(self.tenant_id):
            keys = WorkflowState.objects.filter(
                tenant_id=self.tenant_id, scope=scope, key__startswith=prefix
            ).values_list("key", flat=True)
            # Sorted in Python: collations differ between databases; the guest needs one order.
            return sorted(keys)

    def list_schedules(self, run: RunRef) -> list[dict[str, Any]]:
        with tenant_context(self.tenant_id):
            return crons.list_schedules(self.tenant_id)

    def pending_updates(self, run: RunRef, exclude: Collection[str]) -> list[UpdateRequest]:
        with tenant_context(self.tenant_id):
            return self._pending_updates(run, exclude)

    def _pending_updates(self, run: RunRef, exclude: Collection[str]) -> list[UpdateRequest]:
        rows = (
            UpdateRequestRow.objects.filter(
                tenant_id=self.tenant_id, instance_id=run.run_id, status="pending"
            )
            .order_by("created_at", "id")
            .values_list("id", "name", "payload")
        )
        return self._updates(run, rows, exclude)

    def _updates(
        self, run: RunRef, rows: Iterable[Sequence[Any]], exclude: Collection[str]
    ) -> list[UpdateRequest]:
        """Pending updates from their (id, name, sealed payload) rows, those in ``exclude``
        left out."""
        return [
            UpdateRequest(
                str(i),
                n,
                open_column(UpdateRequestRow, "payload", self.tenant_id, (run.run_id,), p) or "",
            )
            for i, n, p in rows
            if str(i) not in exclude
        ]

    def interrupts(self, run: RunRef, exclude: Collection[str]) -> Interrupts:
        """The load's rows when they still apply (see the class: no round trip);
        otherwise, on PostgreSQL outside a transaction, one call of ``cleat.run_interrupts``
        (one round trip instead of two transactions of four); elsewhere both reads in one
        transaction."""
        rows = self._take_prefetched()
        if rows is None:
            sql = queries(connection).get("run_interrupts")
            if sql is None or connection.in_atomic_block:
                with tenant_context(self.tenant_id):
                    return Interrupts(self._cancellation(run), self._pending_updates(run, exclude))
            with connection.cursor() as cursor:
                cursor.execute(sql, [str(self.tenant_id), run.run_id])
                rows = cursor.fetchall()
        if not rows:  # the run is gone
            return Interrupts(None, [])
        updates = self._updates(run, (row[2:] for row in rows if row[2] is not None), exclude)
        return Interrupts(_interrupts_cancellation(rows), updates)

    # --- task calls -----------------------------------------------------------------------

    def task_call(self, run: RunRef, step: int) -> TaskCallRecord | None:
        with tenant_context(self.tenant_id):
            row = (
                TaskCall.objects.filter(tenant_id=self.tenant_id, instance_id=run.run_id, step=step)
                .values_list("id", "token", "sent", "deadline_ms", "status", "payload")
                .first()
            )
        if row is None:
            return None
        task_id, token, sent, deadline_ms, status, payload = row
        payload = open_column(TaskCall, "payload", self.tenant_id, (run.run_id, step), payload)
        return TaskCallRecord(str(task_id), token, sent, deadline_ms, status, payload or "")

    def task_sent(self, run: RunRef, step: int) -> None:
        self._prefetched = None
        with tenant_context(self.tenant_id):
            TaskCall.objects.filter(
                tenant_id=self.tenant_id, instance_id=run.run_id, step=step
            ).update(sent=True)

    def settle_task_call(self, run: RunRef, event: Event) -> None:
        self._prefetched = None
        stored = encode(event)
        with tenant_context(self.tenant_id):
            lock_fenced(run)
            updated = WorkflowEvent.objects.filter(
                instance_id=run.run_id, step=event.step, checksum=""
            ).update(
                type_code=stored.type_code,
                payload=seal_column(
                    WorkflowEvent,
                    "payload",
                    self.tenant_id,
                    (run.run_id, event.step),
                    stored.payload,
                ),
                timestamp_ms=stored.ts,
                checksum=stored.checksum,
            )
            if updated != 1:
                raise StorageError(f"no pending intent at step {event.step} of {run.run_id}")
            TaskCall.objects.filter(instance_id=run.run_id, step=event.step).update(
                state=TaskCall.State.SETTLED
            )

    def heartbeat(self, run: RunRef) -> bool:
        with tenant_context(self.tenant_id):
            return (
                WorkflowInstance.objects.filter(
                    held_by(run.worker_id),
                    id=run.run_id,
                    tenant_id=self.tenant_id,
                    generation=run.generation,
                ).update(heartbeat_at=self.now())
                == 1
            )


def _interrupts_cancellation(rows: Sequence[Sequence[Any]]) -> str | None:
    """The cancellation reason in ``cleat.run_interrupts``' rows (each row carries the run's
    cancellation columns first; no row: the run is gone)."""
    return _cancel_reason(rows[0][0], rows[0][1]) if rows else None


# --- helpers shared with the services ------------------------------------------------------------


def _cancel_reason(requested: bool, reason: str | None) -> str | None:
    """The reason a cancellation request gives the run (None: none was made)."""
    return (reason or "cancelled") if requested else None


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(text))
    except ValueError:
        return None


def _create_or_update_state(tenant: uuid.UUID, scope: str, key: str, value: str) -> None:
    try:
        with transaction.atomic():
            WorkflowState.objects.create(tenant_id=tenant, scope=scope, key=key, value=value)
    except IntegrityError:  # created concurrently by a workflow sharing the scope
        WorkflowState.objects.filter(tenant_id=tenant, scope=scope, key=key).update(
            value=seal_column(WorkflowState, "value", tenant, (scope, key), value)
        )


def find_signal_target(tenant: uuid.UUID, target_id: str) -> WorkflowInstance | None:
    """The run a signal addressed to ``target_id`` reaches: that run, or the newest run of
    the workflow with that id. None when it does not exist or has finished."""
    target: WorkflowInstance | None = None
    as_uuid = _uuid_or_none(target_id)
    if as_uuid is not None:
        target = WorkflowInstance.objects.filter(tenant_id=tenant, id=as_uuid).first()
    if target is None:
        target = (
            WorkflowInstance.objects.filter(tenant_id=tenant, workflow_id=target_id)
            .order_by("-created_at")
            .first()
        )
    if target is None or target.status in TERMINAL_STATUSES:
        return None
    return target


def child_outcomes(tenant: uuid.UUID, run_ids: Sequence[str]) -> list[ChildOutcome | None]:
    """Each run's outcome for a parent awaiting it (``engine.storage.child_outcome``) by the
    run that ends its chain (``chain_ends``), in the order asked: one read for all of them.
    An id that names no run of the tenant answers NOT_FOUND. Called in the tenant's
    context."""
    wanted = {rid: _uuid_or_none(rid) for rid in run_ids}
    ends = chain_ends(
        {as_uuid for as_uuid in wanted.values() if as_uuid is not None},
        ("id", "status", "result", "error", "error_code"),
        tenant,
    )
    outcomes: list[ChildOutcome | None] = []
    for rid in run_ids:
        as_uuid = wanted[rid]
        end = ends.get(as_uuid) if as_uuid is not None else None
        if end is None:
            outcomes.append(ChildOutcome(AbiStatus.NOT_FOUND, error=f"no run {rid}"))
            continue
        run_id, status, result, error, error_code = end
        outcomes.append(
            child_outcome(
                status,
                open_column(WorkflowInstance, "result", tenant, (run_id,), result),
                open_column(WorkflowInstance, "error", tenant, (run_id,), error),
                error_code,
            )
        )
    return outcomes


def resolve_child_definition(
    tenant: uuid.UUID, name: str, version: int, parent_version: int, parent_run_id: str = ""
) -> WorkflowDefinition:
    """The child's version by :func:`engine.versions.resolve_child_version`: an explicit
    version, else the parent definition's binding policy, else the parent's version, else
    the newest compatible one. ``NOT_FOUND`` to the guest when none qualifies."""
    defs = WorkflowDefinition.objects.filter(tenant_id=tenant, name=name).defer("wasm")
    parent = (
        WorkflowDefinition.objects.filter(workflowinstance__id=parent_run_id)
        .values("child_binding", "child_versions")
        .first()
        if parent_run_id
        else None
    ) or {}
    binding = parent.get("child_binding") or ""
    stable = None
    if binding == ChildBinding.STABLE:
        stable = (
            VersionTag.objects.filter(tenant_id=tenant, name=name, tag=STABLE_TAG)
            .values_list("version", flat=True)
            .first()
        )
    try:
        chosen = resolve_child_version(
            name,
            [
                DeployedVersion(number, deprecated, minimum)
                for number, deprecated, minimum in defs.values_list(
                    "version", "deprecated", "min_version"
                )
            ],
            version=version,
            parent_version=parent_version,
            binding=binding,
            pins=parent.get("child_versions") or {},
            stable=stable,
        )
    except NoSuchVersion as exc:
        raise Refused(AbiStatus.NOT_FOUND, exc.message) from None
    return defs.get(version=chosen)


def resolve_detached_definition(tenant: uuid.UUID, name: str) -> WorkflowDefinition:
    """A detached run's version: as any start from outside, the newest non-deprecated one
    (:func:`engine.versions.choose_version`)."""
    defs = WorkflowDefinition.objects.filter(tenant_id=tenant, name=name).defer("wasm")
    try:
        chosen = choose_version(name, dict(defs.values_list("version", "deprecated")))
    except NoSuchVersion as exc:
        raise Refused(AbiStatus.NOT_FOUND, exc.message) from None
    return defs.get(version=chosen)


def settle_promise(
    tenant: uuid.UUID, promise_id: str, value: str, error: str, rejected: bool, now: datetime
) -> Promise:
    promise = Promise.objects.select_for_update().filter(tenant_id=tenant, id=promise_id).first()
    if promise is None:
        raise Refused(AbiStatus.NOT_FOUND, f"no promise {promise_id}")
    if promise.status != Promise.State.PENDING:
        raise Refused(AbiStatus.PERMANENT, f"promise {promise_id} is already {promise.status}")
    promise.status = Promise.State.REJECTED if rejected else Promise.State.RESOLVED
    promise.value, promise.error, promise.settled_at = value, error, now
    promise.save(update_fields=["status", "value", "error", "settled_at"])
    wake.after_commit(tenant, promise.instance_id)
    return promise


__all__ = [
    "DjangoStorage",
    "append_locked",
    "client_side_binding",
    "fenced_append",
    "held_by",
    "lock_fenced",
    "lock_fenced_instance",
]


def take_lock(
    tenant: uuid.UUID,
    key: str,
    holder: str,
    expires: datetime | None,
    now: datetime,
    check_quota: Callable[[], None] = lambda: None,
) -> bool:
    """Take ``key`` for ``holder`` (a workflow id) unless another holder's lease on it is
    live; True when taken. ``check_quota`` raises when the holder may take no more. Runs in
    the caller's transaction and tenant context: a guest's ``acquire_lock`` and an operator's
    retry re-taking the locks its run's history holds (``retake_locks``)."""
    held = ConcurrencyKey.objects.select_for_update().filter(tenant_id=tenant, key=key).first()
    if held is None:
        check_quota()
        try:
            with transaction.atomic():
                ConcurrencyKey.objects.create(
                    tenant_id=tenant, key=key, holder=holder, expires_at=expires
                )
        except IntegrityError:
            return False  # another workflow took it a moment ago
        return True
    if held.holder != holder and (held.expires_at is None or held.expires_at > now):
        return False
    check_quota()
    held.holder, held.expires_at, held.acquired_at = holder, expires, now
    held.save(update_fields=["holder", "expires_at", "acquired_at"])
    return True
