"""A lone UTF-16 surrogate (``"\\ud800"`` in JSON) on every database: refused where text
enters (the REST API with a 400 naming the field, the commands with a non-zero exit, the
admin's forms with a form error, the guest with ``guest_fault``), and a row stored with one
before the rule still reads (U+FFFD in its place) instead of failing the tenant's list.
U+0000 spelled as a JSON escape is an ordinary value and round-trips everywhere, PostgreSQL
included."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from tests.fixtures.wat import Wat
from tests.integration.test_api_support import (
    Api,
    error_of,
    key_for,
    promiser,
    signal_waiter,
    updatable,
)
from workflows.models import Role, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

LONE = "\ud800"  # json.dumps writes it as the escape "\ud800"
RUNS = "/admin/workflows/workflowinstance/"


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Any:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def env(tenant: Tenant) -> Any:
    environment = DatabaseWorkflowEnvironment(tenant, {})
    yield environment
    environment.close()


@pytest.fixture
def api(tenant: Tenant) -> Api:
    return Api(key_for(tenant, Role.ADMIN))


@pytest.fixture
def staff(tenant: Tenant) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def _returns(text: str) -> bytes:
    w = Wat()
    w.run(f"(drop (call $set_query_state {w.s('stage')} {w.s(text)}))\n{w.reply(0, text)}")
    return w.wasm()


def _assert_refused(response: Any, field: str) -> None:
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["field"] == field, error
    assert "lone UTF-16 surrogate" in error["message"], error


def test_a_guest_returning_a_lone_surrogate_fails_and_the_tenant_still_reads(
    api: Api, env: DatabaseWorkflowEnvironment, staff: Client
) -> None:
    assert api.deploy("lone", _returns(json.dumps(LONE))).status_code == 201
    run = api.start("lone").json()["id"]
    env.run_until_idle()
    detail = api.get(f"/api/v1/workflows/{run}")
    assert detail.status_code == 200
    body = detail.json()
    assert (body["status"], body["error_code"]) == ("failed", "guest_fault"), body
    assert "lone UTF-16 surrogate" in body["error"]
    assert api.get("/api/v1/workflows").status_code == 200
    assert staff.get(f"{RUNS}{run}/change/").status_code == 200


def test_a_row_stored_with_a_lone_surrogate_reads_with_a_replacement_character(
    api: Api, tenant: Tenant, staff: Client
) -> None:
    assert api.deploy("waiter", signal_waiter()).status_code == 201
    run_id = api.start("waiter").json()["id"]
    escaped = json.dumps({"name": LONE})  # the text holds the escape, so every backend takes it
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run_id).update(
            status="done", input=escaped, result=escaped, query_state={"stage": escaped}
        )
        run = WorkflowInstance.objects.get(id=run_id)
    listed = api.get("/api/v1/workflows")
    assert listed.status_code == 200, listed.content
    detail = api.get(f"/api/v1/workflows/{run.id}").json()
    assert detail["result"] == detail["input"] == {"name": "\ufffd"}
    assert detail["query_state"] == {"stage": {"name": "\ufffd"}}
    query = api.get(f"/api/v1/workflows/{run.id}/query", {"key": "stage"})
    assert query.status_code == 200 and query.json()["value"] == {"name": "\ufffd"}
    page = staff.get(f"{RUNS}{run.id}/change/")
    assert page.status_code == 200
    assert "\ufffd" in page.content.decode()
    assert staff.get(RUNS).status_code == 200


def test_a_lone_surrogate_in_api_input_is_a_400_naming_the_field(
    api: Api, env: DatabaseWorkflowEnvironment
) -> None:
    for name, wasm in (("waiter", signal_waiter()), ("promiser", promiser())):
        assert api.deploy(name, wasm).status_code == 201
    assert api.deploy("updatable", updatable()).status_code == 201
    _assert_refused(api.start("waiter", {"name": LONE}), "input")
    _assert_refused(api.start("waiter", [LONE]), "input")
    _assert_refused(api.start("waiter", {LONE: 1}), "input")
    waiter = api.start("waiter").json()["id"]
    promised = api.start("promiser").json()["id"]
    updated = api.start("updatable").json()["id"]
    env.run_until_idle()
    _assert_refused(
        api.post(f"/api/v1/workflows/{waiter}/signal", {"name": "go", "payload": LONE}), "payload"
    )
    promise = api.get(f"/api/v1/workflows/{promised}/query", {"key": "promise"}).json()["value"]
    _assert_refused(api.post(f"/api/v1/promises/{promise}/resolve", {"value": LONE}), "value")
    _assert_refused(
        api.post(
            f"/api/v1/workflows/{updated}/update",
            {"name": "on_add", "payload": LONE, "wait_seconds": 0},
        ),
        "payload",
    )
    generation = api.get(f"/api/v1/workflows/{waiter}").json()["generation"]
    _assert_refused(
        api.post(
            f"/api/v1/workflows/{waiter}/force-complete",
            {"generation": generation, "result": LONE},
        ),
        "result",
    )
    schedule = {"name": "s", "workflow_name": "waiter", "cron": "0 * * * *", "input": [LONE]}
    _assert_refused(api.post("/api/v1/schedules", schedule), "input")
    # A surrogate in a key of the body itself: refused without echoing the key.
    keyed = api.post("/api/v1/workflows", {"definition": "waiter", LONE: 1})
    assert keyed.status_code == 400 and "lone UTF-16 surrogate" in error_of(keyed)["message"]
    # Nothing was stored: the tenant's list reads, and only the three good runs exist.
    assert len(api.get("/api/v1/workflows").json()["results"]) == 3
    assert api.get("/api/v1/schedules").json()["results"] == []


def test_a_valid_pair_and_an_escaped_nul_round_trip(api: Api) -> None:
    assert api.deploy("waiter", signal_waiter()).status_code == 201
    value = {"emoji": "\U0001f600", "nul": "a\x00b", "backslash": "\\ud800"}
    started = api.start("waiter", value)
    assert started.status_code == 201, started.content
    assert api.get(f"/api/v1/workflows/{started.json()['id']}").json()["input"] == value


def test_start_workflow_refuses_a_lone_surrogate_and_deep_input(api: Api) -> None:
    assert api.deploy("waiter", signal_waiter()).status_code == 201
    with pytest.raises(CommandError, match="--input contains a lone UTF-16 surrogate"):
        call_command("start_workflow", "waiter", "--input", '"\\ud800"', stdout=io.StringIO())
    with pytest.raises(CommandError, match="--input is nested too deeply"):
        call_command("start_workflow", "waiter", "--input", "[" * 5000 + "]" * 5000)
    assert api.get("/api/v1/workflows").json()["results"] == []


def test_the_admins_json_forms_refuse_a_lone_surrogate(
    api: Api, env: DatabaseWorkflowEnvironment, staff: Client, tenant: Tenant
) -> None:
    assert api.deploy("waiter", signal_waiter()).status_code == 201
    run = api.start("waiter").json()["id"]
    env.run_until_idle()
    generation = api.get(f"/api/v1/workflows/{run}").json()["generation"]
    for action, data in (
        ("force_complete", {"result": '"\\ud800"'}),
        ("signal", {"name": "go", "payload": '["\\udc00"]'}),
    ):
        response = staff.post(
            f"{RUNS}{run}/action/{action}/",
            {"runs": f"{run}:{generation}", "reason": "r", **data},
        )
        assert response.status_code == 400, (action, response.status_code)
        assert "lone UTF-16 surrogate" in response.content.decode()
    assert api.get(f"/api/v1/workflows/{run}").json()["status"] != "done"


def test_a_guest_error_with_a_raw_nul_fails_the_run_with_a_readable_message(
    api: Api, env: DatabaseWorkflowEnvironment
) -> None:
    """PostgreSQL refuses U+0000 in a text column: the message keeps everything else."""
    w = Wat()
    w.run(w.reply(2, "bad\x00thing"))
    assert api.deploy("nul", w.wasm()).status_code == 201
    run = api.start("nul").json()["id"]
    env.run_until_idle(max_segments=10)
    body = api.get(f"/api/v1/workflows/{run}").json()
    assert (body["status"], body["error_code"], body["error"]) == (
        "failed",
        "permanent",
        "bad\ufffdthing",
    )
