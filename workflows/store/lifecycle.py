"""The run lifecycle a worker drives: claim, load, finalize, release, heartbeat, reap.

Claims bump ``generation`` in the same statement that sets ``running`` and ``assigned_to``:
on PostgreSQL through the ``cleat.claim_instances`` definer function (``FOR UPDATE SKIP
LOCKED``, across tenants, see ``workflows/rls.py``); on MariaDB with the ORM's ``SELECT ... FOR
UPDATE SKIP LOCKED`` then an ``UPDATE``; on SQLite the single writer lock of an IMMEDIATE
transaction serialises claims.

The finalize is one fenced transaction: it appends the segment's remaining events, marks
consumed signals and answered updates, and sets the new status -- ``done``, ``failed``,
``dead_lettered`` or ``ready`` with ``next_wake_at`` -- or, for continue-as-new, completes
this run and creates its successor. When the claim is no longer current it touches nothing
(:class:`FenceLost`).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine.errors import ErrorCode, FenceLost
from engine.events import EncodedEvent, EventType, decode, encode
from engine.session import Completed, ContinuedAsNew, Failed, SegmentResult, Suspended
from engine.status import Status as AbiStatus
from engine.storage import RunRef
from workflows.models import (
    TERMINAL_STATUSES,
    Promise,
    Signal,
    Status,
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.store import wake
from workflows.store.storage import (
    APPEND_FROM_FENCE_SQL,
    SET_TENANT_SQL,
    append_locked,
    append_params,
    client_side_binding,
    contiguous,
    lock_fenced_instance,
)
from workflows.tenancy import tenant_context

log = logging.getLogger("cleat.store")


def wait_recheck() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "CLEAT_WAIT_RECHECK_SECONDS", 300)))


@dataclass(frozen=True)
class Claim:
    id: uuid.UUID
    tenant_id: uuid.UUID
    generation: int


@dataclass(frozen=True)
class LoadedRun:
    claim: Claim
    worker_id: str
    instance: WorkflowInstance
    definition_id: int
    sha256: str
    max_history_length: int
    history: list[EncodedEvent]

    @property
    def ref(self) -> RunRef:
        return RunRef(
            str(self.claim.tenant_id),
            self.instance.workflow_id,
            str(self.instance.id),
            self.worker_id,
            self.claim.generation,
        )


def claim_ready_instances(
    worker_id: str,
    task_queues: Sequence[str],
    limit: int,
    now: datetime,
    tenant: uuid.UUID | None = None,
) -> list[Claim]:
    """Claim up to ``limit`` due ready runs of active tenants, taking turns between tenants
    (each one's most urgent run -- priority, then due time -- before anyone's second, the
    tenant served longest ago first) and within each tenant's running cap; bumps their
    generation."""
    if limit <= 0:
        return []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, tenant_id, generation "
                "FROM cleat.claim_instances(%s, %s, %s, %s, %s, %s)",
                [worker_id, list(task_queues), limit, now, tenant, default_max_running()],
            )
            return [
                Claim(uuid.UUID(str(i)), uuid.UUID(str(t)), int(g)) for i, t, g in cursor.fetchall()
            ]
    if connection.vendor == "microsoft":  # untested here: no SQL Server in CI
        from workflows.rls import MSSQL_CLAIM_SQL

        queues = ", ".join(["%s"] * len(task_queues))
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                MSSQL_CLAIM_SQL.format(queues=queues),
                [now, *task_queues, limit, worker_id, now, now],
            )
            return [
                Claim(uuid.UUID(str(i)), uuid.UUID(str(t)), int(g)) for i, t, g in cursor.fetchall()
            ]
    with transaction.atomic():
        ids = _fair_turns(task_queues, limit, now, tenant)
        if not ids:
            return []
        WorkflowInstance.objects.filter(id__in=ids).update(
            status=Status.RUNNING,
            assigned_to=worker_id,
            heartbeat_at=now,
            generation=F("generation") + 1,
            started_at=Coalesce("started_at", now),
        )
        rows = list(
            WorkflowInstance.objects.filter(id__in=ids).values_list("id", "tenant_id", "generation")
        )
    _record_turns({t for _, t, _ in rows}, now)
    return [Claim(i, t, g) for i, t, g in rows]


def _record_turns(tenants: set[uuid.UUID], now: datetime) -> None:
    """Note when the claim served these tenants -- after the claim committed, in a transaction
    of its own that skips a tenant row someone holds. On MariaDB every insert into a tenant's
    tables share-locks its tenant row (the foreign key check): a claim that updated the row
    inside its own transaction waited for those and deadlocked with finalizes."""
    if not tenants:
        return
    with transaction.atomic():
        free = list(
            Tenant.objects.select_for_update(
                skip_locked=connection.features.has_select_for_update_skip_locked
            )
            .filter(id__in=tenants)
            .values_list("id", flat=True)
        )
        if free:
            Tenant.objects.filter(id__in=free).update(last_claimed_at=now)


def default_max_running() -> int:
    """The running cap of a tenant that sets none (``CLEAT_TENANT_MAX_RUNNING``; 0: none)."""
    return int(getattr(settings, "CLEAT_TENANT_MAX_RUNNING", 0) or 0)


def _fair_turns(
    task_queues: Sequence[str], limit: int, now: datetime, tenant: uuid.UUID | None
) -> list[uuid.UUID]:
    """The claim's choice on MariaDB and SQLite, as ``cleat.claim_instances`` makes it on
    PostgreSQL (migration 0005): per active tenant with due runs, its most urgent ones up to
    its room under the running cap (locked, SKIP LOCKED where the database has it); then
    every tenant's first before anyone's second, the tenant served longest ago first."""
    due = WorkflowInstance.objects.filter(
        status=Status.READY, next_wake_at__lte=now, task_queue__in=list(task_queues)
    )
    if tenant is not None:
        due = due.filter(tenant_id=tenant)
    waiting = set(due.values_list("tenant_id", flat=True).distinct())
    if not waiting:
        return []
    tenants = list(
        Tenant.objects.filter(id__in=waiting, is_active=True).values_list(
            "id", "max_running", "last_claimed_at"
        )
    )
    running = dict(
        WorkflowInstance.objects.filter(
            status=Status.RUNNING, tenant_id__in=[t for t, *_ in tenants]
        )
        .values("tenant_id")
        .annotate(n=Count("id"))
        .values_list("tenant_id", "n")
    )
    default_cap = default_max_running()
    skip_locked = connection.features.has_select_for_update_skip_locked
    turns: list[tuple[int, float, int, datetime, uuid.UUID]] = []
    for tenant_id, max_running, last_claimed_at in tenants:
        cap = max_running or default_cap
        room = min(limit, cap - running.get(tenant_id, 0)) if cap > 0 else limit
        if room <= 0:
            continue
        served = last_claimed_at.timestamp() if last_claimed_at else float("-inf")
        candidates = (
            due.filter(tenant_id=tenant_id)
            .select_for_update(skip_locked=skip_locked)
            .order_by("-priority", "next_wake_at", "created_at")
            .values_list("id", "priority", "next_wake_at")[:room]
        )
        for turn, (run_id, priority, wake_at) in enumerate(candidates):
            turns.append((turn, served, -priority, wake_at, run_id))
    turns.sort()
    return [run_id for *_, run_id in turns[:limit]]


def load_run(claim: Claim, worker_id: str) -> LoadedRun | None:
    """Read what the segment needs; None if the claim already moved on."""
    done, loaded = _load_in_one_message(claim, worker_id)
    if done:
        return loaded
    with tenant_context(claim.tenant_id):
        instance = (
            WorkflowInstance.objects.select_related("definition")
            .defer("definition__wasm")
            .filter(
                id=claim.id,
                generation=claim.generation,
                assigned_to=worker_id,
                status=Status.RUNNING,
            )
            .first()
        )
        if instance is None:
            return None
        definition = {
            "id": instance.definition.id,
            "sha256": instance.definition.sha256,
            "max_history_length": instance.definition.max_history_length,
        }
        history = [
            EncodedEvent(step, code, ts, payload, checksum)
            for step, code, ts, payload, checksum in WorkflowEvent.objects.filter(
                instance_id=instance.id
            )
            .order_by("step")
            .values_list("step", "type_code", "timestamp_ms", "payload", "checksum")
        ]
    return LoadedRun(
        claim,
        worker_id,
        instance,
        definition["id"],
        definition["sha256"],
        definition["max_history_length"],
        history,
    )


# PostgreSQL: the load in one simple-protocol message (one round trip instead of five: BEGIN,
# the tenant, the instance, the history, COMMIT). The statements of one message run as one
# implicit transaction, so the tenant set by the first (transaction-local) scopes the other
# two under RLS, exactly as tenant_context() does; each statement takes its own snapshot, as
# the ORM's statements do inside a READ COMMITTED transaction.
_INSTANCE_FIELDS = tuple(WorkflowInstance._meta.concrete_fields)


def _load_sql() -> str:
    instance = WorkflowInstance._meta.db_table
    definition = WorkflowDefinition._meta.db_table
    event = WorkflowEvent._meta.db_table
    columns = ", ".join(f'i."{f.column}"' for f in _INSTANCE_FIELDS)
    fence = "id = %s AND tenant_id = %s AND generation = %s AND assigned_to = %s AND status = %s"
    return (
        f"{SET_TENANT_SQL}\n"
        f"SELECT {columns}, d.sha256, d.max_history_length FROM {instance} AS i "
        f"JOIN {definition} AS d ON d.id = i.definition_id "
        f"WHERE i.{fence.replace(' AND ', ' AND i.')};\n"
        f"SELECT step, type_code, timestamp_ms, payload, checksum FROM {event} "
        f"WHERE instance_id = %s AND EXISTS (SELECT 1 FROM {instance} WHERE {fence}) "
        "ORDER BY step"
    )


_LOAD_SQL = _load_sql()


def _load_in_one_message(claim: Claim, worker_id: str) -> tuple[bool, LoadedRun | None]:
    """:func:`load_run` in one round trip: (True, its answer) on PostgreSQL outside a
    transaction with client-side binding; (False, None) where that does not apply."""
    if (
        connection.vendor != "postgresql"
        or connection.in_atomic_block
        or not connection.get_autocommit()
    ):
        return False, None
    fence = [str(claim.id), str(claim.tenant_id), claim.generation, worker_id, Status.RUNNING]
    with connection.cursor() as cursor:
        if not client_side_binding(cursor):
            return False, None
        cursor.execute(_LOAD_SQL, [str(claim.tenant_id), *fence, str(claim.id), *fence])
        cursor.nextset()
        row = cursor.fetchone()
        cursor.nextset()
        events = cursor.fetchall()
        if row is None:
            return True, None
        instance = _instance_from_row(row[: len(_INSTANCE_FIELDS)])
    sha256, max_history_length = row[len(_INSTANCE_FIELDS) :]
    history = [
        EncodedEvent(step, code, ts, payload, checksum)
        for step, code, ts, payload, checksum in events
    ]
    return True, LoadedRun(
        claim,
        worker_id,
        instance,
        instance.definition_id,
        sha256,
        max_history_length,
        history,
    )


def _instance_from_row(values: Sequence[object]) -> WorkflowInstance:
    """A model instance from raw column values, converted as the ORM's own queries convert
    them (JSON fields, the backend's converters)."""
    row = list(values)
    for pos, (functions, expression) in _row_converters():
        value = row[pos]
        for convert in functions:
            value = convert(value, expression, connection)
        row[pos] = value
    return WorkflowInstance.from_db(connection.alias, _INSTANCE_ATTNAMES, row)


_INSTANCE_ATTNAMES = [f.attname for f in _INSTANCE_FIELDS]
_converters: dict[str, list[tuple[int, tuple[list[Any], Any]]]] = {}


def _row_converters() -> list[tuple[int, tuple[list[Any], Any]]]:
    """The ORM's converters for the instance columns (per database vendor: they are field
    and backend functions, called with the connection in hand)."""
    found = _converters.get(connection.vendor)
    if found is None:
        compiler = WorkflowInstance.objects.all().query.get_compiler(connection=connection)
        table = WorkflowInstance._meta.db_table
        found = list(compiler.get_converters([f.get_col(table) for f in _INSTANCE_FIELDS]).items())
        _converters[connection.vendor] = found
    return found


def load_wasm(tenant: uuid.UUID, definition_id: int) -> bytes:
    with tenant_context(tenant):
        return bytes(
            WorkflowDefinition.objects.filter(id=definition_id).values_list("wasm", flat=True).get()
        )


@dataclass(frozen=True)
class Finalized:
    status: str
    successor: str | None = None


def finalize_segment(ref: RunRef, result: SegmentResult, now: datetime | None = None) -> Finalized:
    """Persist a segment's outcome in one fenced transaction (see the module docstring)."""
    now = now or timezone.now()
    tenant = uuid.UUID(ref.tenant_id)
    if _complete_in_one_message(tenant, ref, result, now):
        return Finalized(Status.DONE)
    with tenant_context(tenant):
        # The fenced lock and the read of the row in one statement (FenceLost if it moved
        # on); the row is saved whole below, event_count and heartbeat_at included.
        instance = lock_fenced_instance(ref)
        instance.event_count = append_locked(
            ref, instance.event_count, result.new_events, now, update_count=False
        )
        instance.heartbeat_at = now
        if isinstance(result.outcome, (Failed, ContinuedAsNew)):
            # the retry policy / the successor's definition
            instance.definition = WorkflowDefinition.objects.defer("wasm").get(
                id=instance.definition_id
            )
        if result.consumed_signals:
            Signal.objects.filter(
                instance_id=instance.id,
                id__in=[int(s) for s in result.consumed_signals if s.isdigit()],
                consumed_at__isnull=True,
            ).update(consumed_at=now)
        for applied in result.applied_updates:
            UpdateRequest.objects.filter(
                id=applied.update_id, instance_id=instance.id, status=UpdateRequest.State.PENDING
            ).update(
                status=UpdateRequest.State.DONE
                if applied.status == AbiStatus.OK
                else UpdateRequest.State.FAILED,
                result=applied.payload,
                completed_at=now,
            )
        instance.query_state = result.query_state
        instance.assigned_to = None
        outcome = result.outcome
        successor: WorkflowInstance | None = None
        if isinstance(outcome, Suspended):
            wait = outcome.wait
            instance.status = Status.READY
            instance.waiting_on = wait.as_dict()
            recheck = now + wait_recheck()
            wake_at = (
                datetime.fromtimestamp(wait.wake_at_ms / 1000, tz=now.tzinfo)
                if wait.wake_at_ms is not None
                else None
            )
            instance.next_wake_at = min(wake_at, recheck) if wake_at else recheck
            if _wakeup_arrived(instance, wait.as_dict()):
                instance.next_wake_at = now
            instance.attempt = 1
        elif isinstance(outcome, Completed):
            _close(instance, Status.DONE, now)
            instance.result = outcome.result
            instance.error = instance.error_code = None
        elif isinstance(outcome, ContinuedAsNew):
            _close(instance, Status.DONE, now)
            instance.result = json.dumps({"continued_as_new": True})
            successor = _successor(instance, outcome, now)
        elif isinstance(outcome, Failed):
            _fail(instance, outcome, now)
        instance.save()
        if instance.is_terminal:
            _close_children(instance, now)
            _fail_pending_updates(instance, now)
            if instance.parent_id:
                wake.after_commit(tenant, instance.parent_id)
        if (
            instance.status == Status.READY
            and instance.next_wake_at
            and instance.next_wake_at <= now
        ):
            wake.notify_after_commit()
    return Finalized(instance.status, str(successor.id) if successor else None)


# PostgreSQL: the finalize of a run that completed, in one simple-protocol message (one
# round trip and one commit instead of seven round trips), in the common case only -- no
# consumed signal, no answered update, no open child. The statements run as one implicit
# transaction under the tenant set by the first. The second is the fence and the new row in
# one statement: it matches only the claimed row (owner, generation, running) whose history
# ends where the remaining events begin and that has no open child, takes its row lock, and
# inserts the remaining events only if it matched. The third fails the run's pending updates
# (as _fail_pending_updates), in a statement of its own so that its snapshot is taken after
# the row lock: an update queued by send_update (which locks the row) either committed before
# and is seen, or waits for this commit and then finds the run done. It changes nothing
# unless the second matched (the run is then `done` at this generation). When the second
# matches nothing, nothing was written and the general path below tells the cases apart.
def _finalize_done_sql() -> str:
    instance = WorkflowInstance._meta.db_table
    updates = UpdateRequest._meta.db_table
    terminal = ", ".join(f"'{s}'" for s in sorted(TERMINAL_STATUSES))
    return f"""{SET_TENANT_SQL}
WITH fence AS (
    UPDATE {instance} AS i
       SET status = %s, completed_at = %s, result = %s, error = NULL, error_code = NULL,
           waiting_on = NULL, next_wake_at = NULL, query_state = %s::jsonb,
           assigned_to = NULL, heartbeat_at = %s, updated_at = %s,
           event_count = i.event_count + %s
     WHERE i.id = %s AND i.tenant_id = %s AND i.assigned_to = %s AND i.generation = %s
       AND i.status = %s AND i.event_count = COALESCE(%s, i.event_count)
       AND NOT EXISTS (SELECT 1 FROM {instance} AS c
                        WHERE c.parent_id = i.id AND c.status NOT IN ({terminal}))
    RETURNING i.id, i.tenant_id, i.parent_id
), {APPEND_FROM_FENCE_SQL}
SELECT parent_id FROM fence;
UPDATE {updates} SET status = %s, result = %s, completed_at = %s
 WHERE instance_id = %s AND status = %s
   AND EXISTS (SELECT 1 FROM {instance}
                WHERE id = %s AND status = %s AND generation = %s AND assigned_to IS NULL)"""


_FINALIZE_DONE_SQL = _finalize_done_sql()


def _complete_in_one_message(
    tenant: uuid.UUID, ref: RunRef, result: SegmentResult, now: datetime
) -> bool:
    """The finalize of a completed run in one round trip (see above). True when it was
    done; False when it does not apply or matched nothing (nothing was written then)."""
    outcome = result.outcome
    if (
        not isinstance(outcome, Completed)
        or result.consumed_signals
        or result.applied_updates
        or connection.vendor != "postgresql"
        or connection.in_atomic_block
        or not connection.get_autocommit()
    ):
        return False
    events = result.new_events
    if not contiguous(events):
        return False
    first = events[0].step if events else None
    stored = [encode(e) for e in events]
    params = [
        str(tenant),
        Status.DONE,
        now,
        outcome.result,
        json.dumps(result.query_state),
        now,
        timezone.now(),  # updated_at, as auto_now writes it
        len(stored),
        ref.run_id,
        ref.tenant_id,
        ref.worker_id,
        ref.generation,
        Status.RUNNING,
        first,
        *append_params(stored, now),
        UpdateRequest.State.FAILED,
        f"the run ended ({Status.DONE}) before answering",
        now,
        ref.run_id,
        UpdateRequest.State.PENDING,
        ref.run_id,
        Status.DONE,
        ref.generation,
    ]
    with connection.cursor() as cursor:
        if not client_side_binding(cursor):
            return False
        cursor.execute(_FINALIZE_DONE_SQL, params)
        cursor.nextset()
        matched = cursor.fetchall()
    if not matched:
        return False
    parent_id = matched[0][0]
    if parent_id is not None:
        wake.after_commit(tenant, parent_id)  # committed already: runs at once
    return True


def _close(instance: WorkflowInstance, status: str, now: datetime) -> None:
    instance.status = status
    instance.completed_at = now
    instance.waiting_on = None
    instance.next_wake_at = None


def _fail(instance: WorkflowInstance, outcome: Failed, now: datetime) -> None:
    """A permanent failure fails at once; a retryable one is retried with the definition's
    backoff, then dead-lettered; non-determinism dead-letters at once so that a fixed
    version can be retried from the dead-letter queue."""
    definition = instance.definition
    instance.error, instance.error_code = outcome.message, outcome.code.value
    if outcome.code is ErrorCode.NONDETERMINISM:
        _close(instance, Status.DEAD_LETTERED, now)
    elif outcome.retryable and instance.attempt < definition.retry_max_attempts:
        forget_failed_call(instance)
        instance.status = Status.READY
        instance.next_wake_at = now + timedelta(seconds=definition.retry_delay_s(instance.attempt))
        instance.waiting_on = {
            "kind": "retry",
            "description": f"retry {instance.attempt + 1} of {definition.retry_max_attempts} "
            f"after {outcome.code.value}",
        }
        instance.attempt += 1
    elif outcome.retryable:
        _close(instance, Status.DEAD_LETTERED, now)
    else:
        _close(instance, Status.FAILED, now)


# Steps a retry makes again rather than replays: an external call whose failure may not repeat.
_RETRIED_CALLS = (EventType.CALL, EventType.HEARTBEAT, EventType.FETCH, EventType.PLUGIN_CALL)
_RETRIED_STATUSES = (
    AbiStatus.ERROR,
    AbiStatus.TIMEOUT,
    AbiStatus.AMBIGUOUS,
    AbiStatus.RETRIES_EXHAUSTED,
)


def forget_failed_call(instance: WorkflowInstance) -> int | None:
    """Delete the run's last event when it is an external call that failed retryably.

    Replay is deterministic: a retried run that replayed the recorded failure would fail the
    same way forever. Forgetting that one step makes the retry call the service again (an
    automatic retry at the same step, so with the same idempotency key; a retry from the
    dead-letter queue after the operator's audit event). Returns the forgotten step, if any."""
    last = WorkflowEvent.objects.filter(instance_id=instance.id).order_by("-step").first()
    if last is None or last.type_code not in {t.code for t in _RETRIED_CALLS}:
        return None
    event = decode(
        EncodedEvent(last.step, last.type_code, last.timestamp_ms, last.payload, last.checksum)
    )
    if getattr(event, "status", AbiStatus.OK) not in _RETRIED_STATUSES or getattr(
        event, "streaming", False
    ):
        return None
    last.delete()
    instance.event_count = last.step
    WorkflowInstance.objects.filter(id=instance.id).update(event_count=last.step)
    return last.step


def _successor(
    instance: WorkflowInstance, outcome: ContinuedAsNew, now: datetime
) -> WorkflowInstance:
    definition = instance.definition
    if outcome.version and outcome.version != instance.definition_version:
        found = WorkflowDefinition.objects.filter(
            tenant_id=instance.tenant_id, name=instance.definition_name, version=outcome.version
        ).first()
        if found is not None:
            definition = found
    successor = WorkflowInstance.objects.create(
        tenant_id=instance.tenant_id,
        workflow_id=instance.workflow_id,
        definition=definition,
        definition_name=definition.name,
        definition_version=definition.version,
        entry_point=instance.entry_point,
        input=outcome.input,
        priority=instance.priority,
        task_queue=instance.task_queue,
        parent_id=instance.parent_id,
        parent_close_policy=instance.parent_close_policy,
        allowed_signals=instance.allowed_signals,
        continued_from=instance,
        trace_id=instance.trace_id,
        next_wake_at=now,
        created_at=now,
    )
    # Signals that reached this run unconsumed belong to the chain: move them on.
    Signal.objects.filter(instance_id=instance.id, consumed_at__isnull=True).update(
        instance_id=successor.id
    )
    wake.notify_after_commit()
    return successor


def _wakeup_arrived(instance: WorkflowInstance, wait: dict[str, object]) -> bool:
    """Whatever a waiting run can be woken by, if it arrived while its segment ran."""
    if instance.cancel_requested:
        return True
    if UpdateRequest.objects.filter(
        instance_id=instance.id, status=UpdateRequest.State.PENDING
    ).exists():
        return True
    names = list(wait.get("signals") or [])  # type: ignore[call-overload]
    if (
        names
        and Signal.objects.filter(
            instance_id=instance.id, consumed_at__isnull=True, name__in=names
        ).exists()
    ):
        return True
    run_ids = list(wait.get("run_ids") or [])  # type: ignore[call-overload]
    if (
        run_ids
        and WorkflowInstance.objects.filter(id__in=run_ids, status__in=TERMINAL_STATUSES).exists()
    ):
        return True
    promise_id = wait.get("promise_id")
    return bool(
        promise_id
        and Promise.objects.filter(id=promise_id).exclude(status=Promise.State.PENDING).exists()
    )


def _close_children(parent: WorkflowInstance, now: datetime) -> None:
    children = WorkflowInstance.objects.filter(parent_id=parent.id).exclude(
        status__in=TERMINAL_STATUSES
    )
    if not children.exists():
        return  # the common case: one query instead of three
    for child in children.filter(parent_close_policy="terminate"):
        terminate_instance(child, f"parent {parent.id} closed", now)
    cancel = children.filter(parent_close_policy="request_cancel")
    cancelled = list(cancel.values_list("id", flat=True))
    cancel.update(cancel_requested=True, cancel_reason=f"parent {parent.id} closed")
    for child_id in cancelled:
        wake.after_commit(parent.tenant_id, child_id)


def _fail_pending_updates(instance: WorkflowInstance, now: datetime) -> None:
    UpdateRequest.objects.filter(
        instance_id=instance.id, status=UpdateRequest.State.PENDING
    ).update(
        status=UpdateRequest.State.FAILED,
        result=f"the run ended ({instance.status}) before answering",
        completed_at=now,
    )


def close_instance(
    instance: WorkflowInstance, status: str, now: datetime, **fields: object
) -> None:
    """Close a run from outside its segment (terminate, force-complete, force-fail), whoever
    holds it: the generation bump fences out its worker. Applies its children's close policy,
    fails its pending updates and wakes its parent, as a finalize does."""
    WorkflowInstance.objects.filter(id=instance.id).update(
        status=status,
        generation=F("generation") + 1,
        assigned_to=None,
        completed_at=now,
        next_wake_at=None,
        waiting_on=None,
        **fields,
    )
    instance.refresh_from_db()
    _close_children(instance, now)
    _fail_pending_updates(instance, now)
    if instance.parent_id:
        wake.after_commit(instance.tenant_id, instance.parent_id)


def terminate_instance(instance: WorkflowInstance, reason: str, now: datetime) -> None:
    close_instance(
        instance, Status.TERMINATED, now, error=reason, error_code=ErrorCode.TERMINATED.value
    )


def release(ref: RunRef, now: datetime | None = None, delay_s: float = 0.0) -> bool:
    """Give a claimed run back untouched (shutdown, or a host failure around its segment),
    due again after ``delay_s``."""
    now = now or timezone.now()
    with tenant_context(uuid.UUID(ref.tenant_id)):
        released = WorkflowInstance.objects.filter(
            id=ref.run_id,
            assigned_to=ref.worker_id,
            generation=ref.generation,
            status=Status.RUNNING,
        ).update(
            status=Status.READY, assigned_to=None, next_wake_at=now + timedelta(seconds=delay_s)
        )
    return released == 1


def heartbeat_worker(worker_id: str, now: datetime) -> int:
    """Renew every lease this worker holds. Deliberately not per-generation (one statement
    for all runs); each write of a segment is fenced on its own."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT cleat.heartbeat_worker(%s, %s)", [worker_id, now])
            return int(cursor.fetchone()[0])
    return WorkflowInstance.objects.filter(assigned_to=worker_id, status=Status.RUNNING).update(
        heartbeat_at=now
    )


def reap_expired_leases(lease: timedelta, now: datetime) -> int:
    """Return runs whose worker stopped heartbeating to ``ready``, bumping their generation so
    the stalled worker's late writes are fenced out."""
    cutoff = now - lease
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT cleat.reap_expired_leases(%s, %s)", [cutoff, now])
            return int(cursor.fetchone()[0])
    with transaction.atomic():
        return WorkflowInstance.objects.filter(
            status=Status.RUNNING, heartbeat_at__lt=cutoff
        ).update(
            status=Status.READY,
            assigned_to=None,
            generation=F("generation") + 1,
            next_wake_at=now,
        )


def next_due_at(task_queues: Sequence[str], tenant: uuid.UUID | None = None) -> datetime | None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT cleat.next_due_at(%s, %s)", [list(task_queues), tenant])
            value = cursor.fetchone()[0]
            return value if isinstance(value, datetime) else None
    query = WorkflowInstance.objects.filter(
        status=Status.READY, task_queue__in=list(task_queues), next_wake_at__isnull=False
    )
    if tenant is not None:
        query = query.filter(tenant_id=tenant)
    return query.order_by("next_wake_at").values_list("next_wake_at", flat=True).first()


__all__ = [
    "Claim",
    "FenceLost",
    "Finalized",
    "LoadedRun",
    "Q",
    "claim_ready_instances",
    "finalize_segment",
    "heartbeat_worker",
    "load_run",
    "load_wasm",
    "next_due_at",
    "reap_expired_leases",
    "release",
    "terminate_instance",
]
