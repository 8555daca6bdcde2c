"""What a new operator meets in the first hour (issue 18): retrying a run that failed on a
service configured wrongly, event payloads and query state as JSON (not strings of JSON),
and the API's hints for the usual first mistakes."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator

import pytest
import wasmtime
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client

from tests.browser import scenario
from tests.integration.test_api_support import Api, key_for
from workflows import definitions
from workflows.models import AuditLog, Role, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/workflowinstance/"


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def api(tenant: Tenant) -> Api:
    return Api(key_for(tenant, Role.ADMIN))


@pytest.fixture
def op(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def status_of(tenant: Tenant, run_id: str) -> str:
    with tenant_context(tenant.id):
        return str(WorkflowInstance.objects.get(id=run_id).status)


def misconfigured_run(tenant: Tenant) -> str:
    """A shop order whose ``shop`` service is not configured: it fails permanently."""
    scenario.OUTAGES.clear()
    definitions.deploy_definition(tenant, "shop-order", wasmtime.wat2wasm(scenario.SHOP_WAT))
    env = DatabaseWorkflowEnvironment(tenant, {})
    try:
        run_id = env.run("shop-order", {"item": "book", "amount": 3})
    finally:
        env.close()
    assert status_of(tenant, run_id) == "failed"
    return run_id


def work(tenant: Tenant, services: dict[str, str]) -> None:
    env = DatabaseWorkflowEnvironment(tenant, services)
    try:
        env.run_until_idle()
        env.advance(1)
    finally:
        env.close()


# --- point 4: a retry that re-executes the last call -----------------------------------------


def test_api_retry_says_it_replays_then_reexecutes_the_last_call(tenant: Tenant, api: Api) -> None:
    run_id = misconfigured_run(tenant)
    path = f"/api/v1/workflows/{run_id}/retry"

    replayed = api.post(path, {"reason": "configured shop"})
    assert replayed.status_code == 200, replayed.content
    body = replayed.json()
    assert body["status"] == "ready" and body["id"] == run_id
    assert body["retry"]["mode"] == "replay" and body["retry"]["forgets_step"] is None
    assert "fail the same way" in body["retry"]["effect"]
    assert "reexecute_last_call" in body["retry"]["effect"]
    work(tenant, scenario.SERVICES)
    assert status_of(tenant, run_id) == "failed"  # the recorded failure, replayed

    again = api.post(path, {"reason": "configured shop", "mode": "reexecute_last_call"}).json()
    assert again["retry"]["mode"] == "reexecute_last_call"
    assert again["retry"]["forgets_step"] is not None
    assert "re-executes step" in again["retry"]["effect"] and "shop" in again["retry"]["effect"]
    work(tenant, scenario.SERVICES)
    assert status_of(tenant, run_id) == "done"
    with tenant_context(tenant.id):
        audit = AuditLog.objects.filter(instance_id=run_id, action="retry").order_by("id")
        assert [a.detail["mode"] for a in audit] == ["replay", "reexecute_last_call"]

    bad = api.post(path, {"mode": "sideways"})
    assert bad.status_code == 400 and "mode" in bad.content.decode()


def test_retry_command_reexecutes_the_last_call(tenant: Tenant) -> None:
    run_id = misconfigured_run(tenant)
    out = io.StringIO()
    call_command("retry_workflow", run_id, "--mode", "reexecute_last_call", stdout=out)
    assert "re-executes step" in out.getvalue()
    work(tenant, scenario.SERVICES)
    assert status_of(tenant, run_id) == "done"


def test_console_retry_offers_the_mode_and_says_what_each_does(tenant: Tenant, op: Client) -> None:
    run_id = misconfigured_run(tenant)
    url = f"{RUNS}{run_id}/action/retry/"
    page = op.get(url).content.decode()
    assert 'id="retry-plans"' in page and "fail the same way" in page
    assert 'value="reexecute_last_call"' in page
    with tenant_context(tenant.id):
        generation = WorkflowInstance.objects.get(id=run_id).generation
    done = op.post(
        url,
        {
            "runs": f"{run_id}:{generation}",
            "confirm": "yes",
            "reason": "shop configured",
            "mode": "reexecute_last_call",
        },
        follow=True,
    )
    assert "re-executes step" in done.content.decode()
    work(tenant, scenario.SERVICES)
    assert status_of(tenant, run_id) == "done"


# --- point 5: JSON shown as JSON, not as strings of JSON ----------------------------------------


def test_event_payloads_show_the_json_inside_them_parsed(
    tenant: Tenant, api: Api, op: Client
) -> None:
    definitions.deploy_definition(tenant, "shop-order", wasmtime.wat2wasm(scenario.SHOP_WAT))
    env = DatabaseWorkflowEnvironment(tenant, scenario.SERVICES)
    try:
        run_id = env.run("shop-order", {"item": "book", "amount": 3})
        env.advance(1)
    finally:
        env.close()
    events = api.get(f"/api/v1/workflows/{run_id}/events", {"decoded": "true"}).json()["results"]
    call = next(e for e in events if e["type"] == "call")
    assert call["data"]["req"] == {"item": "book", "amount": 3}
    assert call["data"]["resp"] == {"reserved": "book"}
    assert call["decoded"]["fields"]["request"] == {"item": "book", "amount": 3}
    assert json.loads(call["payload"])["req"] == '{"item": "book", "amount": 3}'  # as stored

    page = op.get(f"{RUNS}{run_id}/change/").content.decode()
    row = page[page.index('id="event-0"') :]
    row = row[: row.index("</tr>")]
    assert "&quot;req&quot;:{&quot;item&quot;:&quot;book&quot;" in row, row
    assert "\\&quot;" not in row

    state = api.get(f"/api/v1/workflows/{run_id}/query", {"key": "stage"}).json()
    assert state["value"] == "charged"


# --- point 7: the API's hints for the usual first mistakes -------------------------------------


def test_a_trailing_slash_gets_a_hint_not_a_bare_404(tenant: Tenant, api: Api) -> None:
    answer = api.post("/api/v1/workflows/", {"definition": "order"})
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "no trailing slash" in message and "POST /api/v1/workflows" in message
    plain = api.post("/api/v1/nothing-here/", {})
    assert plain.status_code == 404 and "trailing slash" not in plain.json()["error"]["message"]


def test_a_form_body_gets_a_415_that_says_to_send_json(tenant: Tenant, api: Api) -> None:
    answer = api.client.post(
        "/api/v1/workflows", {"definition": "order"}, **api.headers
    )  # the test client's default: multipart form data
    assert answer.status_code == 415
    error = answer.json()["error"]
    assert error["code"] == "unsupported_media_type"
    assert "Content-Type: application/json" in error["message"]


def test_an_unknown_definition_name_gets_a_did_you_mean(tenant: Tenant, api: Api) -> None:
    definitions.deploy_definition(tenant, "shop-order", wasmtime.wat2wasm(scenario.SHOP_WAT))
    answer = api.post("/api/v1/workflows", {"definition": "shop-ordr"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "unknown_definition"
    assert "did you mean 'shop-order'?" in answer.json()["error"]["message"]
    far = api.post("/api/v1/workflows", {"definition": "zzz"}).json()["error"]["message"]
    assert far == "no workflow definition named 'zzz'"
    for path in ("/api/v1/definitions/shop-ordr", "/api/v1/definitions/shop-ordr/versions/1"):
        missing = api.get(path)
        assert missing.status_code == 404 and "'shop-order'?" in missing.json()["error"]["message"]


# --- point 6: the console reads well ------------------------------------------------------------


def test_a_retried_call_is_not_drawn_across_the_time_the_run_sat_dead_lettered() -> None:
    from engine.events import AdminActionEvent, CallEvent, encode
    from engine.status import AbiStatus
    from workflows import timeline

    start = 1_767_225_600_000
    rows = [
        encode(CallEvent(step=0, ts=start + 40, service="shop", operation="reserve", request="{}")),
        encode(AdminActionEvent(step=1, ts=start + 3_600_000, action="retry", operator="op")),
        encode(
            CallEvent(
                step=2,
                ts=start + 3_600_300,
                service="shop",
                operation="charge",
                request="{}",
                status=AbiStatus.OK,
            )
        ),
    ]
    items = {i.step: i for i in timeline.build_items(rows, start)}
    assert items[0].start_ms == start
    assert items[2].start_ms == start + 3_600_000  # from the retry, not from step 0
    assert items[2].end_ms == start + 3_600_300


def test_one_spelling_of_a_status_waiting_runs_sizes_and_the_audit_log(
    tenant: Tenant, op: Client
) -> None:

    scenario.OUTAGES.clear()
    runs = scenario.populate(tenant)
    scenario.OUTAGES.clear()
    listing = op.get(RUNS).content.decode()
    instance = op.get(f"{RUNS}{runs['dead'][0]}/change/").content.decode()
    dashboard = op.get("/admin/console/dashboard/").content.decode()
    dlq = op.get("/admin/console/dead-letters/").content.decode()
    for page in (listing, instance, dashboard, dlq):
        text = shown_text(page)
        assert "dead_lettered" not in text and "DEAD_LETTERED" not in text, page
    assert "dead-lettered" in shown_text(instance)

    # A run waiting for a signal is shown waiting, not ready; a sleeping one too.
    waiting = op.get(f"{RUNS}{runs['waiting'][0]}/change/").content.decode()
    assert 'id="run-status"><span class="cleat-status cleat-status-waiting"' in waiting
    assert listing.count('data-status="waiting"') >= 3

    definitions_page = op.get("/admin/workflows/workflowdefinition/").content.decode()
    assert re.search(r"\d+(\.\d)? (B|KiB)</span>", definitions_page)

    retried = op.post(
        f"{RUNS}{runs['dead'][0]}/action/retry/",
        {
            "runs": f"{runs['dead'][0]}:{status_generation(tenant, runs['dead'][0])}",
            "confirm": "yes",
            "reason": "outage over",
        },
    )
    assert retried.status_code == 302
    audit = op.get("/admin/workflows/auditlog/").content.decode()
    assert "{'" not in audit and "error code: error" in audit


def test_the_reason_is_marked_required_and_the_ready_panel_says_nothing_is_due(
    tenant: Tenant, op: Client
) -> None:
    scenario.OUTAGES.clear()
    runs = scenario.populate(tenant)
    form = op.get(f"{RUNS}{runs['waiting'][0]}/action/cancel/").content.decode()
    label = form[form.index('for="id_reason"') - 20 :]
    assert 'class="required"' in label[:200] and "*" in label[:300]
    assert re.search(r'<textarea name="reason"[^>]* required', form)
    dashboard = op.get("/admin/console/dashboard/").content.decode()
    panel = dashboard[dashboard.index("Ready queue per definition") :][:1500]
    assert "Nothing is due" in panel


def shown_text(page: str) -> str:
    """What a page reads as (no style sheet, no markup, no attribute values)."""
    body = re.sub(r"<style.*?</style>|<script.*?</script>|<svg.*?</svg>", " ", page, flags=re.S)
    return re.sub(r"<[^>]+>", " ", body)


def status_generation(tenant: Tenant, run_id: str) -> int:
    with tenant_context(tenant.id):
        return int(WorkflowInstance.objects.get(id=run_id).generation)


def test_schedule_page_buttons_preview_and_the_index_link(tenant: Tenant, op: Client) -> None:
    from schedules import services as schedules
    from schedules.models import Schedule

    definitions.deploy_definition(tenant, "shop-order", wasmtime.wat2wasm(scenario.SHOP_WAT))
    made = schedules.create_schedule(
        tenant, name="nightly", workflow_name="shop-order", cron="30 2 * * *", input="{}"
    )
    page_url = f"/admin/schedules/schedule/{made.pk}/change/"
    page = op.get(page_url).content.decode()
    assert 'id="schedule-trigger"' in page and 'id="schedule-pause"' in page

    triggered = op.post(f"/admin/schedules/schedule/{made.pk}/do/trigger/", follow=True)
    assert "ightly: triggered, 1 started" in triggered.content.decode()
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.filter(definition_name="shop-order").count() == 1
    assert op.get(f"/admin/schedules/schedule/{made.pk}/do/trigger/").status_code == 405

    op.post(f"/admin/schedules/schedule/{made.pk}/do/pause/")
    with tenant_context(tenant.id):
        assert not Schedule.objects.get(pk=made.pk).enabled
    assert 'id="schedule-resume"' in op.get(page_url).content.decode()
    op.post(f"/admin/schedules/schedule/{made.pk}/do/resume/")
    with tenant_context(tenant.id):
        assert Schedule.objects.get(pk=made.pk).enabled

    # An invalid form: the preview is the saved schedule's, not "the cron is empty".
    form = op.get(page_url).context["adminform"].form
    data = {k: ("" if v is None else v) for k, v in form.initial.items() if k in form.fields}
    data.update(cron="", _save="Save")
    rejected = op.post(page_url, data).content.decode()
    assert "errorlist" in rejected
    assert "cannot evaluate" not in rejected and "02:30" in rejected
    added = op.get("/admin/schedules/schedule/add/").content.decode()
    assert "cannot evaluate" not in added

    index = op.get("/admin/").content.decode()
    assert 'id="index-schedules"' in index
    assert 'href="/admin/schedules/schedule/">Schedules</a>' in index


def test_a_run_is_started_from_the_definition_page(tenant: Tenant, op: Client) -> None:
    made = definitions.deploy_definition(tenant, "shop-order", wasmtime.wat2wasm(scenario.SHOP_WAT))
    url = f"/admin/workflows/workflowdefinition/{made.pk}/change/"
    assert 'id="start-run-form"' in op.get(url).content.decode()
    bad = op.post(url, {"op": "start", "input": "{nope"}, follow=True)
    assert "Run not started" in bad.content.decode()
    started = op.post(url, {"op": "start", "input": '{"item": "book", "amount": 2}'})
    assert started.status_code == 302
    run_id = started["Location"].rstrip("/").split("/")[-2]
    with tenant_context(tenant.id):
        run = WorkflowInstance.objects.get(id=run_id)
    assert (run.definition_name, run.definition_version, run.status) == ("shop-order", 1, "ready")
    assert json.loads(run.input) == {"item": "book", "amount": 2}
