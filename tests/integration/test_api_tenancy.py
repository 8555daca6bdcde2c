"""No endpoint returns or changes another tenant's data.

Tenant B gets a definition (deprecated old version, tag, routing), runs (one waiting on a
signal, one on a promise, a failed one) and a promise. Then tenant A's *admin* key goes
through every endpoint with B's names and ids: every answer is a 404 (or a listing without
B's rows), and a snapshot of B's rows taken before is unchanged after. B's own key is the
positive control: it sees and changes exactly those rows, so the test cannot pass by seeing
nothing at all. On PostgreSQL the suite is connected as the RLS-bound application role, so the
requests also run under row-level security.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache

from tests.integration.test_api_support import Api, key_for, promiser, signal_waiter
from workflows import definitions, services
from workflows.models import (
    AuditLog,
    Promise,
    Role,
    RoutingRule,
    Signal,
    Tenant,
    VersionTag,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
)
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


def snapshot(tenant: Tenant) -> dict[str, Any]:
    """Everything of ``tenant`` an endpoint could change."""
    with tenant_context(tenant.id):
        scoped = {"tenant_id": tenant.id}
        return {
            "definitions": sorted(
                WorkflowDefinition.objects.filter(**scoped).values_list(
                    "name", "version", "deprecated"
                )
            ),
            "runs": sorted(
                WorkflowInstance.objects.filter(**scoped).values_list(
                    "id", "status", "generation", "cancel_requested", "result", "priority"
                ),
                key=str,
            ),
            "events": WorkflowEvent.objects.filter(**scoped).count(),
            "signals": Signal.objects.filter(**scoped).count(),
            "promises": sorted(Promise.objects.filter(**scoped).values_list("id", "status")),
            "tags": sorted(VersionTag.objects.filter(**scoped).values_list("tag", "version")),
            "rules": sorted(RoutingRule.objects.filter(**scoped).values_list("version", "weight")),
            "audit": AuditLog.objects.filter(**scoped).count(),
        }


@pytest.fixture
def other(other_tenant: Tenant) -> Iterator[dict[str, Any]]:
    """Tenant B's rows: ids the sweep aims at."""
    env = DatabaseWorkflowEnvironment(other_tenant)
    try:
        for _ in range(3):
            definitions.deploy_definition(other_tenant, "shared-name", signal_waiter())
        definitions.deploy_definition(other_tenant, "promiser", promiser())
        definitions.deprecate_definition(other_tenant, "shared-name", 1)
        definitions.set_tag(other_tenant, "shared-name", "stable", 2)
        definitions.set_routing_rules(other_tenant, "shared-name", [(2, 1.0), (3, 1.0)])
        waiting, _ = services.start_workflow(
            other_tenant, "shared-name", idempotency_key="same-key"
        )
        promised, _ = services.start_workflow(other_tenant, "promiser")
        failed, _ = services.start_workflow(other_tenant, "shared-name", version=3)
        env.run_until_idle()
        services.force_fail(other_tenant, str(failed.id), None, "boom", operator="setup")
        with tenant_context(other_tenant.id):
            promise = Promise.objects.get(instance_id=promised.id)
        yield {
            "tenant": other_tenant,
            "waiting": str(waiting.id),
            "promised": str(promised.id),
            "failed": str(failed.id),
            "promise": promise.id,
        }
    finally:
        env.close()


def every_request(other: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(method, path, JSON body) for every endpoint, aimed at tenant B's rows."""
    run, failed, promise = other["waiting"], other["failed"], other["promise"]
    definition = "/api/v1/definitions/shared-name"
    version = f"{definition}/versions/2"
    requests: list[tuple[str, str, Any]] = [
        ("GET", definition, None),
        ("GET", f"{definition}/versions", None),
        ("GET", version, None),
        ("GET", f"{version}/download", None),
        ("POST", f"{version}/deprecate", {}),
        ("POST", f"{definition}/versions/1/restore", {}),
        ("POST", f"{definition}/versions/1/purge", {}),
        ("GET", f"{definition}/tags", None),
        ("POST", f"{definition}/tags", {"tag": "stable", "version": 3}),
        ("GET", f"{definition}/tags/stable", None),
        ("DELETE", f"{definition}/tags/stable", None),
        ("GET", f"{definition}/routing", None),
        ("PUT", f"{definition}/routing", {"rules": []}),
        ("GET", f"/api/v1/workflows/{run}", None),
        ("GET", f"/api/v1/workflows/{run}/events", None),
        ("GET", f"/api/v1/workflows/{run}/query", None),
        ("GET", f"/api/v1/workflows/{run}/children", None),
        ("GET", f"/api/v1/workflows/{run}/chain", None),
        ("POST", f"/api/v1/workflows/{run}/signal", {"name": "go"}),
        ("POST", f"/api/v1/workflows/{run}/cancel", {}),
        ("POST", f"/api/v1/workflows/{run}/pause", {}),
        ("POST", f"/api/v1/workflows/{run}/resume", {}),
        ("POST", f"/api/v1/workflows/{run}/terminate", {}),
        ("POST", f"/api/v1/workflows/{failed}/retry", {}),
        ("POST", f"/api/v1/workflows/{run}/force-complete", {"generation": 1, "result": 1}),
        ("POST", f"/api/v1/workflows/{run}/force-fail", {"generation": 1, "message": "x"}),
        ("POST", f"/api/v1/workflows/{failed}/re-replay", {"generation": 2}),
        ("POST", f"/api/v1/workflows/{run}/update", {"name": "u", "wait_seconds": 0}),
        ("GET", f"/api/v1/promises/{promise}", None),
        ("POST", f"/api/v1/promises/{promise}/resolve", {"value": 1}),
        ("POST", f"/api/v1/promises/{promise}/reject", {"message": "no"}),
    ]
    return requests


def send(api: Api, method: str, path: str, body: Any) -> Any:
    if method == "GET":
        return api.get(path)
    if method == "DELETE":
        return api.delete(path)
    if method == "PUT":
        return api.put(path, body)
    return api.post(path, body)


def test_another_tenants_key_reaches_nothing(tenant: Tenant, other: dict[str, Any]) -> None:
    mine = Api(key_for(tenant, Role.ADMIN))
    before = snapshot(other["tenant"])
    for method, path, body in every_request(other):
        response = send(mine, method, path, body)
        assert response.status_code == 404, (method, path, response.status_code, response.content)
        assert response.json()["error"]["code"] == "not_found"
    # Listings and reports show none of B's rows.
    assert mine.get("/api/v1/workflows").json()["results"] == []
    assert mine.get("/api/v1/workflows", {"search": "boom"}).json()["results"] == []
    assert mine.get("/api/v1/definitions").json()["results"] == []
    assert mine.get("/api/v1/definitions/stale", {"purge_after_days": 0}).json() == []
    gc = mine.post(
        "/api/v1/definitions/gc", {"dry_run": False, "min_versions_to_keep": 0, "max_age_days": 0}
    )
    assert gc.json() == {"dry_run": False, "removed": [], "skipped": [], "runs_deleted": 0}
    # Starting a run by B's definition name, or with B's idempotency key, never touches B.
    assert mine.start("shared-name").status_code == 400
    definitions.deploy_definition(tenant, "shared-name", signal_waiter())
    started = mine.start("shared-name", idempotency_key="same-key")
    assert started.status_code == 201
    assert started.json()["id"] != other["waiting"]
    assert snapshot(other["tenant"]) == before


def test_the_owning_tenants_key_reaches_all_of_it(tenant: Tenant, other: dict[str, Any]) -> None:
    """The positive control: the same requests with B's key succeed (or conflict on state)."""
    theirs = Api(key_for(other["tenant"], Role.ADMIN))
    before = snapshot(other["tenant"])
    statuses = {}
    for method, path, body in every_request(other):
        response = send(theirs, method, path, body)
        statuses[(method, path)] = response.status_code
        assert response.status_code != 404, (method, path, response.content)
    listed = theirs.get("/api/v1/workflows").json()["results"]
    assert {other["waiting"], other["failed"], other["promised"]} <= {r["id"] for r in listed}
    assert snapshot(other["tenant"]) != before
    # B's idempotency key finds B's run for B.
    again = theirs.start("shared-name", idempotency_key="same-key")
    assert again.status_code == 200 and again.json()["id"] == other["waiting"]
    assert sum(1 for code in statuses.values() if 200 <= code < 300) > 20


@pytest.mark.postgres_only
def test_keys_resolve_across_tenants_only_through_the_definer_function(
    other_tenant: Tenant,
) -> None:
    """Under RLS the application role cannot read ``workflows_apikey`` without a tenant
    context (fail-closed); authentication finds a key of any tenant through
    ``cleat.resolve_api_key``, which returns no hash."""
    from django.db import connection
    from django.db.utils import ProgrammingError

    from workflows.api.keys import resolve_api_key
    from workflows.models import ApiKey, hash_api_key

    plaintext = key_for(other_tenant, Role.READ_ONLY, "probe")
    with pytest.raises(ProgrammingError, match="tenant context required"):
        list(ApiKey.objects.filter(key_hash=hash_api_key(plaintext)))
    resolved = resolve_api_key(plaintext)
    assert resolved is not None
    assert (resolved.tenant_id, resolved.name, resolved.role) == (
        other_tenant.id,
        "probe",
        "read_only",
    )
    assert resolve_api_key(plaintext + "x") is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM cleat.resolve_api_key(%s)", [hash_api_key(plaintext)])
        columns = {column.name for column in cursor.description}
    assert "key_hash" not in columns
    assert Api(plaintext).get("/api/v1/workflows").status_code == 200
