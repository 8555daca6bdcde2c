"""The operator console through Django's test client: lists, the instance page, every run
action (single and bulk) through the services, the refusals shown as messages, the
dead-letter queue, definitions, the dashboard and tenant isolation."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import wasmtime
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client

from engine.events import EventType
from tests.browser import scenario
from workflows.executor import set_services
from workflows.models import (
    AuditLog,
    StaffTenant,
    VersionTag,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/workflowinstance/"


@pytest.fixture
def world(tenant: Any) -> dict[str, Any]:
    scenario.OUTAGES.clear()
    runs = scenario.populate(tenant)
    yield runs
    scenario.OUTAGES.clear()


@pytest.fixture
def op(tenant: Any) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def run_row(tenant: Any, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id)


def page(client: Client, url: str, **kw: Any) -> str:
    response = client.get(url, **kw)
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def texts(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def drain_worker(done: Callable[[], bool]) -> None:
    """The real worker command, in-process, until ``done()`` (bounded: the shop workflow
    sleeps 500 ms between its calls, so a run may need a second pass)."""
    from engine.services import Services

    set_services(Services.from_settings(scenario.SERVICES))
    try:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline, "the worker did not finish the runs in 20 s"
            call_command("runworker", "--burst", stdout=io.StringIO())
            time.sleep(0.1)
    finally:
        set_services(None)


# --- lists -------------------------------------------------------------------------------------


def test_changelist_shows_status_waits_attempts_and_age(world: dict[str, Any], op: Client) -> None:
    html = page(op, RUNS)
    assert html.count("cleat-status-dead_lettered") >= 2
    assert "signals paid" in html  # the demo runs wait for the "paid" signal
    assert re.search(r"timer until \d\d:\d\d", html)  # the shop run sleeping
    assert "cleat-status-done" in html and "cleat-status-failed" in html
    assert re.search(r"\d+ (ms|s|min)</td>", html)  # the age column


@pytest.mark.parametrize(
    ("query", "expected", "absent"),
    [
        ("status__exact=dead_lettered", "dead", "waiting"),
        ("definition=demo-order", "waiting", "dead"),
        ("error_code__exact=permanent", "failed", "dead"),
        ("q=warehouse+for+lamp", "dead", "failed"),  # the error text
        ("q=forbidden", "failed", "dead"),  # the input
        ("version=1&queue=default&definition=shop-order", "done", "waiting"),
        ("created_at__gte=2000-01-01+00:00:00%2B00:00", "done", None),
    ],
)
def test_changelist_filters_and_search(
    world: dict[str, Any], op: Client, query: str, expected: str, absent: str | None
) -> None:
    html = page(op, f"{RUNS}?{query}")

    def ids(role: str) -> list[str]:
        value = world[role]
        return [value] if isinstance(value, str) else value

    for run_id in ids(expected):
        assert run_id[:8] in html, query
    if absent:
        for run_id in ids(absent):
            assert run_id[:8] not in html, query


def test_search_by_run_id_finds_exactly_that_run(world: dict[str, Any], op: Client) -> None:
    wanted = world["dead"][1]
    html = page(op, f"{RUNS}?q={wanted}")
    assert wanted[:8] in html
    assert world["dead"][0][:8] not in html
    assert "1 result" in html


# --- the instance page -------------------------------------------------------------------------


def test_instance_page_shows_io_state_timeline_and_events(
    world: dict[str, Any], op: Client
) -> None:
    html = page(op, f"{RUNS}{world['done']}/change/")
    assert 'id="run-input"' in html and "&quot;book&quot;" in html
    assert 'id="run-result"' in html and "receipt" in html
    assert 'id="run-query-state"' in html and "charged" in html
    svg = re.search(r"<svg[^>]*cleat-timeline.*?</svg>", html, re.S)
    assert svg is not None
    assert svg.group(0).count("tl-item tl-call") == 2  # reserve and charge
    assert "tl-item tl-timer" in svg.group(0)  # the 500 ms sleep
    assert "tl-end-done" in svg.group(0)
    assert "https://" not in svg.group(0) and "<script" not in html.split("<body")[1].lower()
    for step in range(3):
        assert f'id="event-{step}"' in html
    assert "call(shop, reserve" in html
    # The failed run: its error and a red end.
    failed = page(op, f"{RUNS}{world['failed']}/change/")
    assert "may not be sold" in failed and "tl-end-failed" in failed
    assert "tl-item tl-call tl-failed" in failed
    # A waiting run: what it waits on, drawn as an open wait, and the signal action offered.
    waiting = page(op, f"{RUNS}{world['waiting'][0]}/change/")
    assert "signals paid" in waiting and "tl-wait tl-open" in waiting
    assert 'id="action-signal"' in waiting and 'id="action-retry"' not in waiting


def test_events_table_is_paginated(world: dict[str, Any], op: Client, tenant: Any) -> None:
    from workflows import services as svc

    run_id = world["waiting"][0]
    for i in range(60):  # each re-replay records an admin_action event
        svc.re_replay(tenant, run_id, None, "setup", f"round {i}")
    count = run_row(tenant, run_id).event_count
    assert count > 60
    html = page(op, f"{RUNS}{run_id}/change/")
    assert f"Events ({count})" in html and 'id="event-pages"' in html
    assert 'id="event-0"' in html and 'id="event-50"' not in html
    second = page(op, f"{RUNS}{run_id}/change/?page=2")
    assert 'id="event-50"' in second and 'id="event-0"' not in second


def test_parent_children_and_continue_as_new_chain_are_linked(tenant: Any, op: Client) -> None:
    scenario.deploy(tenant)
    env = scenario.DatabaseWorkflowEnvironment(tenant, scenario.SERVICES)
    try:
        parent = env.run("demo-order", {})
        child = env.run("demo-order", {"child": True})
        successor = env.run("demo-order", {"next": True})
    finally:
        env.close()
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=child).update(parent_id=parent)
        WorkflowInstance.objects.filter(id=successor).update(continued_from_id=parent)
    html = page(op, f"{RUNS}{parent}/change/")
    assert f"{RUNS}{child}/change/" in html.split('id="run-children"')[1].split("</td>")[0]
    assert f"{RUNS}{successor}/change/" in html.split('id="run-chain"')[1].split("</td>")[0]
    child_html = page(op, f"{RUNS}{child}/change/")
    assert f"{RUNS}{parent}/change/" in child_html.split('id="run-parent"')[1].split("</td>")[0]
    assert 'id="run-detached-from"' not in child_html
    with tenant_context(tenant.id):  # a run started by the parent with run_detached
        WorkflowInstance.objects.filter(id=child).update(parent_id=None, detached_from=parent)
    detached_html = page(op, f"{RUNS}{child}/change/")
    link = detached_html.split('id="run-detached-from"')[1].split("</td>")[0]
    assert f"{RUNS}{parent}/change/" in link


def test_state_at_step_replays_the_history_without_side_effects(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    run_id = world["done"]
    before = run_row(tenant, run_id)
    seen = []
    for step in (0, 1, 2, 3):
        html = page(op, f"{RUNS}{run_id}/state/?step={step}")
        match = re.search(r'id="state-values".*?<pre class="cleat-pre">(.*?)</pre>', html, re.S)
        seen.append(match.group(1) if match else None)
    assert seen == [
        "&quot;started&quot;",
        "&quot;reserved&quot;",
        "&quot;reserved&quot;",
        "&quot;charged&quot;",
    ]
    assert "the run completes within these events" in page(op, f"{RUNS}{run_id}/state/?step=3")
    after = run_row(tenant, run_id)
    assert (after.event_count, after.generation, after.status) == (
        before.event_count,
        before.generation,
        before.status,
    )
    response = op.get(f"{RUNS}{run_id}/state/?step=minus")
    assert response.status_code == 302
    assert any("whole number" in m for m in texts(response))


# --- actions ----------------------------------------------------------------------------------


def confirm(client: Client, run_id: str, action: str, generation: int, **data: Any) -> Any:
    return client.post(
        f"{RUNS}{run_id}/action/{action}/", {"runs": f"{run_id}:{generation}", **data}
    )


def test_force_fail_asks_for_confirmation_then_fails_with_audit(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    run_id = world["waiting"][0]
    generation = run_row(tenant, run_id).generation
    form = page(op, f"{RUNS}{run_id}/action/force_fail/")
    assert f'value="{run_id}:{generation}"' in form and 'name="reason"' in form
    assert run_row(tenant, run_id).status == "ready"  # the page alone changes nothing
    response = confirm(
        op, run_id, "force_fail", generation, message="gave up", code="permanent", reason="stuck"
    )
    assert response.status_code == 302
    assert any("force-failed" in m for m in texts(response))
    row = run_row(tenant, run_id)
    assert (row.status, row.error, row.error_code) == ("failed", "gave up", "permanent")
    with tenant_context(tenant.id):
        audit = AuditLog.objects.get(instance_id=run_id, action="force_fail")
        kinds = list(
            WorkflowEvent.objects.filter(instance_id=run_id).values_list("type_code", flat=True)
        )
    assert (audit.operator, audit.reason) == ("admin:op", "stuck")
    assert EventType.ADMIN_ACTION.code in kinds
    html = page(op, f"{RUNS}{run_id}/change/")
    assert "audit-force_fail" in html and "stuck" in html
    assert "admin: force_fail by admin:op" in html  # on the timeline


def test_stale_generation_is_refused_with_a_message(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    run_id = world["waiting"][1]
    generation = run_row(tenant, run_id).generation
    for action, data in [
        ("force_fail", {"message": "x", "code": "error"}),
        ("terminate", {}),
        ("pause", {}),
    ]:
        response = confirm(op, run_id, action, generation - 1, reason="late", **data)
        assert response.status_code == 302
        assert any("generation" in m and "reload" in m for m in texts(response)), action
    assert run_row(tenant, run_id).status == "ready"


def test_illegal_transitions_are_messages_not_errors(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    done = world["done"]
    generation = run_row(tenant, done).generation
    for action, words in [
        ("pause", "only a ready run can be paused"),
        ("retry", "only failed or dead-lettered"),
        ("terminate", "already done"),
        ("resume", "not paused"),
    ]:
        response = confirm(op, done, action, generation, reason="try")
        assert response.status_code == 302
        assert any(words in m for m in texts(response)), (action, texts(response))
    response = confirm(op, done, "signal", generation, name="paid", payload="{}", reason="try")
    assert any("cannot receive signals" in m for m in texts(response))
    assert op.get(f"{RUNS}{done}/action/no_such/").status_code == 404


def test_bad_json_is_a_form_error(world: dict[str, Any], op: Client, tenant: Any) -> None:
    run_id = world["waiting"][2]
    generation = run_row(tenant, run_id).generation
    response = confirm(op, run_id, "force_complete", generation, result="{bad", reason="r")
    assert response.status_code == 400
    assert "not valid JSON" in response.content.decode()
    response = confirm(op, run_id, "signal", generation, name="paid", payload="[1,", reason="r")
    assert response.status_code == 400 and "not valid JSON" in response.content.decode()
    assert run_row(tenant, run_id).status == "ready"
    response = confirm(op, run_id, "force_complete", generation, result='{"ok": 1}', reason="r")
    assert response.status_code == 302
    row = run_row(tenant, run_id)
    assert (row.status, json.loads(row.result)) == ("done", {"ok": 1})


def test_reason_is_required(world: dict[str, Any], op: Client, tenant: Any) -> None:
    run_id = world["waiting"][0]
    response = confirm(op, run_id, "terminate", run_row(tenant, run_id).generation)
    assert response.status_code == 400
    assert run_row(tenant, run_id).status == "ready"


def test_each_lifecycle_action_goes_through_its_service(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    a, b, c = world["waiting"]

    def act(run_id: str, action: str, **data: Any) -> None:
        response = confirm(op, run_id, action, run_row(tenant, run_id).generation, **data)
        assert response.status_code == 302
        assert not [m for m in texts(response) if "refused" in m], texts(response)

    act(a, "pause", reason="hold")
    assert run_row(tenant, a).status == "paused"
    act(a, "resume", reason="go")
    assert run_row(tenant, a).status == "ready"
    act(a, "cancel", reason="not needed")
    assert run_row(tenant, a).cancel_requested
    act(b, "terminate", reason="bad input")
    assert run_row(tenant, b).status == "terminated"
    act(b, "re_replay", reason="again")
    assert run_row(tenant, b).status == "ready"
    act(c, "signal", name="paid", payload='{"amount": 12}', reason="the payer's callback was lost")
    drain_worker(lambda: run_row(tenant, c).status == "done")
    assert run_row(tenant, c).status == "done"
    with tenant_context(tenant.id):
        actions = sorted(AuditLog.objects.values_list("action", flat=True))
    assert actions == sorted(["pause", "resume", "cancel", "terminate", "re_replay", "signal"])


def test_operators_without_permission_see_no_actions(world: dict[str, Any], tenant: Any) -> None:
    viewer = get_user_model().objects.create_user("viewer", password="pw-12345678", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_workflowinstance"))
    StaffTenant.objects.create(user=viewer, tenant=tenant)
    client = Client()
    client.force_login(viewer)
    run_id = world["waiting"][0]
    html = page(client, f"{RUNS}{run_id}/change/")
    assert 'id="run-actions"' not in html
    assert client.get(f"{RUNS}{run_id}/action/terminate/").status_code == 403
    listing = page(client, RUNS)
    assert "bulk_terminate" not in listing


def test_history_is_read_only(world: dict[str, Any], op: Client) -> None:
    run_id = world["done"]
    assert op.post(f"{RUNS}{run_id}/delete/").status_code in (302, 403)
    assert op.get("/admin/workflows/workflowevent/").status_code == 404
    assert op.get(f"{RUNS}add/").status_code == 403


# --- bulk actions and the dead-letter queue ---------------------------------------------------


def test_dead_letter_queue_groups_and_bulk_retry(
    world: dict[str, Any], op: Client, tenant: Any
) -> None:
    html = page(op, "/admin/console/dead-letters/")
    assert 'data-definition="shop-order" data-code="error" data-count="2"' in html
    assert 'data-definition="invoice-order" data-code="nondeterminism" data-count="2"' in html
    assert "warehouse for lamp is offline" in html and "reservx" in html
    broken = world["broken"]
    form = {"action": "bulk_retry", "_selected_action": broken}
    confirmation = op.post(RUNS, form)  # what the group's "Retry all" button posts
    assert confirmation.status_code == 200
    body = confirmation.content.decode()
    assert 'id="confirm-runs"' in body and all(b in body for b in broken)
    assert {run_row(tenant, b).status for b in broken} == {"dead_lettered"}
    targets = [f"{b}:{run_row(tenant, b).generation}" for b in broken]
    done = op.post(RUNS, {**form, "confirm": "yes", "runs": targets, "reason": "v1 rolled back"})
    assert done.status_code == 302
    assert any("2 runs retried" in m for m in texts(done))
    assert {run_row(tenant, b).status for b in broken} == {"ready"}
    drain_worker(lambda: {run_row(tenant, b).status for b in broken} == {"done"})
    html = page(op, "/admin/console/dead-letters/")
    assert 'data-code="nondeterminism"' not in html and 'data-code="error"' in html
    with tenant_context(tenant.id):
        assert AuditLog.objects.filter(action="retry", reason="v1 rolled back").count() == 2


def test_bulk_action_reports_each_refusal(world: dict[str, Any], op: Client, tenant: Any) -> None:
    chosen = [world["done"], world["waiting"][0]]
    targets = [f"{r}:{run_row(tenant, r).generation}" for r in chosen]
    response = op.post(
        RUNS,
        {
            "action": "bulk_terminate",
            "_selected_action": chosen,
            "confirm": "yes",
            "runs": targets,
            "reason": "cleanup",
        },
    )
    assert response.status_code == 302
    messages = texts(response)
    assert any("terminated" in m for m in messages)
    assert any("refused" in m and world["done"] in m for m in messages)
    assert run_row(tenant, world["waiting"][0]).status == "terminated"
    assert run_row(tenant, world["done"]).status == "done"


# --- definitions -------------------------------------------------------------------------------


def test_uploading_an_invalid_module_shows_wasmtime_s_reason_on_the_form(
    tenant: Any, op: Client
) -> None:
    response = op.post(
        "/admin/workflows/workflowdefinition/add/",
        {"name": "broken", "wasm": SimpleUploadedFile("broken.wasm", b"\x00asm garbage")},
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "errorlist" in html and "field-wasm" in html
    with tenant_context(tenant.id):
        assert not WorkflowDefinition.objects.filter(name="broken").exists()


def test_uploading_a_module_deploys_the_next_version(tenant: Any, op: Client) -> None:
    wasm = wasmtime.wat2wasm(scenario.SHOP_WAT)
    for expected in (1, 2):
        response = op.post(
            "/admin/workflows/workflowdefinition/add/",
            {"name": "shop", "wasm": SimpleUploadedFile("shop.wasm", wasm)},
        )
        assert response.status_code == 302
        assert any(f"version {expected}" in m for m in texts(response))
    with tenant_context(tenant.id):
        assert sorted(WorkflowDefinition.objects.values_list("version", flat=True)) == [1, 2]


def test_definition_page_tags_routing_and_deprecation(tenant: Any, op: Client) -> None:
    wasm = wasmtime.wat2wasm(scenario.SHOP_WAT)
    for _ in range(2):
        op.post(
            "/admin/workflows/workflowdefinition/add/",
            {"name": "shop", "wasm": SimpleUploadedFile("shop.wasm", wasm)},
        )
    with tenant_context(tenant.id):
        v1 = WorkflowDefinition.objects.get(name="shop", version=1)
    url = f"/admin/workflows/workflowdefinition/{v1.pk}/change/"
    assert op.post(url, {"op": "set_tag", "tag": "stable", "version": "1"}).status_code == 302
    op.post(url, {"op": "set_routing", "weight_1": "3", "weight_2": "1"})
    html = page(op, url)
    assert "stable" in html and 'id="versions"' in html
    with tenant_context(tenant.id):
        assert VersionTag.objects.get(name="shop", tag="stable").version == 1
    bad = op.post(url, {"op": "set_routing", "weight_1": "0", "weight_2": "0"})
    assert any("at least one rule" in m for m in texts(bad))
    response = op.post(url, {"op": "deprecate", "reason": "replaced by v2"})
    assert any("deprecated" in m for m in texts(response))
    with tenant_context(tenant.id):
        assert WorkflowDefinition.objects.get(pk=v1.pk).deprecated
        assert AuditLog.objects.filter(action="deprecate_definition", reason="replaced by v2")
    op.post(url, {"op": "restore"})
    with tenant_context(tenant.id):
        assert not WorkflowDefinition.objects.get(pk=v1.pk).deprecated


# --- dashboard --------------------------------------------------------------------------------


def test_dashboard_counts_rates_and_charts(world: dict[str, Any], op: Client) -> None:
    html = page(op, "/admin/console/dashboard/")
    assert re.search(r'id="fig-total">10<', html)
    assert re.search(r'id="fig-dlq"><a[^>]*>4<', html)
    # 6 runs ended in the last hour (1 done, 4 dead-lettered, 1 failed): 83.3 % failed.
    assert re.search(r'id="fig-failure-rate">83\.3%<', html)
    for chart in ("chart-bars", "chart-per-minute", "chart-stacked"):
        assert f"chart {chart}" in html
    assert 'data-label="dead-lettered" data-value="4"' in html
    assert 'data-series="started" data-value="10"' in html
    assert 'data-definition="shop-order"' in html and 'data-definition="demo-order"' in html
    one = page(op, "/admin/console/dashboard/?definition=demo-order")
    assert re.search(r'id="fig-total">3<', one)


def test_dashboard_counts_runs_stamped_after_now_in_the_current_minute(
    world: dict[str, Any], tenant: Any
) -> None:
    """A worker's clock ahead of the web server's (here: the test environment's clock runs
    ahead of real time) must not drop runs out of the window's last minute."""
    from django.db.models import Min

    from workflows.console import metrics

    with tenant_context(tenant.id):
        first = WorkflowInstance.objects.filter(completed_at__isnull=False).aggregate(
            first=Min("completed_at")
        )["first"]
        # "now" just before every completion, at the end of a minute: all of them are later.
        now = first.replace(second=0, microsecond=0) - timedelta(microseconds=1)
        data = metrics.dashboard(tenant, now)
    assert data.minutes[-1] == now.replace(second=0, microsecond=0)
    assert (sum(data.completions), sum(data.failures)) == (1, 5)
    assert data.completions[-1] == 1 and data.failures[-1] == 5
    assert data.failure_rate is not None and round(data.failure_rate * 100, 1) == 83.3


# --- tenancy ----------------------------------------------------------------------------------


def test_staff_bound_to_a_tenant_see_only_that_tenant(
    world: dict[str, Any], tenant: Any, other_tenant: Any
) -> None:
    staff = get_user_model().objects.create_user("alice", password="pw-12345678", is_staff=True)
    for codename in ("view_workflowinstance", "change_workflowinstance"):
        staff.user_permissions.add(Permission.objects.get(codename=codename))
    StaffTenant.objects.create(user=staff, tenant=other_tenant)
    client = Client()
    client.force_login(staff)
    listing = page(client, f"{RUNS}?tenant={tenant.id}")  # a crafted switch is ignored
    for run_id in [world["done"], *world["dead"], *world["waiting"]]:
        assert run_id[:8] not in listing
    response = client.get(f"{RUNS}{world['done']}/change/")
    assert response.status_code == 404  # the same answer as for a run that does not exist
    run_id = world["waiting"][0]
    blocked = client.post(
        f"{RUNS}{run_id}/action/terminate/", {"runs": f"{run_id}:1", "reason": "x"}
    )
    assert blocked.status_code == 404 and run_row(tenant, run_id).status == "ready"
    assert 'id="fig-total">0<' in page(client, "/admin/console/dashboard/")
    assert 'id="tenant-switcher"' not in listing and "other" in listing


def test_staff_without_a_tenant_are_refused(tenant: Any) -> None:
    loose = get_user_model().objects.create_user("bob", password="pw-12345678", is_staff=True)
    client = Client()
    client.force_login(loose)
    response = client.get(RUNS)
    assert response.status_code == 403
    assert b"not bound to a tenant" in response.content


def test_superusers_switch_tenant_by_post_only(
    world: dict[str, Any], tenant: Any, other_tenant: Any
) -> None:
    """Only the header's form switches (a POST with the CSRF token); a GET with ?tenant=,
    on any page or on the switch URL itself, leaves the console where it is."""
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    op = Client(enforce_csrf_checks=True)
    op.force_login(user)
    listing = page(op, RUNS)
    assert world["done"][:8] in listing
    assert 'id="tenant-switcher"' in listing and 'method="post"' in listing
    assert f"?tenant={other_tenant.id}" not in listing  # no switching links any more
    # A crafted link (or an image on another site) does not switch.
    page(op, f"/admin/?tenant={other_tenant.id}")
    assert world["done"][:8] in page(op, RUNS)
    sneaky = op.get(f"/admin/console/tenant/?tenant={other_tenant.id}&next={RUNS}")
    assert sneaky.status_code == 405
    assert world["done"][:8] in page(op, RUNS)
    # A POST without the CSRF token is refused.
    forged = op.post("/admin/console/tenant/", {"tenant": str(other_tenant.id), "next": RUNS})
    assert forged.status_code == 403
    assert world["done"][:8] in page(op, RUNS)
    # The form's POST, with its token, switches (and is remembered).
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', listing)
    assert token is not None
    switch = {"tenant": str(other_tenant.id), "next": RUNS, "csrfmiddlewaretoken": token[1]}
    response = op.post("/admin/console/tenant/", switch)
    assert response.status_code == 302
    assert world["done"][:8] not in page(op, RUNS)
    assert world["done"][:8] not in page(op, f"{RUNS}?tenant={tenant.id}")  # still no switch
    bad = op.post(
        "/admin/console/tenant/",
        {"tenant": "nope", "next": "https://evil.example/", "csrfmiddlewaretoken": token[1]},
    )
    assert bad.status_code == 302 and bad["Location"] == "/admin/"
