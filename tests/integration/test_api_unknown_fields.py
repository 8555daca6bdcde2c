"""Every write endpoint refuses a field it does not know with a 400 naming it (a typo would
otherwise be dropped silently: ``inptu`` would start a run without its input), and a body
nested deeper than the JSON parser reads is a 400, not a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache

from tests.integration.test_api_support import Api, error_of, key_for, promiser, signal_waiter
from workflows.models import Role, Tenant
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api(tenant: Tenant) -> Any:
    cache.clear()
    yield Api(key_for(tenant, Role.ADMIN))
    cache.clear()


def _refused(response: Any, field: str) -> None:
    assert response.status_code == 400, (response.status_code, response.content)
    error = error_of(response)
    assert error["field"] == field, error
    assert "not a field of" in error["message"], error


def test_every_write_endpoint_refuses_unknown_fields(api: Api, tenant: Tenant) -> None:
    assert api.deploy("waiter", signal_waiter()).status_code == 201
    assert api.deploy("promiser", promiser()).status_code == 201
    refused = api.start("waiter", {"a": 1}, inptu={"a": 1})
    _refused(refused, "inptu")
    run = api.start("waiter").json()["id"]
    promised = api.start("promiser").json()["id"]
    env = DatabaseWorkflowEnvironment(tenant, {})
    try:
        env.run_until_idle()
    finally:
        env.close()
    generation = api.get(f"/api/v1/workflows/{run}").json()["generation"]
    promise = api.get(f"/api/v1/workflows/{promised}/query", {"key": "promise"}).json()["value"]
    runs = f"/api/v1/workflows/{run}"
    bodies: list[tuple[str, str, dict[str, Any], str]] = [
        ("post", f"{runs}/signal", {"name": "go", "paylaod": 1}, "paylaod"),
        ("post", f"{runs}/update", {"name": "u", "wait": 1}, "wait"),
        ("post", f"{runs}/cancel", {"reason": "r", "force": True}, "force"),
        ("post", f"{runs}/pause", {"why": "r"}, "why"),
        ("post", f"{runs}/force-complete", {"generation": generation, "reslt": 1}, "reslt"),
        ("post", f"{runs}/force-fail", {"generation": generation, "message": "m", "x": 1}, "x"),
        ("post", f"{runs}/re-replay", {"generation": generation, "x": 1}, "x"),
        ("post", f"/api/v1/promises/{promise}/resolve", {"valeu": 1}, "valeu"),
        ("post", f"/api/v1/promises/{promise}/reject", {"message": "m", "code": 1}, "code"),
        ("post", "/api/v1/definitions/waiter/tags", {"tag": "t", "version": 1, "x": 1}, "x"),
        ("put", "/api/v1/definitions/waiter/routing", {"rules": [], "x": 1}, "x"),
        ("post", "/api/v1/definitions/gc", {"dry_run": True, "keep": 1}, "keep"),
        ("post", "/api/v1/definitions/waiter/versions/1/deprecate", {"x": 1}, "x"),
        ("post", "/api/v1/schedules/preview", {"cron": "* * * * *", "x": 1}, "x"),
    ]
    for method, path, body, field in bodies:
        _refused(getattr(api, method)(path, body), field)
    nested = api.put(
        "/api/v1/definitions/waiter/routing", {"rules": [{"version": 1, "weight": 1, "w": 2}]}
    )
    _refused(nested, "rules.0.w")
    # Nothing happened: the run still waits, the promise is pending, no tag, no deprecation.
    assert api.get(runs).json()["status"] == "ready"
    assert api.get(f"/api/v1/promises/{promise}").json()["status"] == "pending"
    assert api.get("/api/v1/definitions/waiter/tags").json() == []
    assert api.get("/api/v1/definitions/waiter/versions/1").json()["deprecated"] is False
    # The raw-body deploy's options are query parameters: the same rule.
    raw = api.raw(
        "POST", "/api/v1/definitions?name=w2&verison=3", signal_waiter(), "application/wasm"
    )
    _refused(raw, "verison")


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_a_deeply_nested_body_is_a_400(api: Api, depth: int) -> None:
    body = '{"definition": "waiter", "input": ' + "[" * depth + "]" * depth + "}"
    response = api.raw("POST", "/api/v1/workflows", body, "application/json")
    assert response.status_code == 400, response.content
    assert error_of(response)["code"] == "invalid_json"
    assert "nested too deeply" in error_of(response)["message"]
