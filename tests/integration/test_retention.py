"""Retention (workflows/retention.py): the policies, the purge, start-key expiry, the API and
the command.

The big test purges finished runs (seeded with bulk inserts; 10,000 here, to keep the suite
fast on a shared machine; ``bench/purge_bench.py`` runs the same test with 100,000 and prints
the figure) while a worker runs other workflows, on whichever database the suite is pointed
at (PostgreSQL as the application role, under row-level security): nothing that has not
ended is touched, nothing an unfinished run needs goes, and no row is left pointing at a
deleted run.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, models
from django.test import Client
from django.utils import timezone

from engine.services import Services
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from workflows import definitions, retention, services
from workflows.executor import set_services
from workflows.models import (
    ApiKey,
    AuditLog,
    ConcurrencyKey,
    Invocation,
    Promise,
    RetentionPolicy,
    Role,
    RunStatus,
    Signal,
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    WorkflowState,
)
from workflows.tenancy import of_tenant, tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)

# bench/purge_bench.py sets 100,000 (the issue's figure).
BIG = int(os.environ.get("CLEAT_RETENTION_TEST_RUNS", "10000"))
DAY = timedelta(days=1)


def live_workflow() -> bytes:
    """Sleeps, calls a service, finishes: a run with a few segments."""
    w = Wat()
    w.run(
        f"""
    (drop (call $durable_sleep (i64.const 20)))
    (call $rec (call $durable_call {w.s("svc")} {w.s("echo")} {w.input()}))
    (call $finish)"""
    )
    return w.wasm()


@pytest.fixture
def echo() -> Iterator[FakeService]:
    service = FakeService({"echo": lambda request: {"echo": request}})
    set_services(Services.from_settings({"svc": service}))
    yield service
    set_services(None)


@pytest.fixture
def definition(tenant: Tenant) -> WorkflowDefinition:
    return definitions.deploy_definition(tenant, "live", live_workflow())


def seed_runs(
    tenant: Tenant,
    definition: WorkflowDefinition,
    count: int,
    *,
    status: str = RunStatus.DONE,
    age: timedelta = 60 * DAY,
    events: int = 2,
    **fields: Any,
) -> list[uuid.UUID]:
    """``count`` runs that ended ``age`` ago, each with ``events`` events, by bulk inserts."""
    ended = timezone.now() - age
    ids = [uuid.uuid4() for _ in range(count)]
    with tenant_context(tenant.id):
        for start in range(0, count, 5000):
            chunk = ids[start : start + 5000]
            WorkflowInstance.objects.bulk_create(
                [
                    WorkflowInstance(
                        id=i,
                        tenant=tenant,
                        workflow_id=fields.get("workflow_id", str(i)),
                        definition=definition,
                        definition_name=definition.name,
                        definition_version=definition.version,
                        status=status,
                        input="null",
                        result="1" if status == RunStatus.DONE else None,
                        next_wake_at=None,
                        event_count=events,
                        created_at=ended - timedelta(minutes=5),
                        completed_at=None if status not in retention.TERMINAL_STATUSES else ended,
                        **{k: v for k, v in fields.items() if k != "workflow_id"},
                    )
                    for i in chunk
                ],
                batch_size=2000,
            )
            WorkflowEvent.objects.bulk_create(
                [
                    WorkflowEvent(
                        tenant=tenant,
                        instance_id=i,
                        step=step,
                        type_code=1,
                        payload="{}",
                        timestamp_ms=0,
                        checksum="x",
                    )
                    for i in chunk
                    for step in range(events)
                ],
                batch_size=2000,
            )
    return ids


def analyze() -> None:
    """Fresh planner statistics after the bulk inserts, as autovacuum keeps them on a live
    PostgreSQL (without them it plans the purge's queries for tables of one row). Only the
    tables' owner may ANALYZE: the suite runs as the application role."""
    if connection.vendor != "postgresql":
        return
    import psycopg

    params = {
        k: v
        for k, v in connection.get_connection_params().items()
        if k in ("host", "port", "dbname")
    }
    with psycopg.connect(**params, user="postgres", autocommit=True) as owner:
        owner.execute("ANALYZE")


def give_everything(tenant: Tenant, run_ids: list[uuid.UUID]) -> None:
    """A row in every table a run owns or leaves behind, for each of ``run_ids``."""
    with tenant_context(tenant.id):
        runs = list(
            of_tenant(WorkflowInstance, tenant.id)
            .filter(id__in=run_ids)
            .values_list("id", "workflow_id")
        )
        Signal.objects.bulk_create(
            [Signal(tenant=tenant, instance_id=i, name="go") for i, _ in runs]
        )
        Promise.objects.bulk_create(
            [Promise(tenant=tenant, instance_id=i, id=f"p-{i}", name="p") for i, _ in runs]
        )
        UpdateRequest.objects.bulk_create(
            [UpdateRequest(tenant=tenant, instance_id=i, name="u") for i, _ in runs]
        )
        Invocation.objects.bulk_create(
            [
                Invocation(
                    tenant=tenant,
                    instance_id=i,
                    id=f"v-{i}",
                    service="svc",
                    operation="echo",
                    request="{}",
                    idempotency_key="k",
                    deliver_at=timezone.now() - DAY,
                    delivered_at=timezone.now() - DAY,
                    status=Invocation.State.DELIVERED,
                )
                for i, _ in runs
            ]
        )
        workflow_ids = sorted({w for _, w in runs})
        ConcurrencyKey.objects.bulk_create(
            [ConcurrencyKey(tenant=tenant, key=f"lock-{w}", holder=w) for w in workflow_ids]
        )
        WorkflowState.objects.bulk_create(
            [
                WorkflowState(tenant=tenant, scope=f"wf:{w}", key="k", value="1")
                for w in workflow_ids
            ]
        )
        AuditLog.objects.bulk_create(
            [AuditLog(tenant=tenant, instance_id=i, action="retry", operator="t") for i, _ in runs]
        )


def rows_of(tenant: Tenant, model: type[models.Model], **where: Any) -> int:
    with tenant_context(tenant.id):
        return of_tenant(model, tenant.id).filter(**where).count()


def orphans(tenant: Tenant) -> list[str]:
    """Every row, in every table of both apps, that points at a run (or a workflow id) that no
    longer exists."""
    found = []
    with tenant_context(tenant.id):
        runs = of_tenant(WorkflowInstance, tenant.id)
        run_ids = set(runs.values_list("id", flat=True))
        workflow_ids = set(runs.values_list("workflow_id", flat=True))
        for model in [
            *apps.get_app_config("workflows").get_models(),
            *apps.get_app_config("schedules").get_models(),
        ]:
            for f in model._meta.concrete_fields:
                if f.is_relation and f.related_model is WorkflowInstance:
                    pointing = model._default_manager.filter(**{f"{f.name}__isnull": False})
                    missing = pointing.exclude(**{f"{f.attname}__in": run_ids}).count()
                    if missing:
                        found.append(f"{model.__name__}.{f.name}: {missing}")
        holders = set(of_tenant(ConcurrencyKey, tenant.id).values_list("holder", flat=True))
        if holders - workflow_ids:
            found.append(f"ConcurrencyKey.holder: {len(holders - workflow_ids)}")
        scopes = {
            s[3:]
            for s in of_tenant(WorkflowState, tenant.id).values_list("scope", flat=True)
            if s.startswith("wf:")
        }
        if scopes - workflow_ids:
            found.append(f"WorkflowState.scope: {len(scopes - workflow_ids)}")
        lost = of_tenant(Invocation, tenant.id).filter(instance__isnull=True).count()
        if lost:
            found.append(f"Invocation without its run: {lost}")
    return found


def start_worker() -> tuple[Worker, threading.Thread]:
    worker = Worker(
        WorkerOptions(
            worker_id="retention-test",
            concurrency=1 if connection.vendor == "sqlite" else 2,
            poll_interval_s=0.05,
        )
    )
    thread = threading.Thread(target=worker.run, name="retention-worker")
    thread.start()
    return worker, thread


def test_purging_many_finished_runs_beside_a_worker_touches_nothing_running(
    tenant: Tenant, definition: WorkflowDefinition, echo: FakeService, settings: Any
) -> None:
    settings.CLEAT_PURGE_INTERVAL_SECONDS = 0  # this test's purge is the only one
    old = seed_runs(tenant, definition, BIG - 3000)
    old += seed_runs(tenant, definition, 1000, status=RunStatus.FAILED, events=1)
    old += seed_runs(tenant, definition, 1000, status=RunStatus.TERMINATED, events=3)
    old += seed_runs(tenant, definition, 1000, status=RunStatus.DEAD_LETTERED, age=100 * DAY)
    with_everything = old[:500] + old[-500:]
    give_everything(tenant, with_everything)

    # What must stay: recent ends, dead-lettered runs younger than 90 days, ...
    kept = seed_runs(tenant, definition, 50, age=DAY)
    kept += seed_runs(tenant, definition, 50, status=RunStatus.DEAD_LETTERED, age=40 * DAY)
    # ... a parent whose child has not ended, and the child ...
    (parent,) = seed_runs(tenant, definition, 1)
    kept += [parent, *seed_runs(tenant, definition, 1, status=RunStatus.PAUSED, parent_id=parent)]
    # ... a run with a service call still to deliver ...
    (owing,) = seed_runs(tenant, definition, 1)
    with tenant_context(tenant.id):
        Invocation.objects.create(
            tenant=tenant,
            instance_id=owing,
            id="owed",
            service="svc",
            operation="echo",
            request="{}",
            idempotency_key="k",
            deliver_at=timezone.now() + 365 * DAY,
        )
    kept.append(owing)
    # ... and a run continued by one that has not ended: their shared workflow id keeps its
    # state and locks, the ended predecessor goes.
    (predecessor,) = seed_runs(tenant, definition, 1, workflow_id="chain")
    (successor,) = seed_runs(
        tenant,
        definition,
        1,
        status=RunStatus.PAUSED,
        workflow_id="chain",
        continued_from_id=predecessor,
    )
    old.append(predecessor)
    kept.append(successor)
    give_everything(tenant, [predecessor, successor])

    analyze()
    live = [services.start_workflow(tenant, "live", json.dumps({"n": n}))[0].id for n in range(20)]
    worker, thread = start_worker()
    lines: list[str] = []
    try:
        began = time.monotonic()
        report = retention.purge(progress=lines.append)
        print(f"purged {len(old)} runs in {time.monotonic() - began:.1f}s", flush=True)
        began = time.monotonic()
        deadline = timezone.now() + timedelta(seconds=60)
        while timezone.now() < deadline and rows_of(
            tenant, WorkflowInstance, id__in=live, status=RunStatus.DONE
        ) < len(live):
            threading.Event().wait(0.1)
    finally:
        print(f"the live runs ended {time.monotonic() - began:.1f}s later", flush=True)
        worker.stop()
        thread.join(timeout=60)

    with tenant_context(tenant.id):
        runs = of_tenant(WorkflowInstance, tenant.id)
        assert set(runs.values_list("id", flat=True)) == {*kept, *live}
        # The live runs ran to the end, their histories whole.
        for run in runs.filter(id__in=live):
            assert run.status == RunStatus.DONE, (run.status, run.error)
            assert json.loads(run.result)[0][1] == json.dumps(
                {"echo": json.loads(run.input)}, separators=(",", ":")
            )
            assert of_tenant(WorkflowEvent, tenant.id).filter(instance=run).count() == (
                run.event_count
            )
        # What was kept kept all it owns.
        for run in runs.filter(id__in=kept):
            assert of_tenant(WorkflowEvent, tenant.id).filter(instance=run).count() == 2
        assert of_tenant(WorkflowState, tenant.id).filter(scope="wf:chain").count() == 1
        assert of_tenant(ConcurrencyKey, tenant.id).filter(holder="chain").count() == 1
        assert runs.get(id=successor).continued_from_id is None
        assert not runs.filter(purge_batch__isnull=False).exists()
        # The audit rows outlive the runs (they have their own retention), unlinked.
        assert of_tenant(AuditLog, tenant.id).filter(instance__isnull=True).count() == 1001
    assert orphans(tenant) == []

    n = len(old)
    assert report.counts[retention.RUNS] == n
    assert report.counts[WorkflowEvent._meta.db_table] == 2 * (n - 3000) + 1000 + 3000 + 2000
    for model in (Signal, Promise, UpdateRequest, Invocation, ConcurrencyKey, WorkflowState):
        assert report.counts[model._meta.db_table] == len(with_everything) + (
            0 if model in (ConcurrencyKey, WorkflowState) else 1
        ), model
    assert any(f"{n - 1000}/{n - 1000} deleted" in line for line in lines), lines[-3:]
    assert echo.ops() == ["echo"] * len(live)


def test_dry_run_counts_what_a_purge_deletes_and_deletes_nothing(
    tenant: Tenant, definition: WorkflowDefinition
) -> None:
    ids = seed_runs(tenant, definition, 30)
    give_everything(tenant, ids[:5])
    before = rows_of(tenant, WorkflowEvent)

    dry = retention.purge(tenant=tenant, dry_run=True, batch=7)
    assert rows_of(tenant, WorkflowEvent) == before
    assert rows_of(tenant, WorkflowInstance) == 30

    real = retention.purge(tenant=tenant, batch=7)
    assert dry.counts == real.counts
    assert real.counts[retention.RUNS] == 30
    assert rows_of(tenant, WorkflowInstance) == 0
    assert orphans(tenant) == []


def test_a_large_history_is_deleted_in_batches_of_at_most_1000_rows(
    tenant: Tenant, definition: WorkflowDefinition, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_runs(tenant, definition, 2, events=2500)
    deleted: list[int] = []
    real_delete = retention._delete

    def counting(rows: Any) -> int:
        count = real_delete(rows)
        deleted.append(count)
        return count

    monkeypatch.setattr(retention, "_delete", counting)
    retention.purge(tenant=tenant)
    assert sum(deleted) == 5000 and max(deleted) <= retention.BATCH
    assert rows_of(tenant, WorkflowEvent) == 0


def test_policies_tenant_and_definition_overrides_and_off(
    tenant: Tenant, other_tenant: Tenant, definition: WorkflowDefinition
) -> None:
    other_definition = definitions.deploy_definition(tenant, "other", live_workflow())
    forty = seed_runs(tenant, definition, 3, age=40 * DAY)
    forty_other = seed_runs(tenant, other_definition, 3, age=40 * DAY)
    with tenant_context(tenant.id):
        # The tenant keeps finished runs 50 days, "live" runs 10 days, dead-lettered forever.
        RetentionPolicy.objects.create(tenant=tenant, finished_days="50", dead_lettered_days="off")
        RetentionPolicy.objects.create(tenant=tenant, definition_name="live", finished_days="10")
    dead = seed_runs(tenant, definition, 2, status=RunStatus.DEAD_LETTERED, age=400 * DAY)

    report = retention.purge(tenant=tenant)
    with tenant_context(tenant.id):
        left = set(of_tenant(WorkflowInstance, tenant.id).values_list("id", flat=True))
    assert left == {*forty_other, *dead}
    assert report.counts[retention.RUNS] == len(forty)

    # The flags replace every policy for one call; 0 purges every finished run now.
    retention.purge(tenant=tenant, finished_days=0)
    assert rows_of(tenant, WorkflowInstance) == 2
    retention.purge(tenant=tenant, dead_lettered_days="0")
    assert rows_of(tenant, WorkflowInstance) == 0
    with pytest.raises(ValueError, match="finished_days"):
        retention.purge(finished_days="soon")


def test_a_run_being_purged_or_its_child_cannot_be_reopened(
    tenant: Tenant, definition: WorkflowDefinition
) -> None:
    (parent,) = seed_runs(tenant, definition, 1, status=RunStatus.DEAD_LETTERED)
    (child,) = seed_runs(tenant, definition, 1, status=RunStatus.FAILED, parent_id=parent)
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=parent).update(purge_batch="interrupted")
    with pytest.raises(services.Conflict, match="being deleted by the retention purge"):
        services.retry_workflow(tenant, str(parent))
    with pytest.raises(services.Conflict, match=r"parent .* is being deleted"):
        services.retry_workflow(tenant, str(child))
    # A purge finishes what an interrupted one began, even inside the retention period.
    retention.purge(tenant=tenant, finished_days="off", dead_lettered_days="off")
    assert rows_of(tenant, WorkflowInstance) == 1
    assert orphans(tenant) == []


def test_start_idempotency_keys_expire_after_their_time_to_live(
    tenant: Tenant, definition: WorkflowDefinition, settings: Any
) -> None:
    settings.CLEAT_RETAIN_START_KEYS_DAYS = "7"
    first, created = services.start_workflow(tenant, "live", "1", idempotency_key="order-1")
    again, created_again = services.start_workflow(tenant, "live", "1", idempotency_key="order-1")
    assert created and not created_again and again.id == first.id

    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=first.id).update(created_at=timezone.now() - 8 * DAY)
    fresh, created = services.start_workflow(tenant, "live", "1", idempotency_key="order-1")
    assert created and fresh.id != first.id
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.get(id=first.id).start_idempotency_key is None

    # The purge clears expired keys of runs it keeps (this one has not ended).
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=fresh.id).update(created_at=timezone.now() - 8 * DAY)
    report = retention.purge(tenant=tenant)
    assert report.counts[retention.START_KEYS] == 1
    assert rows_of(tenant, WorkflowInstance, start_idempotency_key__isnull=False) == 0
    assert rows_of(tenant, WorkflowInstance, id=fresh.id) == 1

    # 'off' keeps them forever.
    settings.CLEAT_RETAIN_START_KEYS_DAYS = "off"
    kept, _ = services.start_workflow(tenant, "live", "1", idempotency_key="order-2")
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=kept.id).update(created_at=timezone.now() - 999 * DAY)
    assert services.start_workflow(tenant, "live", "1", idempotency_key="order-2")[0].id == kept.id


def test_service_calls_and_audit_rows_have_their_own_retention(
    tenant: Tenant, definition: WorkflowDefinition, settings: Any
) -> None:
    settings.CLEAT_RETAIN_SERVICE_KEYS_DAYS = "5"
    settings.CLEAT_RETAIN_AUDIT_DAYS = "20"
    now = timezone.now()
    with tenant_context(tenant.id):
        for name, status, when in (
            ("old-delivered", Invocation.State.DELIVERED, now - 6 * DAY),
            ("old-failed", Invocation.State.FAILED, now - 6 * DAY),
            ("new-delivered", Invocation.State.DELIVERED, now - 4 * DAY),
            ("old-pending", Invocation.State.PENDING, now - 60 * DAY),
        ):
            Invocation.objects.create(
                tenant=tenant,
                id=name,
                service="svc",
                operation="echo",
                request="{}",
                idempotency_key=name,
                deliver_at=when,
                delivered_at=when if status == Invocation.State.DELIVERED else None,
                status=status,
            )
        for age in (30, 10):
            AuditLog.objects.create(
                tenant=tenant, action="x", operator="t", created_at=now - age * DAY
            )
    retention.purge(tenant=tenant)
    with tenant_context(tenant.id):
        assert set(of_tenant(Invocation, tenant.id).values_list("id", flat=True)) == {
            "new-delivered",
            "old-pending",
        }
        assert of_tenant(AuditLog, tenant.id).count() == 1


def test_purge_of_one_tenant_leaves_the_others(
    tenant: Tenant, other_tenant: Tenant, definition: WorkflowDefinition
) -> None:
    theirs = definitions.deploy_definition(other_tenant, "live", live_workflow())
    seed_runs(tenant, definition, 3)
    seed_runs(other_tenant, theirs, 4)
    retention.purge(tenant=other_tenant)
    assert (rows_of(tenant, WorkflowInstance), rows_of(other_tenant, WorkflowInstance)) == (3, 0)
    retention.purge()
    assert rows_of(tenant, WorkflowInstance) == 0


# --- the command ---------------------------------------------------------------------------------


def test_the_purge_command_prints_per_table_and_refuses_bad_input(
    tenant: Tenant, definition: WorkflowDefinition
) -> None:
    seed_runs(tenant, definition, 3, age=DAY)
    out = io.StringIO()
    call_command("purge", "--dry-run", "--finished-days", "0", stdout=out)
    text = out.getvalue()
    assert "workflows_workflowinstance  would delete 3" in text
    assert "workflows_workflowevent     would delete 6" in text
    assert rows_of(tenant, WorkflowInstance) == 3

    out = io.StringIO()
    call_command("purge", "--tenant", tenant.name, "--finished-days", "0", stdout=out)
    assert "finished runs: 3/3 deleted" in out.getvalue()
    assert "workflows_workflowinstance  deleted 3" in out.getvalue()
    assert rows_of(tenant, WorkflowInstance) == 0

    with pytest.raises(CommandError, match="--finished-days must be a number of days"):
        call_command("purge", "--finished-days", "-1")
    with pytest.raises(CommandError, match="unknown tenant"):
        call_command("purge", "--tenant", "nobody")
    out = io.StringIO()
    call_command("purge", stdout=out)
    assert "nothing to purge" in out.getvalue()


# --- the worker's duty ---------------------------------------------------------------------------


def test_the_worker_purges_as_a_periodic_duty(
    tenant: Tenant, definition: WorkflowDefinition, settings: Any
) -> None:
    from workflows import duties

    assert "retention" in duties.registered()
    context = duties.WorkerContext("w", None, 1.0)
    settings.CLEAT_PURGE_INTERVAL_SECONDS = 0
    assert retention.worker_duty(context) is None
    settings.CLEAT_PURGE_INTERVAL_SECONDS = 3600
    duty = retention.worker_duty(context)
    assert duty is not None
    now = timezone.now()
    assert duty.seconds_until_due(now) == pytest.approx(retention.FIRST_PURGE_DELAY_S, abs=1)
    seed_runs(tenant, definition, 4)
    assert duty.run_due(now) is False  # not yet due
    assert duty.run_due(now + timedelta(seconds=61)) is True
    duty.join(timeout=60)
    assert duty.last_report is not None and duty.last_report.counts[retention.RUNS] == 4
    assert duty.seconds_until_due(now + timedelta(seconds=61)) == pytest.approx(3600, abs=1)
    assert rows_of(tenant, WorkflowInstance) == 0


# --- the API -------------------------------------------------------------------------------------


def api(tenant: Tenant, role: str = Role.ADMIN) -> Client:
    with tenant_context(tenant.id):
        _, key = ApiKey.issue(tenant, f"retention-{role}", role)
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def test_api_reads_and_replaces_the_policy(tenant: Tenant) -> None:
    client = api(tenant)
    body = client.get("/api/v1/retention").json()
    assert body["defaults"] == {
        "finished_days": 30,
        "dead_lettered_days": 90,
        "start_keys_days": 30,
        "service_keys_days": 30,
        "audit_days": 365,
    }
    assert body["tenant"]["finished_days"] is None and body["definitions"] == {}

    put = client.put(
        "/api/v1/retention",
        {
            "finished_days": 7,
            "audit_days": "off",
            "definitions": {"orders": {"finished_days": "off", "start_keys_days": 1}},
        },
        content_type="application/json",
    )
    assert put.status_code == 200, put.content
    body = put.json()
    assert body["effective"]["finished_days"] == 7 and body["effective"]["audit_days"] == "off"
    assert body["definitions"]["orders"]["policy"]["finished_days"] == "off"
    assert body["definitions"]["orders"]["effective"] == {
        "finished_days": "off",
        "dead_lettered_days": 90,
        "start_keys_days": 1,
    }
    policies = retention.tenant_policies(tenant.id)
    assert policies.for_definition("orders").finished is None
    assert policies.for_definition("billing").finished == 7
    assert rows_of(tenant, AuditLog, action="retention_policy") == 1

    # PUT replaces: what is left out inherits again.
    assert client.put("/api/v1/retention", {}, content_type="application/json").status_code == 200
    assert retention.tenant_policies(tenant.id).definitions == {}


@pytest.mark.parametrize(
    ("document", "field"),
    [
        ({"finished_days": -1}, "finished_days"),
        ({"audit_days": "forever"}, "audit_days"),
        ({"finished_days": True}, "finished_days"),
        ({"finished_dayz": 3}, "finished_dayz"),
        ({"definitions": {"orders": {"audit_days": 3}}}, "definitions.orders.audit_days"),
        ({"definitions": {"orders": {"finished_days": "x"}}}, "definitions.orders.finished_days"),
        ({"definitions": {"bad name!": {}}}, "definitions.bad name!"),
    ],
)
def test_api_bad_policy_is_a_400_naming_the_field(
    tenant: Tenant, document: dict[str, Any], field: str
) -> None:
    response = api(tenant).put("/api/v1/retention", document, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert rows_of(tenant, RetentionPolicy) == 0


def test_api_changing_the_policy_needs_the_admin_role(tenant: Tenant) -> None:
    client = api(tenant, Role.OPERATOR)
    assert client.get("/api/v1/retention").status_code == 200
    response = client.put("/api/v1/retention", {}, content_type="application/json")
    assert response.status_code == 403


# --- the admin -----------------------------------------------------------------------------------


def test_the_admin_saves_policies_with_an_audit_row_and_refuses_bad_values(tenant: Tenant) -> None:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("ret", "ret@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    url = "/admin/workflows/retentionpolicy/add/"
    fields = {
        "definition_name": "",
        "finished_days": "7",
        "dead_lettered_days": "off",
        "start_keys_days": "",
        "service_keys_days": "",
        "audit_days": "",
    }
    assert client.post(url, fields).status_code == 302
    assert retention.tenant_policies(tenant.id).tenant.finished == 7
    assert retention.tenant_policies(tenant.id).tenant.dead_lettered is None
    assert rows_of(tenant, AuditLog, action="retention_policy") == 1

    refused = client.post(url, {**fields, "definition_name": "orders", "audit_days": "3"})
    assert refused.status_code == 200 and b"kept per tenant" in refused.content
    refused = client.post(url, {**fields, "definition_name": "orders", "finished_days": "soon"})
    assert refused.status_code == 200 and b"number of days" in refused.content
    assert rows_of(tenant, RetentionPolicy) == 1

    # A second row for the same scope is a form error, not a failed insert.
    assert client.post(url, {**fields, "definition_name": "orders"}).status_code == 302
    for name in ("orders", ""):
        again = client.post(url, {**fields, "definition_name": name})
        assert again.status_code == 200 and b"exists already" in again.content
    assert rows_of(tenant, RetentionPolicy) == 2
    # Editing a row keeps its own name.
    with tenant_context(tenant.id):
        row = of_tenant(RetentionPolicy, tenant.id).get(definition_name="orders")
    edited = client.post(
        f"/admin/workflows/retentionpolicy/{row.pk}/change/",
        {**fields, "definition_name": "orders", "finished_days": "3"},
    )
    assert edited.status_code == 302
    assert retention.tenant_policies(tenant.id).for_definition("orders").finished == 3
