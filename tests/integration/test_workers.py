"""The worker registry and what reads it: a ``runworker`` process's row (written when it
starts, refreshed on each heartbeat, removed on a clean stop, left to turn stale when the
process is killed), ``GET /api/v1/workers``, the console's workers page and the run page's
link to it, and the fleet gauges of the web process's ``/metrics`` against seeded rows.

Runs on every database pass: SQLite, PostgreSQL (as the RLS-bound application role, the
backlog read through its definer function) and MariaDB.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client

from tests.integration.support.processes import WorkerProcess, command_env, wait_until
from tests.integration.test_api_support import Api, error_of, key_for
from workflows.models import (
    STALE_AFTER_BEATS,
    Role,
    RunStatus,
    StaffTenant,
    Tenant,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.models import (
    WorkerProcess as WorkerRow,
)
from workflows.store import workers as registry
from workflows.store.backlog import backlog, fleet_backlog
from workflows.store.workers import fleet_now
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS_PAGE = "/admin/console/workers/"


def beat(worker_id: str, now: datetime, **fields: Any) -> registry.WorkerBeat:
    values: dict[str, Any] = {
        "worker_id": worker_id,
        "host": "box-1",
        "pid": 4242,
        "task_queues": ["default", "mail"],
        "concurrency": 4,
        "started_at": now - timedelta(minutes=5),
        "heartbeat_interval_s": 20.0,
        "runs_held": 2,
        "steps_total": 1200,
        "steps_per_s": 12.5,
    }
    values.update(fields)
    return registry.WorkerBeat(**values)


def seed_workers(now: datetime) -> None:
    """A live worker and one whose heartbeat is older than STALE_AFTER_BEATS intervals."""
    registry.record_heartbeat(beat("live-1", now), now)
    registry.record_heartbeat(
        beat("gone-2", now, host="box-2", runs_held=1, steps_per_s=3.0, last_error="boom"),
        now - timedelta(seconds=STALE_AFTER_BEATS * 20 + 5),
    )


def make_runs(tenant: Tenant, specs: list[tuple[str, str, str, float | None]]) -> None:
    """(definition, task queue, status, seconds since due -- None: not due) per run."""
    now = fleet_now()
    with tenant_context(tenant.id):
        names = {spec[0] for spec in specs}
        defs = {
            name: WorkflowDefinition.objects.get_or_create(
                tenant=tenant,
                name=name,
                version=1,
                defaults={"wasm": b"\0asm", "sha256": "0" * 64},
            )[0]
            for name in names
        }
        for n, (name, queue, status, ago) in enumerate(specs):
            WorkflowInstance.objects.create(
                tenant=tenant,
                workflow_id=f"{tenant.name}-{n}",
                definition=defs[name],
                definition_name=name,
                definition_version=1,
                task_queue=queue,
                status=status,
                next_wake_at=None if ago is None else now - timedelta(seconds=ago),
                assigned_to="live-1" if status == RunStatus.RUNNING else None,
            )


# --- the registry row's lifecycle ------------------------------------------------------------


def test_a_heartbeat_upserts_one_row_and_a_clean_stop_removes_it(tenant: Tenant) -> None:
    now = fleet_now()
    registry.record_heartbeat(beat("w-1", now, runs_held=1), now)
    later = now + timedelta(seconds=20)
    registry.record_heartbeat(beat("w-1", now, runs_held=3, steps_total=1500), later)
    row = WorkerRow.objects.get()
    assert (row.worker_id, row.runs_held, row.steps_total) == ("w-1", 3, 1500)
    assert row.heartbeat_at == later and row.task_queues == ["default", "mail"]
    assert not row.is_stale(later + timedelta(seconds=STALE_AFTER_BEATS * 20))
    assert row.is_stale(later + timedelta(seconds=STALE_AFTER_BEATS * 20 + 1))
    assert registry.forget_worker("w-1") == 1
    assert not WorkerRow.objects.exists()


def test_rows_not_heard_of_for_long_are_forgotten(tenant: Tenant) -> None:
    now = fleet_now()
    registry.record_heartbeat(beat("old", now), now - timedelta(days=2))
    registry.record_heartbeat(beat("recent", now), now - timedelta(hours=1))
    assert registry.forget_long_gone(now, timedelta(days=1)) == 1
    assert list(WorkerRow.objects.values_list("worker_id", flat=True)) == ["recent"]


def test_the_loop_reports_its_steps_and_last_error_then_unregisters(tenant: Tenant) -> None:
    """In-process: a beat carries the worker's options, and a loop error is in the next
    beat (redacted and cut short); the end of run() removes the row."""
    worker = Worker(WorkerOptions(worker_id="in-process", concurrency=2, lease_s=3.0, burst=True))
    now = fleet_now()
    worker._report(now, time.monotonic())
    row = WorkerRow.objects.get()
    assert (row.concurrency, row.heartbeat_interval_s, row.runs_held) == (2, 1.0, 0)
    assert row.last_error == "" and row.steps_per_s == 0.0
    worker._steps_total = 40
    worker._note_error(RuntimeError("the database went away " + "x" * 900))
    worker._report(now + timedelta(seconds=1), time.monotonic() + 2.0)
    row.refresh_from_db()
    assert row.steps_total == 40 and 0 < row.steps_per_s <= 40
    assert row.last_error.startswith("RuntimeError: the database went away")
    assert len(row.last_error) == registry.ERROR_CHARS and row.last_error_at is not None
    assert worker.run() == 0  # burst: nothing due
    assert not WorkerRow.objects.exists()


def _row(worker_id: str) -> WorkerRow | None:
    return WorkerRow.objects.filter(worker_id=worker_id).first()


def test_a_worker_process_registers_beats_and_unregisters_on_sigterm(
    tenant: Tenant, tmp_path: Path
) -> None:
    """A real ``runworker`` (lease 1.5 s: a heartbeat every 0.5 s)."""
    args = ["--worker-id", "proc-1", "--poll-interval", "0.1", "--lease", "1.5"]
    args += ["--queues", "default,bulk", "--concurrency", "3"]
    with WorkerProcess(tmp_path / "w.log", args, command_env()) as proc:
        first = wait_until(lambda: _row("proc-1"), 30, "the worker's row")
        assert first.pid == proc.pid and first.task_queues == ["default", "bulk"]
        assert (first.concurrency, first.heartbeat_interval_s) == (3, 0.5)
        wait_until(
            lambda: (r := _row("proc-1")) is not None and r.heartbeat_at > first.heartbeat_at,
            10,
            "a later heartbeat",
        )
        proc.terminate()
        assert proc.wait(timeout=30) == 0, proc.log()
    assert _row("proc-1") is None, "a clean stop leaves no row"


def test_a_killed_worker_leaves_a_row_that_turns_stale(tenant: Tenant, tmp_path: Path) -> None:
    args = ["--worker-id", "proc-2", "--poll-interval", "0.1", "--lease", "1.5"]
    with WorkerProcess(tmp_path / "w.log", args, command_env()) as proc:
        row = wait_until(lambda: _row("proc-2"), 30, "the worker's row")
        assert not row.is_stale(fleet_now())
        proc.kill()
    row = wait_until(lambda: (r := _row("proc-2")) and r.is_stale(fleet_now()) and r, 10, "stale")
    found = Api(key_for(tenant, Role.OPERATOR)).get("/api/v1/workers", {"stale": "true"})
    assert [w["worker_id"] for w in found.json()["results"]] == ["proc-2"]


# --- the API -----------------------------------------------------------------------------------

FIELDS = {
    "worker_id",
    "host",
    "pid",
    "task_queues",
    "concurrency",
    "runs_held",
    "started_at",
    "heartbeat_at",
    "heartbeat_interval_s",
    "heartbeat_age_s",
    "stale",
    "steps_total",
    "steps_per_s",
    "last_error_at",
}


def test_the_api_lists_workers_to_operators(tenant: Tenant) -> None:
    seed_workers(fleet_now())
    api = Api(key_for(tenant, Role.OPERATOR))
    response = api.get("/api/v1/workers")
    assert response.status_code == 200, response.content
    rows = {w["worker_id"]: w for w in response.json()["results"]}
    assert set(rows) == {"live-1", "gone-2"}
    assert set(rows["live-1"]) == FIELDS
    assert rows["live-1"]["stale"] is False and rows["gone-2"]["stale"] is True
    assert rows["live-1"]["task_queues"] == ["default", "mail"]
    assert rows["live-1"]["steps_per_s"] == 12.5
    assert "boom" not in response.content.decode()  # the error text is the console's only
    assert rows["gone-2"]["heartbeat_age_s"] > STALE_AFTER_BEATS * 20
    live = api.get("/api/v1/workers", {"stale": "false"}).json()["results"]
    assert [w["worker_id"] for w in live] == ["live-1"]
    first = api.get("/api/v1/workers", {"limit": "1"}).json()
    assert [w["worker_id"] for w in first["results"]] == ["gone-2"] and first["next"]


def test_the_api_refuses_other_roles_and_bad_parameters(tenant: Tenant) -> None:
    seed_workers(fleet_now())
    assert Api(None).get("/api/v1/workers").status_code == 401
    reader = Api(key_for(tenant, Role.READ_ONLY, name="reader")).get("/api/v1/workers")
    assert reader.status_code == 403
    assert "operator" in error_of(reader)["message"]
    bad = Api(key_for(tenant, Role.ADMIN, name="admin")).get("/api/v1/workers", {"stale": "maybe"})
    assert bad.status_code == 400 and "stale" in bad.content.decode()


# --- the console -------------------------------------------------------------------------------


@pytest.fixture
def op(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def test_the_workers_page_flags_stale_workers_and_counts_this_tenants_share(
    op: Client, tenant: Tenant, other_tenant: Tenant
) -> None:
    seed_workers(fleet_now())
    make_runs(tenant, [("shop", "default", RunStatus.RUNNING, 0), ("shop", "mail", "ready", 30)])
    make_runs(other_tenant, [("secret-def", "default", RunStatus.RUNNING, 0)] * 2)
    page = op.get(WORKERS_PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-worker="live-1" data-stale="0"' in html
    assert 'data-worker="gone-2" data-stale="1"' in html
    assert re.search(r'id="fig-live">1<', html) and re.search(r'id="fig-stale">1<', html)
    # live-1 holds one of this tenant's runs (and two of the other's: not counted here).
    held = re.search(r'assigned_to=live-1">(\d+)</a>', html)
    assert held and held.group(1) == "1", html
    # The backlog panel: this tenant's due run only.
    assert 'data-queue="mail" data-definition="shop"' in html
    assert "secret-def" not in html
    index = op.get("/admin/").content.decode()
    assert 'id="index-workers"' in index and WORKERS_PAGE in index
    # The changelist the "held here" count links to lists exactly that run.
    listed = op.get(
        "/admin/workflows/workflowinstance/", {"status__exact": "running", "assigned_to": "live-1"}
    )
    assert listed.status_code == 200
    assert re.search(r'class="paginator">\s*1 workflow instance\s', listed.content.decode())


def test_one_worker_and_a_missing_one(op: Client, tenant: Tenant) -> None:
    seed_workers(fleet_now())
    html = op.get(WORKERS_PAGE, {"worker": "gone-2"}).content.decode()
    assert 'data-worker="gone-2"' in html and 'data-worker="live-1"' not in html
    missing = op.get(WORKERS_PAGE, {"worker": "nobody"}).content.decode()
    assert "is not registered" in missing and 'id="workers-empty"' in missing


def test_the_run_page_links_its_worker(op: Client, tenant: Tenant) -> None:
    seed_workers(fleet_now())
    make_runs(tenant, [("shop", "default", RunStatus.RUNNING, 0)])
    with tenant_context(tenant.id):
        run = WorkflowInstance.objects.get()
    html = op.get(f"/admin/workflows/workflowinstance/{run.id}/change/").content.decode()
    assert f'<td id="run-worker"><a href="{WORKERS_PAGE}?worker=live-1">live-1</a>' in html


def test_staff_need_the_permission(tenant: Tenant) -> None:
    """A tenant's staff user without view_workerprocess gets a 403 and no link (on the run
    page the worker's name is plain text); given the permission, the page."""
    seed_workers(fleet_now())
    make_runs(tenant, [("shop", "default", RunStatus.RUNNING, 0)])
    user = get_user_model().objects.create_user("staff", password="pw-12345678", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_workflowinstance"))
    StaffTenant.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    assert client.get(WORKERS_PAGE).status_code == 403
    assert 'id="index-workers"' not in client.get("/admin/").content.decode()
    with tenant_context(tenant.id):
        run = WorkflowInstance.objects.get()
    html = client.get(f"/admin/workflows/workflowinstance/{run.id}/change/").content.decode()
    assert '<td id="run-worker">live-1 (' in html
    user.user_permissions.add(Permission.objects.get(codename="view_workerprocess"))
    client.force_login(get_user_model().objects.get(pk=user.pk))
    page = client.get(WORKERS_PAGE)
    assert page.status_code == 200
    # A fleet worker's error text can quote another tenant's values: superusers only.
    registry.record_heartbeat(
        beat("live-1", fleet_now(), last_error="RuntimeError: tenant b's secret"), fleet_now()
    )
    html = client.get(WORKERS_PAGE).content.decode()
    assert "RuntimeError at" in html and "secret" not in html
    admin = get_user_model().objects.create_superuser("root", "r@example.com", "pw-12345678")
    client.force_login(admin)
    assert "tenant b&#x27;s secret" in client.get(WORKERS_PAGE).content.decode()


# --- the gauges of /metrics ----------------------------------------------------------------------


def gauges(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line.startswith(("cleat_ready", "cleat_oldest_ready", "cleat_workers", "cleat_fleet")):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def test_the_gauges_count_every_tenants_due_runs_per_queue_and_definition(
    tenant: Tenant, other_tenant: Tenant, settings: Any
) -> None:
    settings.CLEAT_METRICS_BACKLOG_LABELS = True
    seed_workers(fleet_now())
    make_runs(
        tenant,
        [
            ("shop", "default", "ready", 120),
            ("shop", "default", "ready", 10),
            ("shop", "mail", "ready", 5),
            ("shop", "default", "ready", -60),  # due in a minute: not yet
            ("shop", "default", "ready", None),  # waiting on a signal
            ("shop", "default", RunStatus.RUNNING, 0),
            ("report", "default", RunStatus.DONE, 300),
        ],
    )
    make_runs(other_tenant, [("shop", "default", "ready", 30), ("bill", "mail", "ready", 60)])
    text = Client().get("/metrics").content.decode()
    found = gauges(text)
    ready = {k: v for k, v in found.items() if k.startswith("cleat_ready_runs")}
    assert ready == {
        'cleat_ready_runs{definition="shop",task_queue="default"}': 3.0,
        'cleat_ready_runs{definition="shop",task_queue="mail"}': 1.0,
        'cleat_ready_runs{definition="bill",task_queue="mail"}': 1.0,
    }, text
    oldest = found['cleat_oldest_ready_seconds{definition="shop",task_queue="default"}']
    assert 120 <= oldest < 180, oldest
    assert 60 <= found['cleat_oldest_ready_seconds{definition="bill",task_queue="mail"}'] < 120
    assert found['cleat_workers{state="live"}'] == 1.0
    assert found['cleat_workers{state="stale"}'] == 1.0
    assert found["cleat_workers_runs_held"] == 2.0  # the live worker's only
    assert found["cleat_workers_steps_per_second"] == 12.5
    assert found["cleat_fleet_metrics_up"] == 1.0
    # One rule: the fleet's figures are the sum of each tenant's, as the console reads them.
    now = fleet_now()
    per_tenant: dict[tuple[str, str], int] = {}
    for each in (tenant, other_tenant):
        with tenant_context(each.id):
            for item in backlog(WorkflowInstance.objects.filter(tenant=each), now):
                key = (item.task_queue, item.definition)
                per_tenant[key] = per_tenant.get(key, 0) + item.depth
    assert {(b.task_queue, b.definition): b.depth for b in fleet_backlog(now)} == per_tenant


def test_no_worker_and_nothing_due_is_zeroes_not_an_error(tenant: Tenant) -> None:
    found = gauges(Client().get("/metrics").content.decode())
    assert found == {
        'cleat_ready_runs{definition="",task_queue=""}': 0.0,
        'cleat_oldest_ready_seconds{definition="",task_queue=""}': 0.0,
        'cleat_workers{state="live"}': 0.0,
        'cleat_workers{state="stale"}': 0.0,
        "cleat_workers_runs_held": 0.0,
        "cleat_workers_steps_per_second": 0.0,
        "cleat_fleet_metrics_up": 1.0,
    }


# --- PostgreSQL: the table and the definer function under RLS ----------------------------------


@pytest.mark.postgres_only
def test_the_application_role_uses_the_registry_without_a_tenant(tenant: Tenant) -> None:
    """Connected as cleat_app with no tenant set: the registry is read and written (it is not
    under RLS), and the backlog comes through the definer function, which PUBLIC may not run."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == "cleat_app"
        cursor.execute(
            "SELECT relrowsecurity FROM pg_class WHERE relname = 'workflows_workerprocess'"
        )
        assert cursor.fetchone()[0] is False
        cursor.execute(
            "SELECT has_function_privilege('public', 'cleat.ready_backlog(timestamptz)', 'EXECUTE')"
        )
        assert cursor.fetchone()[0] is False
    now = fleet_now()
    registry.record_heartbeat(beat(f"pg-{uuid.uuid4().hex[:6]}", now), now)
    assert WorkerRow.objects.count() == 1
    make_runs(tenant, [("shop", "default", "ready", 5)])
    assert [(b.task_queue, b.definition, b.depth) for b in fleet_backlog(now)] == [
        ("default", "shop", 1)
    ]


def test_by_default_the_backlog_gauges_name_no_tenants_queue_or_definition(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    """/metrics needs no key, and queue and definition names are the tenants' own text: by
    default the backlog is one series for the fleet."""
    make_runs(tenant, [("shop", "default", "ready", 120), ("shop", "mail", "ready", 5)])
    make_runs(other_tenant, [("secret-def", "secret-queue", "ready", 30)])
    text = Client().get("/metrics").content.decode()
    assert "secret" not in text and "shop" not in text
    found = gauges(text)
    assert found['cleat_ready_runs{definition="",task_queue=""}'] == 3.0, text
    assert 120 <= found['cleat_oldest_ready_seconds{definition="",task_queue=""}'] < 180
