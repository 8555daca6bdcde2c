"""Retention: how long each kind of data is kept (the policy), and the purge that applies it.

The policy: ``CLEAT_RETAIN_*`` settings (days, or ``off`` to keep forever), overridden per
tenant by its ``RetentionPolicy`` row with no definition name, and per definition by a row
naming it (what a row leaves empty it inherits). Finished runs, dead-lettered runs and start
idempotency keys follow a definition's policy; service calls and audit rows the tenant's.

The purge, tenant by tenant and each tenant's work inside its tenant context (so it works
under PostgreSQL's row-level security as the application role: the tenant list itself is
readable by it), in transactions of at most :data:`BATCH` rows each:

1. **Runs past their retention.** A transaction takes up to :data:`BATCH` runs that ended
   (``done``, ``failed``, ``terminated``; ``dead_lettered`` on its own clock) before the
   cutoff, locks them, leaves out any with a child that has not ended or a service call not
   yet delivered, and marks them with a batch token (``purge_batch``). Later transactions
   delete what the marked runs
   own, table by table, at most :data:`BATCH` rows each (events, signals, promises, updates,
   delivered service calls), unlink what outlives them (their audit rows, the
   ``parent``/``continued_from`` links of runs kept), remove the locks and the workflow-scoped
   state of each workflow id no run is left with, and last delete the runs. A purge that
   stops half-way leaves runs marked; the next one finishes those batches first.

   Deleting what a run owns takes several transactions, so for a moment a run exists with
   part of its history. The mark is what makes that safe: an operator's retry or re-replay
   refuses a run being purged (or the child of one), so nothing ever replays half a history.
   Workers never touch an ended run; the claim and the reaper look at ready and running ones.

2. **Start idempotency keys** older than their time to live are cleared (the run stays; a new
   start with the same key then starts a new run). ``services.start_workflow`` applies the
   same time to live, so a key expires on time even between purges.
3. **Service calls** delivered (or failed for good) before the cutoff are deleted with their
   idempotency keys; a pending one is never touched.
4. **Audit rows** older than the cutoff are deleted.

Approaches dropped: deleting a run and all it owns in one transaction (a run with 50,000
events is then one long transaction holding 50,000 row locks); database-level ``ON DELETE
CASCADE`` (Django does not declare it, and the cascade would be one statement of unbounded
size anyway); deleting the run row first (its foreign keys forbid it on MariaDB).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connection, models, transaction
from django.db.models import Exists, OuterRef, Q, Value
from django.db.models.functions import Concat, Substr
from django.utils import timezone

from workflows.duties import WorkerContext
from workflows.models import (
    RETAIN_OFF,
    TERMINAL_STATUSES,
    AuditLog,
    ConcurrencyKey,
    Invocation,
    Promise,
    RetentionPolicy,
    RunStatus,
    Signal,
    Tenant,
    UpdateRequest,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowState,
)
from workflows.tenancy import of_tenant, tenant_context

log = logging.getLogger("cleat.retention")

# Most rows one transaction of the purge writes.
BATCH = 1000

# Runs that ended and will not run again unless an operator reopens them; dead-lettered
# runs wait for an operator's decision, so they have their own (longer) retention.
FINISHED_STATUSES = frozenset(TERMINAL_STATUSES - {RunStatus.DEAD_LETTERED})
DEAD_LETTERED_STATUSES = frozenset({RunStatus.DEAD_LETTERED})

# The policy's kinds, their settings, and which a definition's row may set.
KINDS = ("finished", "dead_lettered", "start_keys", "service_keys", "audit")
SETTINGS = {
    "finished": "CLEAT_RETAIN_FINISHED_DAYS",
    "dead_lettered": "CLEAT_RETAIN_DEAD_LETTERED_DAYS",
    "start_keys": "CLEAT_RETAIN_START_KEYS_DAYS",
    "service_keys": "CLEAT_RETAIN_SERVICE_KEYS_DAYS",
    "audit": "CLEAT_RETAIN_AUDIT_DAYS",
}
DEFINITION_KINDS = ("finished", "dead_lettered", "start_keys")
MAX_DAYS = 999_999


def parse_days(value: Any, name: str) -> int | None:
    """A retention period: whole days (0 or more), or ``off`` (None: keep forever). Raises
    ValueError naming ``name``."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == RETAIN_OFF:
            return None
        if text.isdigit():
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DAYS:
        raise ValueError(f"{name} must be a number of days (0-{MAX_DAYS}) or 'off', not {value!r}")
    return value


def format_days(days: int | None) -> str:
    return RETAIN_OFF if days is None else str(days)


@dataclass(frozen=True)
class Policy:
    """Days each kind is kept (None: forever)."""

    finished: int | None
    dead_lettered: int | None
    start_keys: int | None
    service_keys: int | None
    audit: int | None

    def days(self, kind: str) -> int | None:
        return getattr(self, kind)  # type: ignore[no-any-return]

    def cutoff(self, kind: str, now: datetime) -> datetime | None:
        """Data of ``kind`` older than this is purged (None: kept forever)."""
        days = self.days(kind)
        return None if days is None else now - timedelta(days=days)

    def overridden_by(self, row: RetentionPolicy) -> Policy:
        """This policy with what ``row`` sets (its empty fields inherit)."""
        changes = {}
        for kind in KINDS:
            value = getattr(row, f"{kind}_days")
            if value:
                changes[kind] = parse_days(value, f"{kind}_days")
        return replace(self, **changes)


def default_policy() -> Policy:
    """The settings' policy. A bad value is a configuration error naming the setting."""
    values = {}
    for kind, name in SETTINGS.items():
        try:
            values[kind] = parse_days(getattr(settings, name, RETAIN_OFF), name)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None
    return Policy(**values)


@dataclass(frozen=True)
class TenantPolicies:
    """A tenant's policy and its definitions' overrides."""

    tenant: Policy
    definitions: dict[str, Policy]

    def for_definition(self, name: str) -> Policy:
        return self.definitions.get(name, self.tenant)


def tenant_policies(tenant_id: uuid.UUID) -> TenantPolicies:
    base = default_policy()
    with tenant_context(tenant_id):
        rows = list(of_tenant(RetentionPolicy, tenant_id))
    for row in rows:
        if not row.definition_name:
            base = base.overridden_by(row)
    definitions = {
        row.definition_name: base.overridden_by(row) for row in rows if row.definition_name
    }
    return TenantPolicies(base, definitions)


def start_key_cutoff(tenant_id: uuid.UUID, definition_name: str, now: datetime) -> datetime | None:
    """Start idempotency keys of ``definition_name``'s runs created before this have expired."""
    return tenant_policies(tenant_id).for_definition(definition_name).cutoff("start_keys", now)


# --- the purge ----------------------------------------------------------------------------------

# How the purge reports what it deleted (or, in a dry run, would delete): one line per table.
RUNS = WorkflowInstance._meta.db_table
START_KEYS = f"{RUNS}.start_idempotency_key (cleared)"


@dataclass
class PurgeReport:
    dry_run: bool
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, rows: int) -> None:
        if rows:
            self.counts[table] = self.counts.get(table, 0) + rows


Progress = Callable[[str], None]

_UNSET: Any = object()


def purge(
    *,
    tenant: Tenant | None = None,
    dry_run: bool = False,
    finished_days: Any = _UNSET,
    dead_lettered_days: Any = _UNSET,
    now: datetime | None = None,
    batch: int = BATCH,
    progress: Progress | None = None,
) -> PurgeReport:
    """Apply the retention policies to ``tenant`` (every tenant by default). ``finished_days``
    and ``dead_lettered_days`` (days or ``off``) replace every policy's for this call."""
    overrides = {}
    if finished_days is not _UNSET:
        overrides["finished"] = parse_days(finished_days, "finished_days")
    if dead_lettered_days is not _UNSET:
        overrides["dead_lettered"] = parse_days(dead_lettered_days, "dead_lettered_days")
    if not 1 <= batch <= BATCH:
        raise ValueError(f"batch must be 1-{BATCH}, not {batch}")
    now = now or timezone.now()
    report = PurgeReport(dry_run)
    tenants = [tenant] if tenant is not None else list(Tenant.objects.order_by("name"))
    for one in tenants:
        _Purge(one, now, overrides, dry_run, batch, report, progress).run()
    return report


class _Purge:
    """The purge of one tenant."""

    def __init__(
        self,
        tenant: Tenant,
        now: datetime,
        overrides: dict[str, int | None],
        dry_run: bool,
        batch: int,
        report: PurgeReport,
        progress: Progress | None,
    ) -> None:
        policies = tenant_policies(tenant.id)
        self.policies = TenantPolicies(
            replace(policies.tenant, **overrides),
            {name: replace(p, **overrides) for name, p in policies.definitions.items()},
        )
        self.tenant = tenant
        self.now = now
        self.dry_run = dry_run
        self.batch = batch
        self.report = report
        self.progress = progress or (lambda line: None)

    def run(self) -> None:
        if not self.dry_run:
            self._finish_marked()  # what an interrupted purge left
        for kind, statuses in (
            ("finished", FINISHED_STATUSES),
            ("dead_lettered", DEAD_LETTERED_STATUSES),
        ):
            self._purge_runs(kind, statuses)
        self._clear_start_keys()
        self._purge_rows(
            "service calls",
            Invocation,
            lambda cutoff: (
                Q(status=Invocation.State.DELIVERED, delivered_at__lt=cutoff)
                | Q(status=Invocation.State.FAILED, deliver_at__lt=cutoff)
            ),
            self.policies.tenant.cutoff("service_keys", self.now),
        )
        self._purge_rows(
            "audit rows",
            AuditLog,
            lambda cutoff: Q(created_at__lt=cutoff),
            self.policies.tenant.cutoff("audit", self.now),
        )

    def _say(self, line: str) -> None:
        self.progress(f"tenant {self.tenant.name}: {line}")

    # -- which rows --

    def _by_definition(self, kind: str) -> Q | None:
        """Rows of runs whose definition's policy for ``kind`` puts them past its cutoff
        (None: every definition keeps them forever)."""
        parts = []
        named = list(self.policies.definitions)
        default = self.policies.tenant.cutoff(kind, self.now)
        if default is not None:
            parts.append(Q(created_at__lt=default) & ~Q(definition_name__in=named))
        for name, policy in self.policies.definitions.items():
            cutoff = policy.cutoff(kind, self.now)
            if cutoff is not None:
                parts.append(Q(definition_name=name, created_at__lt=cutoff))
        if not parts:
            return None
        found = parts[0]
        for part in parts[1:]:
            found |= part
        return found

    def _eligible_runs(self, kind: str, statuses: Iterable[str]) -> models.QuerySet[Any] | None:
        """Runs of ``statuses`` that ended before their cutoff, have no child that has not
        ended and no service call still to deliver."""
        window = self._by_definition(kind)
        if window is None:
            return None
        # The same windows, on the end time instead of the start time.
        ended = _on_field(window, "created_at", "completed_at")
        open_child = WorkflowInstance.objects.filter(parent_id=OuterRef("pk")).exclude(
            status__in=TERMINAL_STATUSES
        )
        undelivered = Invocation.objects.filter(
            instance_id=OuterRef("pk"), status=Invocation.State.PENDING
        )
        return (
            of_tenant(WorkflowInstance, self.tenant.id)
            .filter(ended, status__in=list(statuses), completed_at__isnull=False)
            .filter(~Exists(open_child), ~Exists(undelivered))
        )

    # -- runs --

    def _purge_runs(self, kind: str, statuses: frozenset[str]) -> None:
        label = f"{kind.replace('_', '-')} runs"
        with tenant_context(self.tenant.id):
            eligible = self._eligible_runs(kind, statuses)
            if eligible is None:
                return
            total = eligible.filter(purge_batch__isnull=True).count()
            if not total:
                return
            if self.dry_run:
                self._count_owned(eligible)
                self._say(f"{label}: {total} would be deleted")
                return
        done = 0
        while True:
            batch, taken = self._mark(eligible, statuses)
            if not taken:
                break
            self._delete_batch(batch)
            done += taken
            self._say(f"{label}: {done}/{total} deleted")

    def _mark(self, eligible: models.QuerySet[Any], statuses: frozenset[str]) -> tuple[str, int]:
        """Take up to a batch of eligible runs: lock them, mark them with a new batch token
        and re-check them under the lock, in one transaction. Returns the token and how many
        runs it took (0: none left)."""
        skip_locked = connection.features.has_select_for_update_skip_locked
        batch = uuid.uuid4().hex
        runs = of_tenant(WorkflowInstance, self.tenant.id)
        with tenant_context(self.tenant.id):
            candidates = list(
                eligible.filter(purge_batch__isnull=True)
                .order_by("completed_at")
                .select_for_update(skip_locked=skip_locked)
                .values_list("id", flat=True)[: self.batch]
            )
            if not candidates:
                return batch, 0
            taken = runs.filter(
                id__in=candidates, status__in=list(statuses), purge_batch__isnull=True
            ).update(purge_batch=batch)
            # Under the locks: a child reopened (or a call queued) since the read above keeps
            # its parent. A reopen locks the parent first, so it cannot slip in between.
            marked = runs.filter(purge_batch=batch).values("pk")
            keep = set(
                runs.filter(parent_id__in=marked)
                .exclude(status__in=TERMINAL_STATUSES)
                .values_list("parent_id", flat=True)
            ) | set(
                of_tenant(Invocation, self.tenant.id)
                .filter(instance_id__in=marked, status=Invocation.State.PENDING)
                .values_list("instance_id", flat=True)
            )
            if keep:
                taken -= runs.filter(id__in=keep, purge_batch=batch).update(purge_batch=None)
        return batch, taken

    def _finish_marked(self) -> None:
        """Finish the batches an interrupted purge (or one running beside this) began."""
        while True:
            with tenant_context(self.tenant.id):
                batch = (
                    of_tenant(WorkflowInstance, self.tenant.id)
                    .filter(purge_batch__isnull=False)
                    .values_list("purge_batch", flat=True)
                    .first()
                )
            if batch is None:
                return
            self._delete_batch(batch)
            self._say("finished a batch an earlier purge had begun")

    def _owned(self, runs: Q) -> list[tuple[str, models.QuerySet[Any]]]:
        """What the runs matching ``runs`` (a condition on the run) own, table by table."""
        t = self.tenant.id
        # IN (subquery) rather than a join: each table is then read by its instance index.
        ids = of_tenant(WorkflowInstance, t).filter(runs).values("pk")
        return [
            (model._meta.db_table, of_tenant(model, t).filter(instance_id__in=ids))
            for model in (WorkflowEvent, Signal, Promise, UpdateRequest, Invocation)
        ]

    def _left_behind(self, runs: Q) -> list[tuple[str, models.QuerySet[Any]]]:
        """The locks and workflow-scoped state of the workflow ids of the runs matching
        ``runs`` that no other run has. Only rows from before this purge began: a new run
        reusing a workflow id writes its own, which stay."""
        t = self.tenant.id
        batch_runs = of_tenant(WorkflowInstance, t).filter(runs)
        workflow_ids = batch_runs.values("workflow_id")
        scopes = batch_runs.annotate(scope=Concat(Value("wf:"), "workflow_id")).values("scope")
        others = of_tenant(WorkflowInstance, t).exclude(runs)
        return [
            (
                ConcurrencyKey._meta.db_table,
                of_tenant(ConcurrencyKey, t).filter(
                    ~Exists(others.filter(workflow_id=OuterRef("holder"))),
                    holder__in=workflow_ids,
                    acquired_at__lt=self.now,
                ),
            ),
            (
                WorkflowState._meta.db_table,
                of_tenant(WorkflowState, t).filter(
                    # workflow_id = the scope without "wf:", so the workflow id index serves.
                    ~Exists(others.filter(workflow_id=Substr(OuterRef("scope"), 4))),
                    scope__in=scopes,
                    updated_at__lt=self.now,
                ),
            ),
        ]

    def _count_owned(self, eligible: models.QuerySet[Any]) -> None:
        """A dry run's counts: what deleting ``eligible`` would delete."""
        runs = Q(pk__in=eligible.values("pk"))
        for table, rows in [*self._owned(runs), *self._left_behind(runs)]:
            self.report.add(table, rows.count())
        self.report.add(RUNS, eligible.count())

    def _delete_batch(self, batch: str) -> None:
        """Delete the runs marked ``batch`` and all they own."""
        t = self.tenant.id
        runs = Q(purge_batch=batch)
        steps: list[_Step] = [_Step(table, rows) for table, rows in self._owned(runs)]
        # What outlives the runs no longer points at them (the foreign keys' SET_NULL).
        marked = of_tenant(WorkflowInstance, t).filter(runs).values("pk")
        steps += [
            _Step(None, rows, {column: None})
            for rows, column in (
                (of_tenant(AuditLog, t).filter(instance_id__in=marked), "instance"),
                (of_tenant(WorkflowInstance, t).filter(parent_id__in=marked), "parent"),
                (
                    of_tenant(WorkflowInstance, t).filter(continued_from_id__in=marked),
                    "continued_from",
                ),
            )
        ]
        steps += [_Step(table, rows) for table, rows in self._left_behind(runs)]
        steps.append(_Step(RUNS, of_tenant(WorkflowInstance, t).filter(runs), runs=True))
        self._apply(steps)

    def _apply(self, steps: list[_Step]) -> None:
        """Run ``steps`` in order, in as few transactions as hold at most a batch of rows
        each."""
        pending = list(steps)
        while pending:
            budget = self.batch
            with tenant_context(self.tenant.id):
                while pending and budget > 0:
                    step = pending[0]
                    done, finished = step.run(budget, self.batch)
                    if step.table is not None:
                        self.report.add(step.table, done)
                    if finished:
                        pending.pop(0)
                    elif not done:
                        break  # it needs a transaction of its own
                    budget -= done

    # -- keys and audit rows --

    def _clear_start_keys(self) -> None:
        window = self._by_definition("start_keys")
        if window is None:
            return
        rows = of_tenant(WorkflowInstance, self.tenant.id).filter(
            window, start_idempotency_key__isnull=False
        )
        if self.dry_run:
            with tenant_context(self.tenant.id):
                self.report.add(START_KEYS, rows.count())
            return
        cleared = 0
        while True:
            with tenant_context(self.tenant.id):
                pks = list(rows.order_by().values_list("pk", flat=True)[: self.batch])
                if not pks:
                    break
                n = WorkflowInstance.objects.filter(pk__in=pks).update(start_idempotency_key=None)
            cleared += n
            self.report.add(START_KEYS, n)
            self._say(f"start idempotency keys: {cleared} cleared")

    def _purge_rows(
        self,
        label: str,
        model: type[models.Model],
        older: Callable[[datetime], Q],
        cutoff: datetime | None,
    ) -> None:
        if cutoff is None:
            return
        rows = of_tenant(model, self.tenant.id).filter(older(cutoff))
        table = model._meta.db_table
        if self.dry_run:
            with tenant_context(self.tenant.id):
                self.report.add(table, rows.count())
            return
        before = self.report.counts.get(table, 0)
        self._apply([_Step(table, rows)])
        if self.report.counts.get(table, 0) > before:
            self._say(f"{label}: {self.report.counts[table] - before} deleted")


def _on_field(condition: Q, old: str, new: str) -> Q:
    """``condition`` with every lookup on ``old`` made on ``new``."""
    rebuilt = Q()
    rebuilt.connector, rebuilt.negated = condition.connector, condition.negated
    for child in condition.children:
        if isinstance(child, Q):
            rebuilt.children.append(_on_field(child, old, new))
        else:
            key, value = child
            if key == old or key.startswith(old + "__"):
                key = new + key[len(old) :]
            rebuilt.children.append((key, value))
    return rebuilt


@dataclass
class _Step:
    """Rows to delete (``values`` None) or to update with ``values``, a batch at a time."""

    table: str | None
    rows: models.QuerySet[Any]
    values: dict[str, Any] | None = None
    runs: bool = False  # the runs themselves: nothing points at them any more

    def run(self, limit: int, whole: int) -> tuple[int, bool]:
        """Up to ``limit`` rows (of ``whole``, a transaction's most), in the caller's
        transaction: how many it did, and whether none is left."""
        if self.runs:
            count = self.rows.count()
            if count <= limit:
                # The foreign keys would refuse the delete if anything still pointed at these
                # runs, so a plain DELETE of them (one mark's worth), without Django's
                # collector fetching each run to look for what refers to it.
                return int(self.rows._raw_delete(self.rows.db)), True
            if limit < whole:
                return 0, False  # in a transaction of their own
        pks = list(self.rows.order_by().values_list("pk", flat=True)[:limit])
        if pks:
            chosen = self.rows.model._default_manager.filter(pk__in=pks)
            done = int(chosen.update(**self.values)) if self.values is not None else _delete(chosen)
        else:
            done = 0
        return done, len(pks) < limit


def _delete(rows: models.QuerySet[Any]) -> int:
    """Delete ``rows`` (already bounded to a batch) in the caller's transaction; the count of
    rows of their own table."""
    with transaction.atomic():
        _, per_model = rows.delete()
    return per_model.get(rows.model._meta.label, 0)


# --- the worker's periodic duty ---------------------------------------------------------------

# A worker's first purge waits this long after its start (or the interval, if shorter), so a
# worker restarted often still purges, and one starting up claims runs first.
FIRST_PURGE_DELAY_S = 60.0


class PurgeDuty:
    """The purge as a periodic duty of the worker loop (workflows/duties.py): every
    ``interval_s``, in a thread of its own, so a long purge never holds up the loop's claims
    and heartbeats. A failed purge is logged; the next interval tries again."""

    def __init__(self, tenant: uuid.UUID | None, interval_s: float, now: datetime) -> None:
        self.tenant = tenant
        self.interval = timedelta(seconds=interval_s)
        self.next_at = now + min(self.interval, timedelta(seconds=FIRST_PURGE_DELAY_S))
        self._thread: threading.Thread | None = None
        self.last_report: PurgeReport | None = None

    def run_due(self, now: datetime) -> bool:
        if now < self.next_at or (self._thread is not None and self._thread.is_alive()):
            return False
        self.next_at = now + self.interval
        self._thread = threading.Thread(target=self._purge, name="cleat-purge", daemon=True)
        self._thread.start()
        return True

    def seconds_until_due(self, now: datetime) -> float:
        return max(0.0, (self.next_at - now).total_seconds())

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _purge(self) -> None:
        try:
            tenant = Tenant.objects.get(id=self.tenant) if self.tenant else None
            report = purge(tenant=tenant)
            self.last_report = report
            if report.counts:
                log.info(
                    "event=purge %s",
                    " ".join(f"{table}={rows}" for table, rows in sorted(report.counts.items())),
                )
        except Exception:
            log.exception("event=purge_error")
        finally:
            close_old_connections()
            connection.close()


def worker_duty(worker: WorkerContext) -> PurgeDuty | None:
    """The purge in every worker (registered in WorkflowsConfig.ready), unless
    CLEAT_PURGE_INTERVAL_SECONDS is 0."""
    interval = float(getattr(settings, "CLEAT_PURGE_INTERVAL_SECONDS", 3600.0))
    if interval <= 0:
        return None
    return PurgeDuty(worker.tenant, interval, timezone.now())


# --- reading and changing the policies (the API, the admin) ------------------------------------

FIELDS = tuple(f"{kind}_days" for kind in KINDS)
DEFINITION_FIELDS = tuple(f"{kind}_days" for kind in DEFINITION_KINDS)


def _shown(days: int | None) -> int | str:
    return RETAIN_OFF if days is None else days


def _stored_value(value: Any, name: str) -> str:
    """A period as the API gives it (days, ``"off"``, or null to inherit), as stored."""
    from workflows.services import InvalidInput

    if value is None or value == "":
        return ""
    try:
        return format_days(parse_days(value, name))
    except ValueError as exc:
        raise InvalidInput(str(exc), name) from None


def _row_values(row: RetentionPolicy | None, fields: tuple[str, ...]) -> dict[str, Any]:
    """A row's own settings: days, ``"off"``, or None where it inherits."""
    found: dict[str, Any] = {}
    for name in fields:
        value = getattr(row, name) if row is not None else ""
        found[name] = None if not value else _shown(parse_days(value, name))
    return found


def _effective(policy: Policy, fields: tuple[str, ...]) -> dict[str, Any]:
    return {f"{kind}_days": _shown(policy.days(kind)) for kind in KINDS if f"{kind}_days" in fields}


def describe(tenant: Tenant) -> dict[str, Any]:
    """The settings' policy, the tenant's own and its definitions' overrides, and what applies
    to each (``"off"``: kept forever)."""
    policies = tenant_policies(tenant.id)
    with tenant_context(tenant.id):
        rows = list(of_tenant(RetentionPolicy, tenant.id).order_by("definition_name"))
    tenant_row = next((r for r in rows if not r.definition_name), None)
    return {
        "defaults": _effective(default_policy(), FIELDS),
        "tenant": _row_values(tenant_row, FIELDS),
        "effective": _effective(policies.tenant, FIELDS),
        "definitions": {
            row.definition_name: {
                "policy": _row_values(row, DEFINITION_FIELDS),
                "effective": _effective(
                    policies.for_definition(row.definition_name), DEFINITION_FIELDS
                ),
            }
            for row in rows
            if row.definition_name
        },
    }


def replace_policies(tenant: Tenant, document: dict[str, Any], operator: str) -> dict[str, Any]:
    """Replace the tenant's policy and its definitions' overrides with ``document`` (the
    shape :func:`describe` gives under ``tenant`` and ``definitions.<name>.policy``: a field
    left out or null inherits; a definition left out has no override). Bad input is an
    InvalidInput naming the field; nothing is changed then. Writes an audit row."""
    from workflows.services import InvalidInput, check_name

    if not isinstance(document, dict):
        raise InvalidInput("the policy must be a JSON object", None)
    unknown = sorted(set(document) - {*FIELDS, "definitions"})
    if unknown:
        raise InvalidInput("this is not a field of the retention policy", unknown[0])
    tenant_values = {name: _stored_value(document.get(name), name) for name in FIELDS}
    definitions = document.get("definitions") or {}
    if not isinstance(definitions, dict):
        raise InvalidInput("definitions must map definition names to policies", "definitions")
    per_definition: dict[str, dict[str, str]] = {}
    for name, values in definitions.items():
        where = f"definitions.{name}"
        check_name(name, where)
        if not isinstance(values, dict):
            raise InvalidInput("a definition's policy must be a JSON object", where)
        unknown = sorted(set(values) - set(DEFINITION_FIELDS))
        if unknown:
            raise InvalidInput(
                "a definition's policy sets only finished_days, dead_lettered_days and "
                "start_keys_days (service keys and audit rows are kept per tenant)",
                f"{where}.{unknown[0]}",
            )
        per_definition[name] = {
            field_name: _stored_value(values.get(field_name), f"{where}.{field_name}")
            for field_name in DEFINITION_FIELDS
        }
    with tenant_context(tenant.id):
        rows = of_tenant(RetentionPolicy, tenant.id)
        rows.exclude(definition_name__in=["", *per_definition]).delete()
        for name, values in [("", tenant_values), *per_definition.items()]:
            RetentionPolicy.objects.update_or_create(
                tenant=tenant, definition_name=name, defaults=values
            )
        AuditLog.record(
            tenant,
            "retention_policy",
            operator,
            policy=tenant_values,
            definitions=per_definition,
        )
    return describe(tenant)


def save_policy(row: RetentionPolicy, operator: str) -> None:
    """Save one policy row (the admin's form), with its audit row."""
    from workflows.services import InvalidInput, check_name

    if row.definition_name:
        check_name(row.definition_name, "definition_name")
        for name in set(FIELDS) - set(DEFINITION_FIELDS):
            if getattr(row, name):
                raise InvalidInput("service keys and audit rows are kept per tenant", name)
    for name in FIELDS:
        setattr(row, name, _stored_value(getattr(row, name), name))
    with tenant_context(row.tenant_id):
        row.save()
        AuditLog.record(
            row.tenant,
            "retention_policy",
            operator,
            definition=row.definition_name,
            **{name: getattr(row, name) for name in FIELDS},
        )
