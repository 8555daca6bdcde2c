"""Fairness between tenants and tenant deactivation.

Claims take turns between tenants (a tenant's priorities order only its own runs), honour a
per-tenant cap on running runs, and never hand out a run of an inactive tenant. Priorities
are bounded, and an API key is held to its role's ceiling. Deactivating a tenant pauses its
runs (fencing out a segment in flight) and reactivating resumes exactly those.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from engine.services import Services
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from tests.integration.test_api_support import Api, error_of, key_for
from workflows import definitions, services
from workflows.executor import execute_claim, set_services
from workflows.models import (
    AuditLog,
    Invocation,
    Role,
    RunStatus,
    Tenant,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.store import invocations
from workflows.store.lifecycle import Claim, claim_ready_instances, release
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)


def calls(*operations: str) -> bytes:
    w = Wat()
    body = "\n".join(
        f"(call $rec (call $durable_call {w.s('svc')} {w.s(op)} {w.input()}))" for op in operations
    )
    w.run(f"{body}\n(call $finish)")
    return w.wasm()


def queue_runs(tenant: Tenant, definition: WorkflowDefinition, count: int, priority: int) -> None:
    """``count`` due runs at once (bulk, as a backlog built up over time would be)."""
    now = timezone.now()
    with tenant_context(tenant.id):
        WorkflowInstance.objects.bulk_create(
            WorkflowInstance(
                tenant=tenant,
                workflow_id=f"{tenant.name}-{n}",
                definition=definition,
                definition_name=definition.name,
                definition_version=definition.version,
                priority=priority,
                next_wake_at=now - timedelta(seconds=1),
                created_at=now - timedelta(minutes=10) + timedelta(milliseconds=n),
            )
            for n in range(count)
        )


def claim_one(worker: str = "fair") -> Claim | None:
    found = claim_ready_instances(worker, ["default"], 1, timezone.now())
    return found[0] if found else None


def status_of(tenant: Tenant, run_id: Any) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id)


@pytest.fixture
def noisy(transactional_db: Any) -> Tenant:
    return Tenant.objects.create(name="noisy")


# --- fairness -----------------------------------------------------------------------------------


def test_a_thousand_urgent_runs_of_one_tenant_do_not_starve_another(
    tenant: Tenant, noisy: Tenant
) -> None:
    """The noisy tenant queued 1,000 runs at the highest priority before the quiet tenant
    queued three at the default one: claims (one run each, as a busy worker makes them)
    alternate between the tenants, so the quiet tenant's runs go within the first claims."""
    loud = definitions.deploy_definition(noisy, "work", calls("a"))
    quiet = definitions.deploy_definition(tenant, "work", calls("a"))
    queue_runs(noisy, loud, 1000, priority=100)
    queue_runs(tenant, quiet, 3, priority=0)

    claimed = [claim_one() for _ in range(6)]
    owners = [c.tenant_id if c else None for c in claimed]
    assert owners.count(tenant.id) == 3, owners
    assert tenant.id in owners[:2], owners
    assert owners.count(noisy.id) == 3, owners
    # The claims recorded each tenant's turn.
    assert Tenant.objects.get(id=tenant.id).last_claimed_at is not None


def test_priority_orders_a_tenants_own_runs(tenant: Tenant) -> None:
    definition = definitions.deploy_definition(tenant, "work", calls("a"))
    queue_runs(tenant, definition, 2, priority=0)
    urgent, _ = services.start_workflow(tenant, "work", priority=7)
    first = claim_one()
    assert first is not None and first.id == urgent.id


def test_a_claim_over_several_queues_takes_the_most_urgent_runs_of_all_in_order(
    tenant: Tenant,
) -> None:
    """Runs in two queues, a queue named twice: one claim takes the most urgent of both
    queues together (priority, then due time, then creation: the runs due at one instant
    come in the order they were made), each once; the worker's claim (every tenant) and a
    claim of that one tenant choose the same runs; one run at a time, they come in that
    order."""
    definition = definitions.deploy_definition(tenant, "work", calls("a"))
    due = timezone.now() - timedelta(seconds=5)
    made = timezone.now() - timedelta(minutes=1)
    plan = [  # (queue, priority, due offset s, creation offset ms)
        ("q1", 0, 0, 0),
        ("q2", 5, 1, 1),
        ("q1", 5, 2, 2),
        ("q2", 0, 0, 3),
        ("q1", 0, 0, 4),
        ("other", 9, 0, 5),
    ]

    def fresh_runs() -> list[Any]:
        with tenant_context(tenant.id):
            WorkflowInstance.objects.filter(tenant=tenant).delete()
            made_runs = WorkflowInstance.objects.bulk_create(
                WorkflowInstance(
                    tenant=tenant,
                    workflow_id=f"q-{n}",
                    definition=definition,
                    definition_name=definition.name,
                    definition_version=definition.version,
                    task_queue=queue,
                    priority=priority,
                    next_wake_at=due + timedelta(seconds=offset),
                    created_at=made + timedelta(milliseconds=created),
                )
                for n, (queue, priority, offset, created) in enumerate(plan)
            )
        # priority 5 (due +1 s before +2 s), then priority 0 by due time, then creation
        return [made_runs[i].id for i in (1, 2, 0, 3, 4)]

    now = timezone.now()
    expected = fresh_runs()
    claimed = claim_ready_instances("multi", ["q1", "q2", "q1"], 4, now)
    assert sorted(c.id for c in claimed) == sorted(expected[:4])  # each once
    expected = fresh_runs()
    one_tenant = claim_ready_instances("multi", ["q2", "q1"], 4, now, tenant.id)
    assert sorted(c.id for c in one_tenant) == sorted(expected[:4])
    expected = fresh_runs()
    order = [claim_ready_instances("multi", ["q1", "q2"], 1, now)[0].id for _ in range(5)]
    assert order == expected
    assert claim_ready_instances("multi", ["q1", "q2"], 1, now) == []  # "other" is not asked


@pytest.mark.postgres_only
def test_the_workers_claim_leaves_the_callers_plan_setting_as_it_was(tenant: Tenant) -> None:
    """PostgreSQL: the worker's claim runs with a generic plan, set inside the function and
    put back, so a claim inside a caller's transaction does not change its setting."""
    from django.db import transaction

    definition = definitions.deploy_definition(tenant, "work", calls("a"))
    queue_runs(tenant, definition, 2, priority=0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        assert len(claim_ready_instances("plan", ["default"], 1, timezone.now())) == 1
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "force_custom_plan"
    with connection.cursor() as cursor:
        assert len(claim_ready_instances("plan", ["default"], 1, timezone.now())) == 1
        cursor.execute("SHOW plan_cache_mode")
        assert cursor.fetchone()[0] == "auto"


def test_claims_stop_at_the_tenants_running_cap(tenant: Tenant, noisy: Tenant) -> None:
    """A cap of 2 on the noisy tenant: a claim asking for 5 gets its 2 plus the other
    tenant's run; nothing more of it until one of its runs stops running."""
    Tenant.objects.filter(id=noisy.id).update(max_running=2)
    loud = definitions.deploy_definition(noisy, "work", calls("a"))
    quiet = definitions.deploy_definition(tenant, "work", calls("a"))
    queue_runs(noisy, loud, 10, priority=0)
    queue_runs(tenant, quiet, 1, priority=0)

    claimed = claim_ready_instances("cap", ["default"], 5, timezone.now())
    assert sorted(str(c.tenant_id) for c in claimed) == sorted(
        [str(noisy.id)] * 2 + [str(tenant.id)]
    )
    assert claim_ready_instances("cap", ["default"], 5, timezone.now()) == []
    held = next(c for c in claimed if c.tenant_id == noisy.id)
    with tenant_context(noisy.id):
        workflow_id = WorkflowInstance.objects.get(id=held.id).workflow_id
    from engine.storage import RunRef

    assert release(RunRef(str(noisy.id), workflow_id, str(held.id), "cap", held.generation))
    again = claim_ready_instances("cap", ["default"], 5, timezone.now())
    assert [c.tenant_id for c in again] == [noisy.id]


@override_settings(CLEAT_TENANT_MAX_RUNNING=1)
def test_the_default_cap_comes_from_the_settings(tenant: Tenant) -> None:
    definition = definitions.deploy_definition(tenant, "work", calls("a"))
    queue_runs(tenant, definition, 3, priority=0)
    assert len(claim_ready_instances("cap", ["default"], 3, timezone.now())) == 1


@pytest.mark.skipif(
    os.environ.get("CLEAT_TEST_DB", "sqlite") == "sqlite",
    reason="SQLite runs one segment at a time (concurrency 1): no cap below it to exceed",
)
def test_the_running_cap_holds_under_a_real_worker(tenant: Tenant) -> None:
    """A worker with four slots and a tenant capped at two: never more than two of its
    segments are inside their service call at once, and every run completes."""
    Tenant.objects.filter(id=tenant.id).update(max_running=2)
    lock = threading.Lock()
    inside = {"now": 0, "most": 0}

    def slow(request: Any) -> Any:
        with lock:
            inside["now"] += 1
            inside["most"] = max(inside["most"], inside["now"])
        time.sleep(0.15)
        with lock:
            inside["now"] -= 1
        return {"ok": True}

    set_services(Services.from_settings({"svc": FakeService({"a": slow})}))
    try:
        definition = definitions.deploy_definition(tenant, "work", calls("a"))
        queue_runs(tenant, definition, 8, priority=0)
        worker = Worker(
            WorkerOptions(worker_id="capped", concurrency=4, poll_interval_s=0.05, burst=True)
        )
        assert worker.run() == 8
    finally:
        set_services(None)
    with tenant_context(tenant.id):
        assert set(WorkflowInstance.objects.values_list("status", flat=True)) == {RunStatus.DONE}
    assert inside["most"] == 2, inside


# --- priority bounds ------------------------------------------------------------------------------


def test_priority_is_bounded_and_held_to_the_keys_role(tenant: Tenant) -> None:
    admin = Api(key_for(tenant, Role.ADMIN, "admin"))
    operator = Api(key_for(tenant, Role.OPERATOR, "operator"))
    assert admin.deploy("work", calls("a")).status_code == 201

    too_high = operator.start("work", priority=2**31 - 1)
    assert too_high.status_code == 400 and error_of(too_high)["field"] == "priority"
    above_role = operator.start("work", priority=50)
    assert above_role.status_code == 400 and error_of(above_role)["field"] == "priority"
    assert "10" in error_of(above_role)["message"], error_of(above_role)
    assert operator.start("work", priority=10).status_code == 201
    assert admin.start("work", priority=100).status_code == 201
    assert admin.start("work", priority=-100).status_code == 201
    assert admin.start("work", priority=101).status_code == 400

    with pytest.raises(services.InvalidInput) as refused:
        services.start_workflow(tenant, "work", priority=1000)
    assert refused.value.field == "priority"
    with pytest.raises(CommandError, match="priority"):
        call_command("start_workflow", "work", "--priority", "1000")


def test_a_backfill_is_bounded_per_call(tenant: Tenant) -> None:
    from schedules import services as schedule_services

    definitions.deploy_definition(tenant, "work", calls("a"))
    now = datetime(2026, 6, 1, tzinfo=UTC)
    schedule_services.create_schedule(
        tenant, now=now - timedelta(days=30), name="hourly", cron="0 * * * *", workflow_name="work"
    )
    with pytest.raises(schedule_services.InvalidInput) as refused:
        schedule_services.backfill_schedule(
            tenant, "hourly", now - timedelta(hours=150), now, now=now
        )
    assert refused.value.field == "end"
    assert "CLEAT_MAX_BACKFILL_RUNS" in refused.value.message
    with tenant_context(tenant.id):
        assert not WorkflowInstance.objects.exists()
    made = schedule_services.backfill_schedule(
        tenant, "hourly", now - timedelta(hours=50), now, now=now
    )
    assert len(made) == 51


# --- deactivation ---------------------------------------------------------------------------------


def test_deactivation_pauses_runs_and_reactivation_resumes_only_those(tenant: Tenant) -> None:
    definition = definitions.deploy_definition(tenant, "work", calls("a"))
    ready, _ = services.start_workflow(tenant, "work")
    held_by_operator, _ = services.start_workflow(tenant, "work")
    services.pause_workflow(tenant, str(held_by_operator.id), operator="admin:ops")
    running, _ = services.start_workflow(tenant, "work")
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=ready.id).update(
            next_wake_at=timezone.now() + timedelta(hours=1)
        )
    [claim] = claim_ready_instances("w1", ["default"], 1, timezone.now())
    assert claim.id == running.id
    with tenant_context(tenant.id):
        Invocation.objects.create(
            id="inv-1",
            tenant=tenant,
            service="svc",
            operation="a",
            request="{}",
            idempotency_key="k",
            deliver_at=timezone.now() - timedelta(seconds=1),
        )

    assert services.deactivate_tenant(tenant, "admin:ops", "unpaid") == 2
    for run in (ready, running, held_by_operator):
        assert status_of(tenant, run.id).status == RunStatus.PAUSED
    # The segment that was running is fenced out: its claim no longer loads.
    assert execute_claim(claim, "w1").outcome == "gone"
    # A run that reaches the queue anyway (a child started by a segment in flight) waits.
    queue_runs(tenant, definition, 1, priority=0)
    assert claim_ready_instances("w2", ["default"], 10, timezone.now()) == []
    assert invocations.claim_due(timezone.now(), 10) == []
    with pytest.raises(services.Conflict):
        services.deactivate_tenant(tenant, "admin:ops")

    assert services.reactivate_tenant(tenant, "admin:ops", "paid") == 2
    assert status_of(tenant, ready.id).status == RunStatus.READY
    assert status_of(tenant, running.id).status == RunStatus.READY
    assert status_of(tenant, held_by_operator.id).status == RunStatus.PAUSED
    assert len(claim_ready_instances("w2", ["default"], 10, timezone.now())) == 3
    assert [i for i, _ in invocations.claim_due(timezone.now(), 10)] == ["inv-1"]
    with tenant_context(tenant.id):
        audit = list(
            AuditLog.objects.filter(action__endswith="_tenant")
            .order_by("created_at")
            .values_list("action", "operator", "reason", "detail")
        )
    assert audit == [
        ("deactivate_tenant", "admin:ops", "unpaid", {"paused_runs": 2}),
        ("reactivate_tenant", "admin:ops", "paid", {"resumed_runs": 2}),
    ]


def test_deactivation_stops_a_segment_in_flight_before_its_next_call(tenant: Tenant) -> None:
    """A real worker is inside the run's first call when the tenant is deactivated: the
    second call is never made while the tenant is inactive; after reactivation the run
    completes (the unrecorded first call made again with the same idempotency key)."""
    entered, go = threading.Event(), threading.Event()

    def first(request: Any) -> Any:
        entered.set()
        assert go.wait(timeout=30), "the test never let the call finish"
        return {"first": True}

    service = FakeService({"first": first, "second": {"second": True}})
    set_services(Services.from_settings({"svc": service}))
    worker = Worker(
        WorkerOptions(
            worker_id="deact",
            concurrency=1 if connection.vendor == "sqlite" else 2,
            poll_interval_s=0.05,
        )
    )
    thread = threading.Thread(target=worker.run, name="deactivation-worker")
    try:
        definitions.deploy_definition(tenant, "two", calls("first", "second"))
        run, _ = services.start_workflow(tenant, "two", json.dumps({"n": 1}))
        thread.start()
        assert entered.wait(timeout=30), "the worker never started the segment"
        services.deactivate_tenant(tenant, "admin:ops")
        go.set()
        time.sleep(1.0)  # the worker's segment ends (fenced) and it polls on
        assert service.ops() == ["first"]
        assert status_of(tenant, run.id).status == RunStatus.PAUSED

        services.reactivate_tenant(tenant, "admin:ops")
        began = time.monotonic()
        while status_of(tenant, run.id).status != RunStatus.DONE:
            assert time.monotonic() - began < 30, status_of(tenant, run.id).status
            time.sleep(0.05)
    finally:
        go.set()
        worker.stop()
        thread.join(timeout=30)
        set_services(None)
    assert service.ops() == ["first", "first", "second"]
    assert service.calls[0].idempotency_key == service.calls[1].idempotency_key


def test_a_childs_priority_asked_for_by_a_workflow_is_held_to_the_range(tenant: Tenant) -> None:
    kid = Wat()
    kid.run("(call $finish)")
    parent = Wat()
    parent.run(
        f"""
    (call $rec (call $child_workflow_with_options {parent.s("kid")} {parent.js("x")}
        (i64.const 0) (i64.const {2**40}) {parent.s("abandon")}))
    (call $finish)"""
    )
    definitions.deploy_definition(tenant, "kid", kid.wasm())
    definitions.deploy_definition(tenant, "parent", parent.wasm())
    run, _ = services.start_workflow(tenant, "parent")
    worker = Worker(
        WorkerOptions(worker_id="kids", concurrency=1, poll_interval_s=0.05, burst=True)
    )
    assert worker.run() == 2
    assert status_of(tenant, run.id).status == RunStatus.DONE
    with tenant_context(tenant.id):
        assert list(
            WorkflowInstance.objects.filter(parent_id=run.id).values_list("priority", "status")
        ) == [(100, RunStatus.DONE)]


def test_the_tenants_admin_sets_the_cap_and_deactivates_through_the_services(
    tenant: Tenant, noisy: Tenant
) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    definitions.deploy_definition(noisy, "work", calls("a"))
    run, _ = services.start_workflow(noisy, "work")

    page = f"/admin/workflows/tenant/{noisy.id}/change/"
    saved = client.post(page, {"max_running": "3", "schedule_quota": "100"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    refused = client.post(page, {"max_running": "0", "schedule_quota": "100"})
    assert refused.status_code == 200 and "max_running" in refused.content.decode()
    assert Tenant.objects.get(id=noisy.id).max_running == 3

    changelist = "/admin/workflows/tenant/"
    action = {"action": "deactivate_tenants", "_selected_action": [str(noisy.id)]}
    assert client.post(changelist, action).status_code == 302
    assert not Tenant.objects.get(id=noisy.id).is_active
    assert status_of(noisy, run.id).status == RunStatus.PAUSED
    action["action"] = "reactivate_tenants"
    assert client.post(changelist, action).status_code == 302
    assert Tenant.objects.get(id=noisy.id).is_active
    assert status_of(noisy, run.id).status == RunStatus.READY
    with tenant_context(noisy.id):
        assert list(AuditLog.objects.order_by("created_at").values_list("action", "operator")) == [
            ("deactivate_tenant", "admin:op"),
            ("reactivate_tenant", "admin:op"),
        ]
