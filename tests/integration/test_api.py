"""The REST API end to end through Django's test client, on every database: keys and roles,
definitions, runs and their actions, promises, updates, errors in one shape, redaction,
throttling, /healthz and /metrics. Runs are executed by the in-process database worker
(``DatabaseWorkflowEnvironment``)."""

from __future__ import annotations

import io
import itertools
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client, override_settings
from django.utils import timezone

from tests.integration.test_api_support import (
    Api,
    demo_wasm,
    error_of,
    key_for,
    promiser,
    signal_waiter,
    updatable,
)
from workflows import definitions, services
from workflows.api.keys import revoke_api_key
from workflows.models import ApiKey, AuditLog, Role, Tenant, WorkflowDefinition
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    environment = DatabaseWorkflowEnvironment(tenant, {"demo": "workflows.demo"})
    yield environment
    environment.close()


@pytest.fixture
def admin_api(tenant: Tenant) -> Api:
    return Api(key_for(tenant, Role.ADMIN))


@pytest.fixture
def deployed(admin_api: Api) -> Api:
    assert admin_api.deploy("waiter", signal_waiter()).status_code == 201
    assert admin_api.deploy("demo-order", demo_wasm()).status_code == 201
    return admin_api


# --- authentication and roles --------------------------------------------------------------------


def test_requests_without_a_valid_key_get_401(tenant: Tenant) -> None:
    plaintext = key_for(tenant, Role.READ_ONLY)
    for api in (Api(None), Api("clt_not-a-key"), Api("not even the prefix")):
        response = api.get("/api/v1/workflows")
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert error_of(response)["code"] in ("not_authenticated", "authentication_failed")
    malformed = Client().get("/api/v1/workflows", HTTP_AUTHORIZATION="Bearer a b")
    assert malformed.status_code == 401
    browser = Client().get("/api/v1/workflows", HTTP_ACCEPT="text/html")
    assert browser.status_code == 401  # the browsable API's page, not a 500
    assert Api(plaintext).get("/api/v1/workflows").status_code == 200


def test_a_revoked_key_gets_401(tenant: Tenant) -> None:
    with tenant_context(tenant.id):
        from workflows.api.keys import issue_api_key

        key, plaintext = issue_api_key(tenant, "soon revoked", Role.OPERATOR)
    api = Api(plaintext)
    assert api.get("/api/v1/workflows").status_code == 200
    revoke_api_key(tenant, key.id)
    response = api.get("/api/v1/workflows")
    assert response.status_code == 401
    assert "revoked" in error_of(response)["message"]


def test_a_deactivated_tenants_keys_get_401(tenant: Tenant, other_tenant: Tenant) -> None:
    api = Api(key_for(other_tenant, Role.ADMIN))
    assert api.get("/api/v1/workflows").status_code == 200
    Tenant.objects.filter(id=other_tenant.id).update(is_active=False)
    assert api.get("/api/v1/workflows").status_code == 401


def test_roles_read_only_operator_admin(tenant: Tenant, deployed: Api) -> None:
    reader = Api(key_for(tenant, Role.READ_ONLY, "reader"))
    operator = Api(key_for(tenant, Role.OPERATOR, "operator"))
    assert reader.get("/api/v1/definitions").status_code == 200
    refused = reader.start("waiter")
    assert refused.status_code == 403
    assert "operator role" in error_of(refused)["message"]
    started = operator.start("waiter")
    assert started.status_code == 201
    run = started.json()
    assert reader.get(f"/api/v1/workflows/{run['id']}").status_code == 200
    # Definitions and force operations are the admin's.
    assert operator.deploy("waiter", signal_waiter()).status_code == 403
    forced = operator.post(
        f"/api/v1/workflows/{run['id']}/force-fail",
        {"generation": run["generation"], "message": "no"},
    )
    assert forced.status_code == 403
    assert operator.post(f"/api/v1/workflows/{run['id']}/pause").status_code == 200
    assert (
        deployed.post(
            f"/api/v1/workflows/{run['id']}/force-fail",
            {"generation": run["generation"], "message": "stop"},
        ).json()["status"]
        == "failed"
    )


def test_audit_names_the_key(tenant: Tenant, deployed: Api) -> None:
    run = deployed.start("waiter").json()
    deployed.post(f"/api/v1/workflows/{run['id']}/terminate", {"reason": "test"})
    with tenant_context(tenant.id):
        entry = AuditLog.objects.get(instance_id=run["id"], action="terminate")
    assert entry.operator == "api-key:test"
    assert entry.reason == "test"


def test_staff_users_use_the_browsable_api_in_their_session_tenant(
    tenant: Tenant, other_tenant: Tenant, env: DatabaseWorkflowEnvironment
) -> None:
    definitions.deploy_definition(tenant, "waiter", signal_waiter())
    definitions.deploy_definition(other_tenant, "waiter", signal_waiter())
    mine, _ = services.start_workflow(tenant, "waiter")
    theirs, _ = services.start_workflow(other_tenant, "waiter")
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    page = client.get("/api/v1/workflows", HTTP_ACCEPT="text/html")
    assert page.status_code == 200
    assert "text/html" in page["Content-Type"]
    listed = client.get("/api/v1/workflows").json()["results"]
    assert [r["id"] for r in listed] == [str(mine.id)]
    session = client.session
    session["cleat_tenant"] = str(other_tenant.id)
    session.save()
    listed = client.get("/api/v1/workflows").json()["results"]
    assert [r["id"] for r in listed] == [str(theirs.id)]
    # Unsafe methods need the CSRF token like any session request.
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(user)
    refused = csrf_client.post(f"/api/v1/workflows/{theirs.id}/pause", "{}", "application/json")
    assert refused.status_code == 403
    # A user who is not staff is not let in.
    plain = get_user_model().objects.create_user("someone", "s@example.com", "pw-12345678")
    client.force_login(plain)
    assert client.get("/api/v1/workflows").status_code == 401


def test_bound_staff_users_get_their_tenant_and_their_console_role(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    from django.contrib.auth.models import Permission

    from workflows.models import StaffTenant

    definitions.deploy_definition(other_tenant, "waiter", signal_waiter())
    theirs, _ = services.start_workflow(other_tenant, "waiter")
    staff = get_user_model().objects.create_user("bound", "b@example.com", "pw", is_staff=True)
    StaffTenant.objects.create(user=staff, tenant=other_tenant)
    client = Client()
    client.force_login(staff)
    # Without a console permission on runs, no API either.
    assert client.get("/api/v1/workflows").status_code == 403
    staff.user_permissions.add(Permission.objects.get(codename="view_workflowinstance"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))
    # A crafted tenant choice in the session is ignored for a bound user.
    session = client.session
    session["cleat_tenant"] = str(tenant.id)
    session.save()
    listed = client.get("/api/v1/workflows").json()["results"]
    assert [r["id"] for r in listed] == [str(theirs.id)]
    refused = client.post(f"/api/v1/workflows/{theirs.id}/pause", "{}", "application/json")
    assert refused.status_code == 403  # read-only without the console's operate permission
    staff.user_permissions.add(Permission.objects.get(codename="change_workflowinstance"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))
    paused = client.post(f"/api/v1/workflows/{theirs.id}/pause", "{}", "application/json")
    assert paused.status_code == 200 and paused.json()["status"] == "paused"
    unbound = get_user_model().objects.create_user("loose", "l@example.com", "pw", is_staff=True)
    client.force_login(unbound)
    assert client.get("/api/v1/workflows").status_code == 401


# --- definitions ---------------------------------------------------------------------------------


def test_deploy_by_raw_body_and_multipart_and_refuse_invalid_wasm(admin_api: Api) -> None:
    raw = admin_api.deploy("demo-order", demo_wasm())
    assert raw.status_code == 201
    assert raw.json()["version"] == 1
    assert "wasm" not in raw.json()
    upload = io.BytesIO(demo_wasm())
    upload.name = "order.wasm"
    multipart = admin_api.client.post(
        "/api/v1/definitions",
        {"name": "demo-order", "wasm": upload, "retry_max_attempts": "5"},
        **admin_api.headers,
    )
    assert multipart.status_code == 201, multipart.content
    assert multipart.json()["version"] == 2
    assert multipart.json()["retry_max_attempts"] == 5
    bad = admin_api.deploy("broken", b"\x00asm\x01\x00\x00\x00garbage")
    assert bad.status_code == 400
    error = error_of(bad)
    assert error["field"] == "wasm"
    assert error["message"]  # wasmtime's reason
    assert admin_api.deploy("bad name!", demo_wasm()).status_code == 400
    missing_name = admin_api.raw("POST", "/api/v1/definitions", demo_wasm(), "application/wasm")
    assert error_of(missing_name)["field"] == "name"
    as_json = admin_api.post("/api/v1/definitions", {"name": "x"})
    assert as_json.status_code == 415
    assert error_of(as_json)["code"] == "unsupported_media_type"


def test_definition_listing_versions_metadata_and_download(admin_api: Api) -> None:
    wasm = demo_wasm()
    for _ in range(3):
        admin_api.deploy("demo-order", wasm)
    admin_api.deploy("waiter", signal_waiter())
    listed = admin_api.get("/api/v1/definitions", {"limit": 2})
    assert listed.status_code == 200
    page = listed.json()
    assert len(page["results"]) == 2 and page["next"]
    names = admin_api.get("/api/v1/definitions", {"name": "demo-order"}).json()["results"]
    assert [d["version"] for d in names] == [3, 2, 1]
    summary = admin_api.get("/api/v1/definitions/demo-order").json()
    assert summary["latest_version"] == 3
    assert summary["versions"] == [1, 2, 3]
    versions = admin_api.get("/api/v1/definitions/demo-order/versions").json()["results"]
    assert [v["version"] for v in versions] == [3, 2, 1]
    meta = admin_api.get("/api/v1/definitions/demo-order/versions/2").json()
    assert meta["entry_points"] == ["run"]
    assert meta["active_runs"] == 0
    assert "wasm" not in meta
    download = admin_api.get("/api/v1/definitions/demo-order/versions/2/download")
    assert download.status_code == 200
    assert download["Content-Type"] == "application/wasm"
    assert download.content == wasm
    assert admin_api.get("/api/v1/definitions/demo-order/versions/9").status_code == 404
    assert admin_api.get("/api/v1/definitions/nothing").status_code == 404


def test_deprecate_restore_and_purge(admin_api: Api, tenant: Tenant) -> None:
    admin_api.deploy("waiter", signal_waiter())
    admin_api.deploy("waiter", signal_waiter())
    run = admin_api.start("waiter", version=1).json()
    base = "/api/v1/definitions/waiter/versions/1"
    not_deprecated = admin_api.post(f"{base}/purge")
    assert not_deprecated.status_code == 409
    assert admin_api.post(f"{base}/deprecate", {"reason": "old"}).json()["deprecated"] is True
    active = admin_api.post(f"{base}/purge")
    assert active.status_code == 409
    assert "active" in error_of(active)["message"]
    assert admin_api.post(f"{base}/restore").json()["deprecated"] is False
    admin_api.post(f"{base}/deprecate")
    # New starts skip the deprecated version; an explicit version still works.
    assert admin_api.start("waiter").json()["version"] == 2
    admin_api.post(f"/api/v1/workflows/{run['id']}/terminate")
    purged = admin_api.post(f"{base}/purge")
    assert purged.status_code == 200, purged.content
    assert purged.json() == {"name": "waiter", "version": 1, "runs_deleted": 1}
    assert admin_api.get(base).status_code == 404
    assert admin_api.get(f"/api/v1/workflows/{run['id']}").status_code == 404
    with tenant_context(tenant.id):
        assert AuditLog.objects.filter(action="purge_definition").count() == 1


def test_tags_and_weighted_routing(admin_api: Api) -> None:
    for _ in range(3):
        admin_api.deploy("waiter", signal_waiter())
    tagged = admin_api.post("/api/v1/definitions/waiter/tags", {"tag": "stable", "version": 2})
    assert tagged.json() == {"tag": "stable", "version": 2}
    assert admin_api.get("/api/v1/definitions/waiter/tags").json() == [
        {"tag": "stable", "version": 2}
    ]
    assert admin_api.get("/api/v1/definitions/waiter/tags/stable").json()["version"] == 2
    assert admin_api.start("waiter", tag="stable").json()["version"] == 2
    bad_tag = admin_api.post("/api/v1/definitions/waiter/tags", {"tag": "x", "version": 7})
    assert bad_tag.status_code == 404
    both = admin_api.start("waiter", tag="stable", version=1)
    assert both.status_code == 400 and error_of(both)["field"] == "tag"
    assert admin_api.delete("/api/v1/definitions/waiter/tags/stable").status_code == 204
    assert admin_api.get("/api/v1/definitions/waiter/tags/stable").status_code == 404
    unknown_tag = admin_api.start("waiter", tag="stable")
    assert unknown_tag.status_code == 400
    assert error_of(unknown_tag) == {
        "code": "unknown_definition",
        "message": "waiter has no tag 'stable'",
        "field": "tag",
    }

    rules = {"rules": [{"version": 1, "weight": 0}, {"version": 3, "weight": 1}]}
    assert admin_api.put("/api/v1/definitions/waiter/routing", rules).status_code == 200
    assert admin_api.get("/api/v1/definitions/waiter/routing").json() == {
        "rules": [{"version": 1, "weight": 0.0}, {"version": 3, "weight": 1.0}]
    }
    assert {admin_api.start("waiter").json()["version"] for _ in range(5)} == {3}
    for bad in (
        {"rules": [{"version": 9, "weight": 1}]},
        {"rules": [{"version": 1, "weight": 0}]},
        {"rules": [{"version": 1, "weight": -1}]},
        {"rules": [{"version": 1, "weight": 1}, {"version": 1, "weight": 2}]},
    ):
        refused = admin_api.put("/api/v1/definitions/waiter/routing", bad)
        assert refused.status_code == 400, bad
        assert error_of(refused)["field"].startswith("rules")
    assert admin_api.put("/api/v1/definitions/waiter/routing", {"rules": []}).json() == {
        "rules": []
    }


def test_version_gc_dry_run_then_real_and_stale_alerts(admin_api: Api, tenant: Tenant) -> None:
    for _ in range(5):
        admin_api.deploy("waiter", signal_waiter())
    for version in (1, 2, 3):
        admin_api.post(f"/api/v1/definitions/waiter/versions/{version}/deprecate")
    old = timezone.now() - timedelta(days=200)
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant=tenant, version__lte=4).update(created_at=old)
    run = admin_api.start("waiter", version=1).json()
    admin_api.post("/api/v1/definitions/waiter/tags", {"tag": "pinned", "version": 2})

    stale = admin_api.get("/api/v1/definitions/stale").json()
    by_version = {a["version"]: a for a in stale}
    assert set(by_version) == {2, 3}  # deprecated, old, no active run
    assert "can be purged" in by_version[3]["message"]
    assert admin_api.get("/api/v1/definitions/stale", {"stale_after_days": "x"}).status_code == 400

    dry = admin_api.post("/api/v1/definitions/gc", {"min_versions_to_keep": 2})
    assert dry.status_code == 200
    report = dry.json()
    assert report["dry_run"] is True
    assert [r["version"] for r in report["removed"]] == [3]
    skipped = {r["version"]: r["reason"] for r in report["skipped"]}
    assert "active" in skipped[1] and "tag" in skipped[2]
    assert admin_api.get("/api/v1/definitions/waiter/versions/3").status_code == 200
    real = admin_api.post("/api/v1/definitions/gc", {"min_versions_to_keep": 2, "dry_run": False})
    assert [r["version"] for r in real.json()["removed"]] == [3]
    assert admin_api.get("/api/v1/definitions/waiter/versions/3").status_code == 404
    assert admin_api.get(f"/api/v1/workflows/{run['id']}").status_code == 200
    # Version 1 still runs: a migration candidate once a newer version exists.
    WorkflowDefinition.objects.filter(version=1)  # (kept: the run is active)
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant=tenant, version=1).update(deprecated=False)
    alerts = {a["version"]: a for a in admin_api.get("/api/v1/definitions/stale").json()}
    assert "migrating" in alerts[1]["message"] and alerts[1]["active_instances"] == 1


# --- runs ----------------------------------------------------------------------------------------


def test_start_is_idempotent_with_a_key(deployed: Api) -> None:
    first = deployed.start("waiter", {"n": 1}, idempotency_key="order-7", priority=5)
    assert first.status_code == 201
    run = first.json()
    assert run["status"] == "ready" and run["priority"] == 5 and run["input"] == {"n": 1}
    again = deployed.start("waiter", {"n": 2}, idempotency_key="order-7")
    assert again.status_code == 200
    assert again.json()["id"] == run["id"]
    assert deployed.start("waiter", {"n": 1}).json()["id"] != run["id"]


def test_the_demo_order_through_the_api(deployed: Api, env: DatabaseWorkflowEnvironment) -> None:
    run = deployed.start("demo-order", {"customer": "ada"}).json()
    env.run_until_idle()
    waiting = deployed.get(f"/api/v1/workflows/{run['id']}").json()
    assert waiting["status"] == "ready"
    assert waiting["waiting_on"]["signals"] == ["paid"]
    assert deployed.get(f"/api/v1/workflows/{run['id']}/query", {"key": "stage"}).json() == {
        "key": "stage",
        "value": "reserved",
    }
    sent = deployed.post(
        f"/api/v1/workflows/{run['id']}/signal", {"name": "paid", "payload": {"amount": 12}}
    )
    assert sent.status_code == 202
    assert sent.json()["name"] == "paid" and sent.json()["payload"] == {"amount": 12}
    env.run_until_idle()
    env.advance(seconds=3)
    done = deployed.get(f"/api/v1/workflows/{run['id']}").json()
    assert done["status"] == "done"
    assert done["result"]["charged"] == 12
    events = deployed.get(f"/api/v1/workflows/{run['id']}/events", {"limit": 2})
    page = events.json()
    assert [e["type"] for e in page["results"]] == ["call", "await_signals"]
    assert page["results"][0]["decoded"] is None
    rest = deployed.client.get(page["next"], **deployed.headers).json()
    assert rest["results"][0]["step"] == 2
    decoded = deployed.get(f"/api/v1/workflows/{run['id']}/events", {"decoded": "true"}).json()
    first = decoded["results"][0]["decoded"]
    assert first["fields"]["service"] == "demo" and first["fields"]["operation"] == "reserve"
    assert first["description"].startswith("call(demo, reserve")
    assert deployed.get(f"/api/v1/workflows/{run['id']}/query", {"key": "nope"}).status_code == 404


def test_listing_filters_search_and_cursor_pagination(
    deployed: Api, env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    runs = [deployed.start("waiter", {"order": n}).json()["id"] for n in range(5)]
    deployed.start("demo-order", {"customer": "grace"})
    failed = runs[0]
    deployed.post(
        f"/api/v1/workflows/{failed}/force-fail",
        {"generation": 0, "message": "card declined", "code": "permanent"},
    )

    def ids(**params: Any) -> list[str]:
        response = deployed.get("/api/v1/workflows", params)
        assert response.status_code == 200, response.content
        return [r["id"] for r in response.json()["results"]]

    assert len(ids()) == 6
    assert ids(status="failed") == [failed]
    assert ids(error_code="permanent") == [failed]
    assert len(ids(definition="waiter")) == 5
    assert len(ids(definition="waiter", version=1)) == 5 and ids(version=2) == []
    assert ids(search="declined") == [failed]
    assert len(ids(search="grace")) == 1
    assert ids(created_after=(timezone.now() + timedelta(minutes=1)).isoformat()) == []
    assert len(ids(created_before=(timezone.now() + timedelta(minutes=1)).isoformat())) == 6
    for bad in ({"status": "bogus"}, {"version": "x"}, {"created_after": "yesterday"}):
        response = deployed.get("/api/v1/workflows", bad)
        assert response.status_code == 400
        assert error_of(response)["field"] == next(iter(bad))
    seen: list[str] = []
    page = deployed.get("/api/v1/workflows", {"limit": 4}).json()
    while True:
        seen += [r["id"] for r in page["results"]]
        if not page["next"]:
            break
        page = deployed.client.get(page["next"], **deployed.headers).json()
    assert len(seen) == len(set(seen)) == 6
    assert deployed.get("/api/v1/workflows", {"cursor": "garbage"}).status_code == 400
    assert deployed.get("/api/v1/workflows", {"limit": 0}).status_code == 400


def test_cancel_terminate_pause_resume_retry_and_illegal_transitions(deployed: Api) -> None:
    run = deployed.start("waiter").json()["id"]
    path = f"/api/v1/workflows/{run}"
    assert deployed.post(f"{path}/pause").json()["status"] == "paused"
    assert error_of(deployed.post(f"{path}/pause"))["code"] == "conflict"
    assert deployed.post(f"{path}/resume").json()["status"] == "ready"
    assert deployed.post(f"{path}/cancel", {"reason": "no longer needed"}).json()[
        "cancel_requested"
    ]
    terminated = deployed.post(f"{path}/terminate")
    assert terminated.json()["status"] == "terminated"
    again = deployed.post(f"{path}/terminate")
    assert again.status_code == 409
    assert error_of(again)["code"] == "conflict"
    assert deployed.post(f"{path}/signal", {"name": "go"}).status_code == 409
    assert deployed.post(f"{path}/retry").status_code == 409
    other = deployed.start("waiter").json()
    failed = deployed.post(
        f"/api/v1/workflows/{other['id']}/force-fail",
        {"generation": other["generation"], "message": "boom"},
    ).json()
    retried = deployed.post(f"/api/v1/workflows/{other['id']}/retry").json()
    assert retried["status"] == "ready" and retried["generation"] == failed["generation"] + 1


def test_force_operations_check_the_generation(
    deployed: Api, env: DatabaseWorkflowEnvironment
) -> None:
    run = deployed.start("waiter").json()
    env.run_until_idle()
    current = deployed.get(f"/api/v1/workflows/{run['id']}").json()
    assert current["generation"] == 1
    stale = deployed.post(
        f"/api/v1/workflows/{run['id']}/force-complete", {"generation": 0, "result": {"ok": 1}}
    )
    assert stale.status_code == 409
    assert error_of(stale)["field"] == "generation"
    missing = deployed.post(f"/api/v1/workflows/{run['id']}/force-complete", {"result": 1})
    assert missing.status_code == 400 and error_of(missing)["field"] == "generation"
    done = deployed.post(
        f"/api/v1/workflows/{run['id']}/force-complete",
        {"generation": 1, "result": {"ok": 1}, "reason": "manual"},
    ).json()
    assert done["status"] == "done" and done["result"] == {"ok": 1}
    replayed = deployed.post(
        f"/api/v1/workflows/{run['id']}/re-replay", {"generation": done["generation"]}
    ).json()
    assert replayed["status"] == "ready"
    env.run_until_idle()
    assert deployed.get(f"/api/v1/workflows/{run['id']}").json()["status"] == "ready"
    bad_code = deployed.post(
        f"/api/v1/workflows/{run['id']}/force-fail",
        {"generation": replayed["generation"] + 1, "message": "x", "code": "nope"},
    )
    assert bad_code.status_code == 400 and error_of(bad_code)["field"] == "code"


def test_promises_get_resolve_reject(admin_api: Api, env: DatabaseWorkflowEnvironment) -> None:
    admin_api.deploy("promiser", promiser())
    first = admin_api.start("promiser").json()["id"]
    second = admin_api.start("promiser").json()["id"]
    env.run_until_idle()
    promise = admin_api.get(f"/api/v1/workflows/{first}/query", {"key": "promise"}).json()["value"]
    read = admin_api.get(f"/api/v1/promises/{promise}").json()
    assert read["status"] == "pending" and read["run_id"] == first and read["name"] == "approval"
    resolved = admin_api.post(f"/api/v1/promises/{promise}/resolve", {"value": {"ok": True}})
    assert resolved.json()["status"] == "resolved" and resolved.json()["value"] == {"ok": True}
    assert admin_api.post(f"/api/v1/promises/{promise}/reject", {"message": "x"}).status_code == 409
    other = admin_api.get(f"/api/v1/workflows/{second}/query", {"key": "promise"}).json()["value"]
    rejected = admin_api.post(f"/api/v1/promises/{other}/reject", {"message": "denied"}).json()
    assert rejected["status"] == "rejected" and rejected["error"] == "denied"
    assert admin_api.post(f"/api/v1/promises/{other}/reject", {}).status_code == 400
    env.run_until_idle()
    assert env.result(first) == [[0, '{"ok":true}']]
    assert env.status(second) == "done"
    assert admin_api.get("/api/v1/promises/00000000-0000-0000-0000-000000000001").status_code == 404


def test_update_waits_for_the_handlers_answer(
    admin_api: Api, env: DatabaseWorkflowEnvironment
) -> None:
    admin_api.deploy("updatable", updatable())
    run = admin_api.start("updatable").json()["id"]
    env.run_until_idle()
    queued = admin_api.post(
        f"/api/v1/workflows/{run}/update", {"name": "on_add", "payload": 1, "wait_seconds": 0}
    )
    assert queued.status_code == 202 and queued.json()["status"] == "pending"

    stop = threading.Event()

    def worker() -> None:
        from django.db import connection

        try:
            while not stop.is_set():
                env.run_until_idle()
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        answered = admin_api.post(
            f"/api/v1/workflows/{run}/update",
            {"name": "on_add", "payload": {"n": 2}, "wait_seconds": 20},
        )
    finally:
        stop.set()
        thread.join(timeout=30)
    assert answered.status_code == 200, answered.content
    assert answered.json()["status"] == "done"
    assert answered.json()["result"] == {"seen": {"n": 2}}
    too_long = admin_api.post(f"/api/v1/workflows/{run}/update", {"name": "x", "wait_seconds": 99})
    assert too_long.status_code == 400 and error_of(too_long)["field"] == "wait_seconds"


def test_children_and_continue_as_new_chain(
    admin_api: Api, env: DatabaseWorkflowEnvironment
) -> None:
    from tests.fixtures.wat import Wat

    child = Wat()
    child.run("(call $recn (call $durable_sleep (i64.const 1))) (call $finish)")
    parent = Wat()
    parent.run(
        f"""
    (local.set $c (call $child_workflow {parent.s("child")} {parent.js({"k": 1})}))
    (call $rec (call $await_child {parent.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    looper = Wat()  # continues as new for ever, one run per segment
    looper.run(f"(drop (call $continue_as_new {looper.js(1)})) (unreachable)")
    admin_api.deploy("child", child.wasm())
    admin_api.deploy("parent", parent.wasm())
    admin_api.deploy("looper", looper.wasm())
    run = admin_api.start("parent").json()["id"]
    env.run_until_idle()
    children = admin_api.get(f"/api/v1/workflows/{run}/children").json()["results"]
    assert len(children) == 1 and children[0]["definition"] == "child"
    assert children[0]["parent"] == run

    first = admin_api.start("looper").json()["id"]
    for _ in range(3):
        env.step()
    chain = admin_api.get(f"/api/v1/workflows/{first}/chain").json()["results"]
    assert len(chain) >= 3
    assert chain[0]["id"] == first
    for earlier, later in itertools.pairwise(chain):
        assert earlier["continued_as"] == later["id"]
        assert later["continued_from"] == earlier["id"]
    assert (
        admin_api.get(f"/api/v1/workflows/{chain[-1]['id']}/chain").json()["results"][0]["id"]
        == first
    )


def test_a_detached_run_names_the_run_that_started_it(
    admin_api: Api, env: DatabaseWorkflowEnvironment
) -> None:
    """``detached_from``: the run that started this one with ``run_detached`` (null for a run
    started otherwise, and for the starter itself); the detached run is not its child."""
    from tests.fixtures.wat import Wat

    sleeper = Wat()
    sleeper.run("(drop (call $durable_sleep (i64.const 60000))) (call $finish)")
    starter = Wat()
    starter.run(
        f"""
    (local.set $d (call $run_detached {starter.s("sleeper")} {starter.js({})}))
    (call $rec (call $await_child {starter.payload("d")}))
    (call $finish)""",
        locals="$d i64",
    )
    admin_api.deploy("sleeper", sleeper.wasm())
    admin_api.deploy("starter", starter.wasm())
    run = admin_api.start("starter").json()["id"]
    env.run_until_idle()
    runs = admin_api.get("/api/v1/workflows", {"definition": "sleeper"}).json()["results"]
    assert [r["detached_from"] for r in runs] == [run]
    detached = admin_api.get(f"/api/v1/workflows/{runs[0]['id']}").json()
    assert detached["detached_from"] == run and detached["parent"] is None
    assert admin_api.get(f"/api/v1/workflows/{run}").json()["detached_from"] is None
    assert admin_api.get(f"/api/v1/workflows/{run}/children").json()["results"] == []


# --- errors ------------------------------------------------------------------------------------


def test_every_error_has_the_one_json_shape(deployed: Api, tenant: Tenant) -> None:
    bad_json = deployed.raw("POST", "/api/v1/workflows", "{nope", "application/json")
    assert bad_json.status_code == 400 and error_of(bad_json)["code"] == "invalid_json"
    not_object = deployed.raw("POST", "/api/v1/workflows", "[1, 2]", "application/json")
    assert not_object.status_code == 400
    nan = deployed.raw("POST", "/api/v1/workflows", '{"definition": NaN}', "application/json")
    assert nan.status_code == 400
    unknown = deployed.start("nothing-here")
    assert unknown.status_code == 400
    assert error_of(unknown) == {
        "code": "unknown_definition",
        "message": "no workflow definition named 'nothing-here'",
        "field": "definition",
    }
    assert error_of(deployed.start("waiter", version=99))["field"] == "version"
    missing = deployed.post("/api/v1/workflows", {})
    assert error_of(missing) == {
        "code": "invalid",
        "message": "definition: This field is required.",
        "field": "definition",
    }
    for path in (
        "/api/v1/workflows/00000000-0000-0000-0000-00000000abcd",
        "/api/v1/workflows/not-a-uuid",
        "/api/v1/workflows/not-a-uuid/events",
        "/api/v1/no-such-endpoint",
        "/api/v2/workflows",
        "/api/v1/definitions/waiter/versions/99999999999",
    ):
        response = deployed.get(path)
        assert response.status_code == 404, path
        assert response["Content-Type"] == "application/json"
        error_of(response)
    method = deployed.delete("/api/v1/workflows")
    assert method.status_code == 405 and error_of(method)["code"] == "method_not_allowed"
    nul = deployed.get("/api/v1/workflows", {"search": "a\x00b"})
    assert nul.status_code == 400
    huge_int = deployed.start("waiter", priority=2**40)
    assert huge_int.status_code == 400 and error_of(huge_int)["field"] == "priority"
    long_signal = deployed.post(
        f"/api/v1/workflows/{deployed.start('waiter').json()['id']}/signal", {"name": "s" * 300}
    )
    assert long_signal.status_code == 400


def test_payloads_over_the_limit_get_413(deployed: Api) -> None:
    big = deployed.start("waiter", "x" * (1024 * 1024 + 10))
    assert big.status_code == 413
    assert error_of(big) == {
        "code": "payload_too_large",
        "message": "input is larger than 1048576 bytes",
        "field": "input",
    }
    with override_settings(CLEAT_API_MAX_BODY_BYTES=1000):
        body = deployed.start("waiter", "x" * 2000)
        assert body.status_code == 413
        assert error_of(body)["code"] == "payload_too_large"
    with override_settings(CLEAT_API_MAX_MODULE_BYTES=100):
        module = deployed.deploy("waiter", signal_waiter())
        assert module.status_code == 413


# --- redaction -----------------------------------------------------------------------------------


def test_sensitive_values_are_redacted_on_read(
    deployed: Api, env: DatabaseWorkflowEnvironment, tmp_path: Path, tenant: Tenant
) -> None:
    secret_input = {
        "user": "ada",
        "password": "hunter2",
        "nested": {"API-Key": "k-123", "list": [{"Authorization": "Basic abc"}]},
        "note": JWT,
        "customer_ssn": "123-45-6789",
    }
    run = deployed.start("waiter", secret_input).json()
    assert run["input"] == {
        "user": "ada",
        "password": "[REDACTED]",
        "nested": {"API-Key": "[REDACTED]", "list": [{"Authorization": "[REDACTED]"}]},
        "note": "[REDACTED]",
        "customer_ssn": "123-45-6789",
    }
    env.run_until_idle()
    state = deployed.get(f"/api/v1/workflows/{run['id']}/query", {"key": "stage"}).json()
    assert state["value"] == {"at": "waiting", "api_token": "[REDACTED]"}
    sent = deployed.post(
        f"/api/v1/workflows/{run['id']}/signal", {"name": "go", "payload": {"secret": "s3"}}
    ).json()
    assert sent["payload"] == {"secret": "[REDACTED]"}
    env.run_until_idle()
    events = deployed.get(f"/api/v1/workflows/{run['id']}/events", {"decoded": "true"}).json()
    text = json.dumps(events)
    assert "s3" not in text and "t0ps3cret" not in text
    assert deployed.get(f"/api/v1/workflows/{run['id']}").json()["result"] is not None

    patterns = tmp_path / "patterns.txt"
    patterns.write_text("# site-specific\nssn\n\n")
    with override_settings(CLEAT_REDACT_PATTERNS_FILE=str(patterns)):
        again = deployed.get(f"/api/v1/workflows/{run['id']}").json()
        assert again["input"]["customer_ssn"] == "[REDACTED]"
    # The stored input is untouched: redaction is on read only.
    with tenant_context(tenant.id):
        stored = services.get_instance(tenant, run["id"]).input
    assert json.loads(stored) == secret_input


# --- throttling, health, metrics -----------------------------------------------------------------


def test_throttling_is_per_key(tenant: Tenant) -> None:
    first, second = Api(key_for(tenant, name="a")), Api(key_for(tenant, name="b"))
    rates = {"DEFAULT_THROTTLE_RATES": {"api_key": "3/min"}}
    from django.conf import settings

    with override_settings(REST_FRAMEWORK={**settings.REST_FRAMEWORK, **rates}):
        for _ in range(3):
            assert first.get("/api/v1/workflows").status_code == 200
        throttled = first.get("/api/v1/workflows")
        assert throttled.status_code == 429
        assert error_of(throttled)["code"] == "throttled"
        assert int(throttled["Retry-After"]) > 0
        assert second.get("/api/v1/workflows").status_code == 200


def test_healthz_and_metrics() -> None:
    client = Client()
    health = client.get("/healthz")
    assert health.status_code == 200
    assert health.json() == {"status": "ok", "database": "ok", "migrations": "ok"}
    client.get("/api/v1/workflows")
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics["Content-Type"].startswith("text/plain")
    text = metrics.content.decode()
    assert "cleat_api_requests_total" in text and 'status="401"' in text


def test_healthz_says_which_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import DatabaseError

    from workflows.api import health

    monkeypatch.setattr(health, "_pending_migrations", lambda: 2)
    pending = Client().get("/healthz")
    assert pending.status_code == 503
    assert pending.json() == {
        "status": "unavailable",
        "database": "ok",
        "migrations": "2 pending",
    }

    def unreachable() -> None:
        raise DatabaseError("connection refused")

    monkeypatch.setattr(health.connection, "cursor", unreachable)
    down = Client().get("/healthz")
    assert down.status_code == 503
    assert down.json()["database"] == "unreachable"


# --- keys: command and admin ---------------------------------------------------------------------


def test_create_api_key_command_prints_a_working_key_once(tenant: Tenant) -> None:
    out = io.StringIO()
    call_command(
        "create_api_key", "--tenant", "default", "--name", "ci", "--role", "read_only", stdout=out
    )
    printed = out.getvalue().strip().splitlines()
    plaintext = printed[-1]
    assert plaintext.startswith("clt_")
    with tenant_context(tenant.id):
        stored = ApiKey.objects.get(name="ci")
    assert stored.role == "read_only" and plaintext not in stored.key_hash
    assert Api(plaintext).get("/api/v1/workflows").status_code == 200
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="role"):
        call_command("create_api_key", "--tenant", "default", "--name", "x", "--role", "root")
    with pytest.raises(CommandError, match="tenant"):
        call_command("create_api_key", "--tenant", "nobody", "--name", "x")


def test_admin_creates_a_key_shown_once_and_revokes_it(
    tenant: Tenant, other_tenant: Tenant
) -> None:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    assert client.get("/admin/workflows/apikey/add/").status_code == 200
    created = client.post(
        "/admin/workflows/apikey/add/",
        {"name": "from-admin", "role": "operator"},
        follow=True,
    )
    assert created.status_code == 200
    page = created.content.decode()
    plaintext = page.split("clt_", 1)[1].split()[0]
    key = "clt_" + plaintext.rstrip(".")
    assert Api(key).get("/api/v1/workflows").status_code == 200
    with tenant_context(tenant.id):
        stored = ApiKey.objects.get(name="from-admin")
    key_for(other_tenant, Role.ADMIN, "elsewhere")
    listing = client.get("/admin/workflows/apikey/").content.decode()
    assert "from-admin" in listing and key not in listing
    assert "elsewhere" not in listing  # another tenant's key
    client.post(
        "/admin/workflows/apikey/",
        {"action": "revoke", "_selected_action": [stored.pk]},
    )
    assert Api(key).get("/api/v1/workflows").status_code == 401


def test_a_handler_that_fails_after_writing_leaves_nothing_behind(
    admin_api: Api, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler runs in one tenant transaction: an error after a write answers in the
    error shape and the write is rolled back with it."""
    admin_api.deploy("waiter", signal_waiter())

    def half_done(tenant: Tenant, name: str, version: int, *_: Any) -> None:
        AuditLog.record(tenant, "deprecate_definition", "api", "", name=name, version=version)
        raise services.Conflict("refused after the audit row", "version")

    monkeypatch.setattr(definitions, "deprecate_definition", half_done)
    refused = admin_api.post("/api/v1/definitions/waiter/versions/1/deprecate")
    assert refused.status_code == 409
    assert error_of(refused)["message"] == "refused after the audit row"
    with tenant_context(tenant.id):
        assert not AuditLog.objects.filter(action="deprecate_definition").exists()
