"""The run lifecycle a worker drives: claim, load, finalize, release, heartbeat, reap.

Claims bump ``generation`` in the same statement that sets ``running`` and ``assigned_to``:
on PostgreSQL through the ``cleat.claim_instances`` definer function (``FOR UPDATE SKIP
LOCKED``, across tenants, see ``workflows/rls.py``); on MariaDB with the ORM's ``SELECT ... FOR
UPDATE SKIP LOCKED`` then an ``UPDATE``; on SQLite the single writer lock of an IMMEDIATE
transaction serialises claims.

The finalize is one fenced transaction: it appends the segment's remaining events, marks
consumed signals and answered updates, and applies the transition the run's state machine
(:mod:`engine.lifecycle`) decides -- ``done``, ``failed``, ``dead_lettered`` or ``ready`` with
``next_wake_at``, or, for continue-as-new, this run done and its successor created. Nothing
here decides a status: :func:`apply_transition` writes what the rule returned and, at a run's
end, gives back what the run holds (children closed by their policy, pending updates failed,
the workflow's locks released, the parent woken). Closes from outside (terminate,
force-complete, force-fail: :func:`close_instance`) apply the rule's transitions the same way.
When the claim is no longer current the finalize touches nothing (:class:`FenceLost`).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.models import Count, F, Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine import lifecycle
from engine.compaction import with_tail
from engine.errors import FenceLost, Refused
from engine.events import EncodedEvent, EventType, decode
from engine.faults import crash_point
from engine.session import ContinuedAsNew, Failed, SegmentResult, Suspended
from engine.status import AbiStatus
from engine.storage import RunRef
from engine.versions import move_refusal
from workflows.conf import compact_after_events
from workflows.crypto import open_column, seal_column, seal_json_column
from workflows.models import (
    TERMINAL_STATUSES,
    ConcurrencyKey,
    RunStatus,
    Signal,
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    checkpoint_state,
)
from workflows.store import compaction, group_commit, task_calls, wake
from workflows.store.columns import INSTANCE_COLUMNS, LOCKED_COLUMNS, create_run
from workflows.store.group_commit import contiguous
from workflows.store.sql import array_literal, queries
from workflows.store.storage import (
    LoadedInterrupts,
    append_locked,
    client_side_binding,
    held_by,
    lock_fenced_instance,
    take_lock,
)
from workflows.tenancy import of_tenant, tenant_context

log = logging.getLogger("cleat.store")


def wait_recheck() -> timedelta:
    return timedelta(seconds=float(getattr(settings, "CLEAT_WAIT_RECHECK_SECONDS", 3600)))


# How long a run's rows read with its claim (claim_ready_instances(load=True)) stand in for
# its load: a run that waited longer for a thread (the claimed-ahead queue) is read again.
PRELOAD_FRESH_S = 2.0


@dataclass(frozen=True)
class Preloaded:
    """A claimed run's rows as the claim's message read them (PostgreSQL): what the
    one-message load reads for it (its instance row, or None when the load's fence did not
    match; its events; its interrupts), and when, on ``time.monotonic()``."""

    row: tuple[Any, ...] | None
    events: list[tuple[Any, ...]]
    interrupts: list[tuple[Any, ...]]
    read_at: float


@dataclass(frozen=True)
class Claim:
    id: uuid.UUID
    tenant_id: uuid.UUID
    generation: int
    # The run's load, read in the claim's message; None: not read (load_run reads it).
    preloaded: Preloaded | None = field(default=None, compare=False, repr=False)

    def ref(self, worker_id: str) -> RunRef:
        """The claim's fence for ``worker_id`` before the run is loaded (its workflow id is
        not known yet: releasing or failing it needs none)."""
        return RunRef(str(self.tenant_id), "", str(self.id), worker_id, self.generation)


class Claims(list[Claim]):
    """What a claim took. ``next_due_known``: the claim's own message also read when the
    next run it left falls due (``next_due``; None: no ready run waits for a time), which the
    worker's sleep would otherwise ask for (:func:`next_due_at`)."""

    next_due: datetime | None = None
    next_due_known: bool = False


@dataclass(frozen=True)
class LoadedRun:
    claim: Claim
    worker_id: str
    instance: WorkflowInstance
    definition_id: int
    sha256: str
    max_history_length: int
    history: list[EncodedEvent]
    # The oldest version whose histories the definition's code can replay (min_version()).
    min_version: int = 0
    # The run's interrupts read with it, where the load is one message (PostgreSQL), for
    # the segment's DjangoStorage. None: not read.
    interrupts: LoadedInterrupts | None = None

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
    run: uuid.UUID | None = None,
    load: bool = False,
) -> list[Claim]:
    """Claim up to ``limit`` due ready runs of active tenants, taking turns between tenants
    (each one's most urgent run -- priority, then due time -- before anyone's second, the
    tenant served longest ago first) and within each tenant's running cap; bumps their
    generation. With ``run``: that run only, if it is claimable by the same rules (the
    broker dispatch's claim, ``workflows.dispatch``); nothing otherwise.

    ``load``: read the claimed runs' loads in the claim's own message where the database
    offers it (PostgreSQL, outside a transaction, client-side binding): each claim then
    carries its run's rows (``Claim.preloaded``), which :func:`load_run` takes instead of
    asking again. One round trip for the claim and every load."""
    if limit <= 0:
        return []
    sql = queries(connection)
    queues = array_literal(task_queues)  # the PostgreSQL functions' text[] argument
    args = [worker_id, queues, limit, now, tenant, default_max_running(), run]
    if load and "claim_and_load" in sql:
        due_args = [queues, tenant, limit]
        claims = _claim_and_load(sql["claim_and_load"], args, worker_id, due_args)
        if claims is not None:
            return claims
    if "claim_ready" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["claim_ready"], args)
            return [
                Claim(uuid.UUID(str(i)), uuid.UUID(str(t)), int(g)) for i, t, g in cursor.fetchall()
            ]
    if "claim_ready_listed" in sql and run is None:  # SQL Server, untested: no SQL Server in CI
        queues = ", ".join(["%s"] * len(task_queues))
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                sql["claim_ready_listed"].format(queues=queues),
                [now, *task_queues, limit, worker_id, now, now],
            )
            return [
                Claim(uuid.UUID(str(i)), uuid.UUID(str(t)), int(g)) for i, t, g in cursor.fetchall()
            ]
    with transaction.atomic():
        ids = _fair_turns(task_queues, limit, now, tenant, run)
        if not ids:
            return []
        WorkflowInstance.objects.filter(id__in=ids).update(
            status=RunStatus.RUNNING,
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


def _claim_and_load(
    statement: str, args: list[Any], worker_id: str, due_args: list[Any]
) -> Claims | None:
    """The claim and its runs' loads in one message (``claim_and_load``, sql/postgresql.py):
    the claims, each with its rows, and when the claim took fewer runs than it could, when
    the next one falls due (``due_args``: the queues, the tenant, the claim's limit); None
    where one message cannot carry them (inside a transaction -- the message must be a
    transaction of its own -- or with server-side binding)."""
    conn = connections[DEFAULT_DB_ALIAS]  # once: each read through the proxy looks it up
    if not group_commit.outside_transaction(conn):
        return None
    with conn.cursor() as cursor:
        if not client_side_binding(cursor):
            return None
        cursor.execute(statement, [*args, worker_id, worker_id, *due_args])
        claimed = cursor.fetchall()
        cursor.nextset()
        rows = _in_model_order(cursor, cursor.fetchall())
        cursor.nextset()
        events = cursor.fetchall()
        cursor.nextset()
        interrupts = cursor.fetchall()
        cursor.nextset()
        next_due = cursor.fetchall()
    read_at = time.monotonic()
    by_id: dict[str, tuple[Any, ...]] = {str(row[_ID_COLUMN]): row for row in rows}
    events_of: dict[str, list[tuple[Any, ...]]] = {}
    for run_id, *event in events:
        events_of.setdefault(str(run_id), []).append(tuple(event))
    interrupts_of: dict[str, list[tuple[Any, ...]]] = {}
    for run_id, *interrupt in interrupts:
        interrupts_of.setdefault(str(run_id), []).append(tuple(interrupt))
    claims = Claims()
    for i, t, g, *_ in claimed:
        key = str(i)
        preloaded = Preloaded(
            by_id.get(key), events_of.get(key, []), interrupts_of.get(key, []), read_at
        )
        claims.append(Claim(uuid.UUID(key), uuid.UUID(str(t)), int(g), preloaded))
    if next_due:  # no row: the claim was full, and the loop claims again without sleeping
        claims.next_due = _due_time(next_due[0][0])
        claims.next_due_known = True
    return claims


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
    task_queues: Sequence[str],
    limit: int,
    now: datetime,
    tenant: uuid.UUID | None,
    run: uuid.UUID | None = None,
) -> list[uuid.UUID]:
    """The claim's choice on MariaDB and SQLite, as ``cleat.claim_instances`` makes it on
    PostgreSQL (migration 0005): per active tenant with due runs, its most urgent ones up to
    its room under the running cap (locked, SKIP LOCKED where the database has it); then
    every tenant's first before anyone's second, the tenant served longest ago first."""
    due = WorkflowInstance.objects.filter(
        status=RunStatus.READY, next_wake_at__lte=now, task_queue__in=list(task_queues)
    )
    if tenant is not None:
        due = due.filter(tenant_id=tenant)
    if run is not None:
        due = due.filter(id=run)
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
            status=RunStatus.RUNNING, tenant_id__in=[t for t, *_ in tenants]
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
    """Read what the segment needs; None if the claim already moved on. A claim that
    carries its run's rows (read with it, less than PRELOAD_FRESH_S ago) is loaded from
    them."""
    preloaded = claim.preloaded
    if (
        preloaded is not None
        and preloaded.row is not None
        and time.monotonic() - preloaded.read_at <= PRELOAD_FRESH_S
    ):
        interrupts = LoadedInterrupts(preloaded.interrupts, preloaded.read_at)
        return _loaded_from_rows(claim, worker_id, preloaded.row, preloaded.events, interrupts)
    done, loaded = _load_in_one_message(claim, worker_id)
    if done:
        return loaded
    with tenant_context(claim.tenant_id):
        found = (
            WorkflowInstance.objects.select_related("definition")
            .defer("definition__wasm")
            .filter(held_by(worker_id), id=claim.id, generation=claim.generation)
            .order_by()[:1]
        )
        instance = next(iter(found), None)
        if instance is None:
            return None
        definition = {
            "id": instance.definition.id,
            "sha256": instance.definition.sha256,
            "max_history_length": instance.definition.max_history_length,
            "min_version": instance.definition.min_version,
        }
        history = WorkflowEvent.history(
            instance.tenant_id, instance.id, checkpoint=instance.compaction_state
        )
    return LoadedRun(
        claim,
        worker_id,
        instance,
        definition["id"],
        definition["sha256"],
        definition["max_history_length"],
        history,
        definition["min_version"],
    )


_ID_COLUMN = INSTANCE_COLUMNS.attnames.index("id")
# What a load's first statement returns, in the order _loaded_from_rows reads it: the run's
# columns in the model's order, then its definition's.
_LOADED_NAMES = (
    *(f.column.encode() for f in INSTANCE_COLUMNS.fields),
    b"sha256",
    b"max_history_length",
    b"min_version",
)
# For each order of names a load's first statement came in: what picks them in _LOADED_NAMES'.
_loaded_orders: dict[tuple[bytes, ...], Callable[[Sequence[Any]], tuple[Any, ...]]] = {}


def _in_model_order(cursor: Any, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The rows of a load's first statement (PostgreSQL: the run's row whole, ``(l.i).*``,
    in the table's column order) in ``_LOADED_NAMES``' order, by the names of the result's
    columns (read from libpq's result: ``cursor.description`` builds an object for each
    column, about 50 µs). A name the result lacks raises: the table and the model disagree."""
    result = cursor.cursor.pgresult
    names = tuple(result.fname(i) for i in range(result.nfields))
    pick = _loaded_orders.get(names)
    if pick is None:
        missing = [n.decode() for n in _LOADED_NAMES if n not in names]
        if missing:
            raise DatabaseError(f"the run's load returned no column {', '.join(missing)}")
        pick = itemgetter(*(names.index(n) for n in _LOADED_NAMES))
        _loaded_orders[names] = pick
    return [pick(row) for row in rows]


def _load_in_one_message(claim: Claim, worker_id: str) -> tuple[bool, LoadedRun | None]:
    """:func:`load_run` in one round trip: (True, its answer) on PostgreSQL outside a
    transaction with client-side binding; (False, None) where that does not apply."""
    conn = connections[DEFAULT_DB_ALIAS]
    load_sql = queries(conn).get("load_run")
    if load_sql is None or not group_commit.outside_transaction(conn):
        return False, None
    fence = [str(claim.tenant_id), str(claim.id), claim.generation, worker_id]
    with conn.cursor() as cursor:
        if not client_side_binding(cursor):
            return False, None
        read_at = time.monotonic()
        cursor.execute(load_sql, [*fence, *fence, str(claim.tenant_id), str(claim.id)])
        found = _in_model_order(cursor, cursor.fetchall())
        row = found[0] if found else None
        cursor.nextset()
        events = cursor.fetchall()
        cursor.nextset()
        interrupts = LoadedInterrupts(cursor.fetchall(), read_at)
        if row is None:
            return True, None
        return True, _loaded_from_rows(claim, worker_id, row, events, interrupts)


def _loaded_from_rows(
    claim: Claim,
    worker_id: str,
    row: Sequence[Any],
    events: Sequence[Sequence[Any]],
    interrupts: LoadedInterrupts,
) -> LoadedRun:
    """The loaded run from the one-message load's rows (or the claim's, which are the same):
    the instance's columns then its definition's, its events (step, type, time, payload,
    checksum) and its interrupts."""
    columns = len(INSTANCE_COLUMNS.fields)
    instance = INSTANCE_COLUMNS.instance(row[:columns])
    sha256, max_history_length, min_version = row[columns:]
    rows = [
        EncodedEvent(
            step,
            code,
            ts,
            open_column(WorkflowEvent, "payload", claim.tenant_id, (claim.id, step), payload) or "",
            checksum,
        )
        for step, code, ts, payload, checksum in events
    ]
    # The checkpoint came with the instance's row: the history is it, then the rows.
    history = with_tail(checkpoint_state(instance.compaction_state), rows)
    return LoadedRun(
        claim,
        worker_id,
        instance,
        instance.definition_id,
        sha256,
        max_history_length,
        history,
        min_version,
        interrupts,
    )


def pinned_plugin_versions(tenant: uuid.UUID, definition_id: int) -> dict[str, str]:
    """The plugin versions a definition's dependencies resolved to at deploy."""
    with tenant_context(tenant):
        pinned = (
            WorkflowDefinition.objects.filter(id=definition_id)
            .values_list("plugin_versions", flat=True)
            .first()
        )
    return dict(pinned or {})


def load_wasm(tenant: uuid.UUID, definition_id: int) -> bytes:
    """The bytes of ``tenant``'s definition ``definition_id`` (the worker and the console's
    replay read them only when the module is not in memory: ``WasmRuntime.load_once``)."""
    with tenant_context(tenant):
        return bytes(
            of_tenant(WorkflowDefinition, tenant)
            .filter(id=definition_id)
            .values_list("wasm", flat=True)
            .get()
        )


@dataclass(frozen=True)
class Finalized:
    status: str
    successor: str | None = None


def finalize_segment(ref: RunRef, result: SegmentResult, now: datetime | None = None) -> Finalized:
    """Persist a segment's outcome in one fenced transaction (see the module docstring):
    the transition :func:`engine.lifecycle.after_segment` decides, applied."""
    now = now or timezone.now()
    tenant = uuid.UUID(ref.tenant_id)
    # A crash as the finalize starts or inside its transaction: nothing of it commits.
    crash_point("finalize")
    if _complete_in_one_message(tenant, ref, result, now):
        return Finalized(RunStatus.DONE)
    if _wait_in_one_message(tenant, ref, result, now):
        return Finalized(RunStatus.READY)
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
                result=seal_column(
                    UpdateRequest, "result", instance.tenant_id, (instance.id,), applied.payload
                ),
                completed_at=now,
            )
        instance.query_state = result.query_state
        instance.assigned_to = None
        outcome = result.outcome
        arrived = isinstance(outcome, Suspended) and wake.wakeup_arrived(
            instance, outcome.wait.as_dict()
        )
        state = lifecycle.RunState(
            instance.workflow_id, instance.definition_version, instance.attempt, arrived
        )
        transition = lifecycle.after_segment(outcome, state, _policy(instance, outcome), _ms(now))
        if not transition.ended:
            # A run that goes on is loaded again: fold its prefix now, under this fence.
            compaction.fold_locked(instance)
        successor = apply_transition(instance, transition, now)
    return Finalized(instance.status, str(successor.id) if successor else None)


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _at(ms: int, now: datetime) -> datetime:
    """The moment of ``ms`` (``now`` itself when it is now: no rounding to the millisecond)."""
    if ms == _ms(now):
        return now
    return datetime.fromtimestamp(ms / 1000, tz=now.tzinfo)


def _policy(instance: WorkflowInstance, outcome: object) -> lifecycle.RunPolicy:
    if not isinstance(outcome, Failed):
        return _wait_policy()
    return lifecycle.RunPolicy(
        retry=instance.definition.retry_policy, wait_recheck_ms=_wait_policy().wait_recheck_ms
    )


def _wait_policy() -> lifecycle.RunPolicy:
    """The policy of an outcome that is not a failure: the store's recheck of waiting runs
    (no retry policy: the definition is not read)."""
    return lifecycle.RunPolicy(wait_recheck_ms=int(wait_recheck().total_seconds() * 1000))


def apply_transition(
    instance: WorkflowInstance, transition: lifecycle.Transition, now: datetime
) -> WorkflowInstance | None:
    """Apply a transition of :mod:`engine.lifecycle` to a locked ``instance`` and save it;
    on a run's end, give back what it holds. Returns the successor it started, if any."""
    if (
        transition.successor is not None
        and transition.successor.version != instance.definition_version
    ):
        transition = _checked_successor(instance, transition)
    instance.status = transition.status
    instance.waiting_on = transition.waiting_on
    instance.result = transition.result
    instance.error, instance.error_code = transition.error, transition.error_code
    if transition.attempt is not None:
        instance.attempt = transition.attempt
    if transition.status == RunStatus.READY:
        instance.next_wake_at = (
            _at(transition.wake_at_ms, now) if transition.wake_at_ms is not None else None
        )
    else:
        instance.next_wake_at = None
    if transition.ended:
        instance.completed_at = now
    if transition.forget_failed_call:
        forget_failed_call(instance)
    successor = _successor(instance, transition.successor, now) if transition.successor else None
    # The finalize's locked row (all but the checkpoint): the columns that changed, by a
    # statement built once (store.columns); any other instance through the ORM.
    LOCKED_COLUMNS.save(instance)
    if transition.release_locks_of is not None:
        ConcurrencyKey.objects.filter(
            tenant_id=instance.tenant_id, holder=transition.release_locks_of
        ).delete()
    if transition.ended:
        if transition.status != RunStatus.DONE:
            # A segment completes only after all its calls returned; any other end may
            # leave task calls out (a failure in replay, a close from outside).
            task_calls.abandon(instance)
        _close_children(instance, now)
        _fail_pending_updates(instance, transition.updates_failure, now)
        # Its parent, or the run that started it detached: either may await it.
        waker = instance.parent_id or instance.detached_from
        if waker:
            wake.after_commit(instance.tenant_id, waker)
    if (
        instance.status == RunStatus.READY
        and instance.next_wake_at
        and instance.next_wake_at <= now
    ):
        wake.ready_after_commit(instance.tenant_id, instance.id)
    return successor


def _complete_in_one_message(
    tenant: uuid.UUID, ref: RunRef, result: SegmentResult, now: datetime
) -> bool:
    """The finalize of a completed run in one round trip (``finalize_done``, whose comment
    in sql/postgresql.py says when it applies and why it is safe). True when it was
    done; False when it does not apply or matched nothing (nothing was written then)."""
    entry = completion_entry(tenant, ref, result, now)
    if entry is None:
        return False
    run, rows = entry
    # The answer is the run its end wakes: its parent, or the run that started it detached.
    matched, waker = _in_one_call(ref, run, rows, group_commit.finalize, group_commit.finalize_runs)
    if not matched:
        return False
    if waker is not None:
        wake.after_commit(tenant, waker)  # committed already: runs at once
    return True


def _wait_in_one_message(
    tenant: uuid.UUID, ref: RunRef, result: SegmentResult, now: datetime
) -> bool:
    """The finalize of a suspended run in one round trip (``finalize_wait``, whose comment
    in sql/postgresql.py says what it does and why it is safe). True when it was done;
    False when it does not apply or matched nothing (nothing was written then: the general
    path below tells the cases apart -- a fence that moved, a fold of the history due).

    It applies to a suspension that consumed no signal and answered no update, with
    consecutive events, on PostgreSQL outside a transaction. The rule's transition
    (:func:`engine.lifecycle.suspension`) is taken both ways -- with and without an arrival
    -- and must differ only in when the run is due; the function's read under the lock
    chooses."""
    outcome = result.outcome
    if (
        not isinstance(outcome, Suspended)
        or result.consumed_signals
        or result.applied_updates
        or not contiguous(result.new_events)
    ):
        return False
    conn = connections[DEFAULT_DB_ALIAS]
    if "finalize_wait" not in queries(conn) or not group_commit.outside_transaction(conn):
        return False
    now_ms, policy = _ms(now), _wait_policy()
    waiting = lifecycle.suspension(outcome, policy, now_ms, False)
    arrived = lifecycle.suspension(outcome, policy, now_ms, True)
    if (
        replace(arrived, wake_at_ms=waiting.wake_at_ms) != waiting
        or waiting.ended
        or waiting.successor is not None
        or waiting.forget_failed_call
        or waiting.release_locks_of is not None
    ):
        return False
    run_id = (ref.run_id,)
    run, rows = group_commit.finalize_entry(
        tenant,
        ref,
        result.new_events,
        now,
        {
            "status": waiting.status,
            "attempt": waiting.attempt,
            "waiting_on": None if waiting.waiting_on is None else json.dumps(waiting.waiting_on),
            "result": seal_column(WorkflowInstance, "result", tenant, run_id, waiting.result),
            "error": seal_column(WorkflowInstance, "error", tenant, run_id, waiting.error),
            "error_code": waiting.error_code,
            "query_state": json.dumps(
                seal_json_column(
                    WorkflowInstance, "query_state", tenant, run_id, result.query_state
                )
            ),
            "updated_at": timezone.now().isoformat(),  # as auto_now writes it
            "wake_at": _iso(waiting.wake_at_ms, now),
            "wake_at_arrived": _iso(arrived.wake_at_ms, now),
            # the history's fold is the general path's (compaction.fold_locked): the
            # function writes nothing when one is due
            "fold_at": compact_after_events(),
            **wake.wait_sources(waiting.waiting_on or {}),  # what cleat.wakeup_arrived reads
        },
    )
    matched, due = _in_one_call(ref, run, rows, group_commit.suspend, group_commit.finalize_waits)
    if not matched:
        return False
    if due is not None and due <= now:
        wake.ready_after_commit(tenant, ref.run_id)  # committed already: sent at once
    return True


def _in_one_call(
    ref: RunRef,
    run: dict[str, Any],
    rows: list[dict[str, Any]],
    shared: Callable[[RunRef, dict[str, Any], list[dict[str, Any]]], tuple[bool, Any] | None],
    alone: Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]],
) -> tuple[bool, Any]:
    """A one-call finalize of ``ref``'s run: above the group commit's rate ``shared`` with
    the process's other runs of its kind in one statement (group_commit.finalize,
    group_commit.suspend), else ``alone``. (Whether it matched, what the function answered
    for it.)"""
    written = shared(ref, run, rows)
    if written is None:
        answers = alone([run], rows)
        written = (ref.run_id in answers, answers.get(ref.run_id))
    return written


def _iso(ms: int | None, now: datetime) -> str | None:
    return None if ms is None else _at(ms, now).isoformat()


def completion_entry(
    tenant: uuid.UUID, ref: RunRef, result: SegmentResult, now: datetime
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A completed segment's run and remaining events as ``finalize_done`` takes them
    (:func:`group_commit.finalize_entry`): the transition
    :func:`engine.lifecycle.completion` returns, sealed. None when the one-call finalize
    does not apply: not a completion, a consumed signal or an answered update to write, not
    PostgreSQL, inside a transaction, or events that do not follow one another."""
    done = lifecycle.completion(result.outcome, ref.workflow_id)
    conn = connections[DEFAULT_DB_ALIAS]  # once: each read through the proxy looks it up
    if (
        done is None
        or result.consumed_signals
        or result.applied_updates
        or "finalize_done" not in queries(conn)
        or not group_commit.outside_transaction(conn)
        or not contiguous(result.new_events)
    ):
        return None
    return group_commit.finalize_entry(
        tenant,
        ref,
        result.new_events,
        now,
        {
            "status": done.status,
            "updated_at": timezone.now().isoformat(),  # as auto_now writes it
            "result": seal_column(WorkflowInstance, "result", tenant, (ref.run_id,), done.result),
            "query_state": json.dumps(
                seal_json_column(
                    WorkflowInstance, "query_state", tenant, (ref.run_id,), result.query_state
                )
            ),
            "lock_holder": done.release_locks_of,
            "updates_result": seal_column(
                UpdateRequest, "result", tenant, (ref.run_id,), done.updates_failure
            ),
        },
    )


# Operator annotations (admin actions) recorded after a run's last guest step.
_ANNOTATION_CODES = frozenset({EventType.ADMIN_ACTION.code})


def _last_guest_event(instance: WorkflowInstance) -> WorkflowEvent | None:
    """The run's last event that is a guest step (the audit events of earlier retries and
    other operator actions come after it), or None."""
    for stored in WorkflowEvent.objects.filter(instance_id=instance.id).order_by("-step")[:100]:
        if stored.type_code not in _ANNOTATION_CODES:
            return stored
    return None


def plan_retry(
    instance: WorkflowInstance, mode: str = lifecycle.RETRY_REPLAY
) -> lifecycle.RetryPlan:
    """What retrying ``instance`` in ``mode`` will do (``engine.lifecycle.retry_plan`` on
    its last guest step)."""
    last = _last_guest_event(instance)
    if last is None or last.type_code not in lifecycle.RETRIED_CALL_CODES:
        return lifecycle.retry_plan(None, mode)
    event = decode(
        EncodedEvent(last.step, last.type_code, last.timestamp_ms, last.payload, last.checksum)
    )
    return lifecycle.retry_plan(event, mode)


def retake_locks(instance: WorkflowInstance, now: datetime) -> str | None:
    """Re-take the locks ``instance``'s history holds (``engine.lifecycle.locks_held``) before
    an operator reopens it: its end released them, and its replay answers ``acquire_lock``
    from the history. Returns the refusal when another workflow holds one now (nothing is
    taken then: the caller's transaction rolls back), None when all are taken again."""
    # The whole history: a lock taken in the compacted prefix is held too.
    events = [
        decode(e)
        for e in WorkflowEvent.history(instance.tenant_id, instance.id)
        if e.type_code in lifecycle.LOCK_CODES
    ]
    now_ms = int(now.timestamp() * 1000)
    for lock in lifecycle.locks_held(events, now_ms):
        expires = (
            datetime.fromtimestamp(lock.expires_ms / 1000, tz=UTC)
            if lock.expires_ms is not None
            else None
        )
        if not take_lock(instance.tenant_id, lock.key, instance.workflow_id, expires, now):
            holder = (
                ConcurrencyKey.objects.filter(tenant_id=instance.tenant_id, key=lock.key)
                .values_list("holder", flat=True)
                .first()
            )
            return (
                f"lock {lock.key!r}, which the run's history holds, is held by workflow "
                f"{holder}; retry once it is released"
            )
    return None


def forget_failed_call(
    instance: WorkflowInstance, mode: str = lifecycle.RETRY_REPLAY
) -> int | None:
    """Delete the run's last call when a retry in ``mode`` executes it again.

    Replay is deterministic: a retried run that replayed the recorded failure would fail the
    same way forever. Forgetting that one step makes the retry call the service again (an
    automatic retry at the same step, so with the same idempotency key; a retry from the
    dead-letter queue after the operator's audit event). Which step is forgotten is
    ``engine.lifecycle.retry_plan``'s rule; operator annotations recorded after it (an
    earlier retry's) go with it, so the history stays contiguous (the audit log keeps
    them). Returns the forgotten step, if any."""
    step = plan_retry(instance, mode).forgets_step
    if step is None:
        return None
    WorkflowEvent.objects.filter(instance_id=instance.id, step__gte=step).delete()
    instance.event_count = step
    WorkflowInstance.objects.filter(id=instance.id).update(event_count=step)
    return step


def _checked_successor(
    instance: WorkflowInstance, transition: lifecycle.Transition
) -> lifecycle.Transition:
    """Continue-as-new to another version: the transition as decided when the target may
    take the run over (:func:`engine.versions.move_refusal`), else the run fails with the
    first incompatibility (or that the version is not deployed)."""
    assert transition.successor is not None
    target_version = transition.successor.version
    target = WorkflowDefinition.objects.filter(
        tenant_id=instance.tenant_id, name=instance.definition_name, version=target_version
    ).first()
    refusal = move_refusal(
        instance.definition_name,
        instance.definition.deployed_version,
        target.deployed_version if target is not None else None,
        target_version,
        entry_point=instance.entry_point,
    )
    if refusal is None:
        return transition
    code, message = refusal
    return lifecycle.successor_refused(instance.workflow_id, code.value, message)


def _successor(
    instance: WorkflowInstance, spec: lifecycle.Successor, now: datetime
) -> WorkflowInstance:
    definition = instance.definition
    if spec.version != instance.definition_version:
        definition = WorkflowDefinition.objects.get(
            tenant_id=instance.tenant_id, name=instance.definition_name, version=spec.version
        )
    successor = create_run(
        tenant_id=instance.tenant_id,
        workflow_id=instance.workflow_id,
        definition=definition,
        definition_name=definition.name,
        definition_version=definition.version,
        entry_point=instance.entry_point,
        input=spec.input,
        priority=instance.priority,
        task_queue=instance.task_queue,
        parent_id=instance.parent_id,
        detached_from=instance.detached_from,
        parent_close_policy=instance.parent_close_policy,
        allowed_signals=instance.allowed_signals,
        continued_from=instance,
        trace_id=instance.trace_id,
        trace_parent=instance.trace_parent,
        next_wake_at=now,
        created_at=now,
    )
    # Signals that reached this run unconsumed belong to the chain: move them on.
    Signal.objects.filter(instance_id=instance.id, consumed_at__isnull=True).update(
        instance_id=successor.id
    )
    crash_point("continue_as_new")  # the successor written, the finalize not committed
    wake.ready_after_commit(instance.tenant_id, successor.id, inserted=True)
    return successor


def _close_children(parent: WorkflowInstance, now: datetime) -> None:
    """Apply each open child's parent-close policy (:func:`engine.lifecycle.child_close`)."""
    children = list(
        WorkflowInstance.objects.filter(parent_id=parent.id).exclude(status__in=TERMINAL_STATUSES)
    )
    for child in children:  # the common case: none, in one query
        close = lifecycle.child_close(child.parent_close_policy, str(parent.id))
        if close is None:
            continue
        if close.action == "terminate":
            terminate_instance(child, close.reason, now)
        else:
            WorkflowInstance.objects.filter(id=child.id).update(
                cancel_requested=True, cancel_reason=close.reason
            )
            wake.after_commit(parent.tenant_id, child.id)


def _fail_pending_updates(instance: WorkflowInstance, reason: str, now: datetime) -> None:
    UpdateRequest.objects.filter(
        instance_id=instance.id, status=UpdateRequest.State.PENDING
    ).update(
        status=UpdateRequest.State.FAILED,
        result=seal_column(UpdateRequest, "result", instance.tenant_id, (instance.id,), reason),
        completed_at=now,
    )


def close_instance(
    instance: WorkflowInstance, action: str, transition: lifecycle.Transition, now: datetime
) -> None:
    """Close a run from outside its segment (terminate, force-complete, force-fail), whoever
    holds it: the generation bump fences out its worker. Applies the transition as a
    finalize does (children's close policy, pending updates, locks, the parent's wake-up).
    Raises :class:`Refused` when ``action`` does not apply to the run's status."""
    refusal = lifecycle.close_refusal(action, instance.status)
    if refusal is not None:
        raise Refused(AbiStatus.PERMANENT, f"run {instance.id} is {refusal}")
    WorkflowInstance.objects.filter(id=instance.id).update(
        generation=F("generation") + 1, assigned_to=None
    )
    instance.refresh_from_db()
    apply_transition(instance, transition, now)
    if transition.status == RunStatus.DONE:  # force-complete: the others abandon above
        task_calls.abandon(instance)


def terminate_instance(instance: WorkflowInstance, reason: str, now: datetime) -> None:
    close_instance(instance, "terminate", lifecycle.terminate(instance.workflow_id, reason), now)


def release(ref: RunRef, now: datetime | None = None, delay_s: float = 0.0) -> bool:
    """Give a claimed run back untouched (shutdown, or a host failure around its segment),
    due again after ``delay_s``."""
    now = now or timezone.now()
    with tenant_context(uuid.UUID(ref.tenant_id)):
        released = WorkflowInstance.objects.filter(
            held_by(ref.worker_id), id=ref.run_id, generation=ref.generation
        ).update(
            status=RunStatus.READY, assigned_to=None, next_wake_at=now + timedelta(seconds=delay_s)
        )
    return released == 1


def heartbeat_worker(worker_id: str, now: datetime) -> int:
    """Renew every lease this worker holds. Deliberately not per-generation (one statement
    for all runs); each write of a segment is fenced on its own."""
    sql = queries(connection)
    if "heartbeat_worker" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["heartbeat_worker"], [worker_id, now])
            return int(cursor.fetchone()[0])
    return WorkflowInstance.objects.filter(assigned_to=worker_id, status=RunStatus.RUNNING).update(
        heartbeat_at=now
    )


def reap_expired_leases(lease: timedelta, now: datetime) -> int:
    """Return runs whose worker stopped heartbeating to ``ready``, bumping their generation so
    the stalled worker's late writes are fenced out."""
    cutoff = now - lease
    sql = queries(connection)
    if "reap_expired_leases" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["reap_expired_leases"], [cutoff, now])
            return int(cursor.fetchone()[0])
    with transaction.atomic():
        return WorkflowInstance.objects.filter(
            status=RunStatus.RUNNING, heartbeat_at__lt=cutoff
        ).update(
            status=RunStatus.READY,
            assigned_to=None,
            generation=F("generation") + 1,
            next_wake_at=now,
        )


def next_due_at(task_queues: Sequence[str], tenant: uuid.UUID | None = None) -> datetime | None:
    sql = queries(connection)
    if "next_due_at" in sql:
        with connection.cursor() as cursor:
            cursor.execute(sql["next_due_at"], [array_literal(task_queues), tenant])
            return _due_time(cursor.fetchone()[0])
    query = WorkflowInstance.objects.filter(
        status=RunStatus.READY, task_queue__in=list(task_queues), next_wake_at__isnull=False
    )
    if tenant is not None:
        query = query.filter(tenant_id=tenant)
    return query.order_by("next_wake_at").values_list("next_wake_at", flat=True).first()


def _due_time(value: Any) -> datetime | None:
    """What ``cleat.next_due_at`` returned, as a time (NULL: no ready run waits for one)."""
    return value if isinstance(value, datetime) else None


__all__ = [
    "Claim",
    "Claims",
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


def database_now() -> datetime | None:
    """The database server's clock, or None where the dialect has no statement for it (SQLite:
    one machine, whose clock the worker reads anyway)."""
    sql = queries(connection).get("database_now")
    if sql is None:
        return None
    with connection.cursor() as cursor:
        cursor.execute(sql)
        found = cursor.fetchone()[0]
    if timezone.is_naive(found):  # MySQL / MariaDB: UTC_TIMESTAMP() is naive
        found = timezone.make_aware(found, UTC)
    return found  # type: ignore[no-any-return]
