"""What a new operator meets in the first hour (issue 18): retrying a run that failed on a
service configured wrongly, event payloads and query state as JSON (not strings of JSON),
and the API's hints for the usual first mistakes."""

from __future__ import annotations

import io
import json
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
