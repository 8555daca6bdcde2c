"""Tenant isolation in the operator console, admin by admin, on every database (MariaDB and
SQLite have no row-level security: the admins' own scoping is the only fence there).

A staff user bound to tenant *alpha* holds every permission there is; tenant *beta* has a row
of every model the admin registers, each named with "beta". Walking ``admin.site._registry``
(so an admin added later is walked too), the user must see none of beta's rows, get a 404 for
beta's change, delete and history pages and for every action POSTed with a beta id, and
beta's rows must stay as they were."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db import models
from django.test import Client, RequestFactory
from django.urls import reverse

from schedules import services as sched
from schedules.models import Schedule
from tests.fixtures.wat import Wat
from workflows import definitions
from workflows import services as svc
from workflows.api.keys import issue_api_key
from workflows.models import (
    ApiKey,
    AuditLog,
    RetentionPolicy,
    StaffTenant,
    Tenant,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/workflowinstance/"
# What the changelist of each tenant-scoped model shows of tenant alpha's row.
OWN_MARKERS: dict[type[models.Model], str] = {
    WorkflowInstance: "alpha-flow v1",
    WorkflowDefinition: "alpha-flow",
    AuditLog: "alpha-why",
    ApiKey: "alpha-key",
    RetentionPolicy: "alpha-flow",
    Schedule: "alpha-nightly",
}


def quick() -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s('done')}) (call $finish)")
    return w.wasm()


@dataclass
class Rows:
    """One row of every registered model, per tenant (keyed by model)."""

    own: dict[type[models.Model], models.Model]
    foreign: dict[type[models.Model], models.Model]


def _tenant_rows(tenant: Tenant, label: str) -> dict[type[models.Model], models.Model]:
    definition = definitions.deploy_definition(tenant, f"{label}-flow", quick())
    run, _ = svc.start_workflow(tenant, f"{label}-flow", {"who": label})
    svc.pause_workflow(tenant, str(run.id), operator=f"admin:{label}-op", reason=f"{label}-why")
    key, _ = issue_api_key(tenant, f"{label}-key", "read_only")
    schedule = sched.create_schedule(
        tenant, name=f"{label}-nightly", workflow_name=f"{label}-flow", cron="0 3 * * *"
    )
    with tenant_context(tenant.id):
        audit = AuditLog.objects.filter(tenant_id=tenant.id).first()
        policy = RetentionPolicy.objects.create(
            tenant=tenant, definition_name=f"{label}-flow", finished_days="7"
        )
    staff = get_user_model().objects.create_user(f"{label}-staff", is_staff=True)
    binding = StaffTenant.objects.create(user=staff, tenant=tenant)
    group = Group.objects.create(name=f"{label}-group")
    assert audit is not None
    return {
        WorkflowInstance: run,
        WorkflowDefinition: definition,
        AuditLog: audit,
        RetentionPolicy: policy,
        ApiKey: key,
        Schedule: schedule,
        StaffTenant: binding,
        get_user_model(): staff,
        Group: group,
        Tenant: tenant,
    }


@pytest.fixture
def rows(tenant: Tenant, other_tenant: Tenant) -> Rows:
    other_tenant.name = "beta"
    other_tenant.save()
    tenant.name = "alpha"
    tenant.save()
    return Rows(own=_tenant_rows(tenant, "alpha"), foreign=_tenant_rows(other_tenant, "beta"))


@pytest.fixture
def alpha_staff(rows: Rows, tenant: Tenant) -> Any:
    """A staff user of alpha with every permission (only tenancy stands in the way)."""
    user = get_user_model().objects.create_user("alice", password="pw-12345678", is_staff=True)
    user.user_permissions.set(Permission.objects.all())
    StaffTenant.objects.create(user=user, tenant=tenant)
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


@pytest.fixture
def client(alpha_staff: Any) -> Client:
    made = Client()
    made.force_login(alpha_staff)
    return made


def _url(model: type[models.Model], view: str, *args: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _tenant_scoped(model: type[models.Model]) -> bool:
    return any(f.name == "tenant" for f in model._meta.fields) and model is not StaffTenant


def _snapshot(obj: models.Model) -> dict[str, Any]:
    """The row as stored now (read past tenancy: a test may look at every tenant)."""
    model = type(obj)
    query = model._default_manager.filter(pk=obj.pk)
    if _tenant_scoped(model):
        with tenant_context(obj.tenant_id):  # type: ignore[attr-defined]
            found = query.values().first()
    else:
        found = query.values().first()
    assert found is not None, f"{model.__name__} {obj.pk} is gone"
    return found


def test_every_admin_shows_and_reaches_only_its_tenants_rows(
    rows: Rows, client: Client, alpha_staff: Any, tenant: Tenant
) -> None:
    registered = set(admin.site._registry)
    assert registered <= set(rows.foreign), (
        f"admins without a row in this test: {registered - set(rows.foreign)}; add one"
    )
    for model, model_admin in admin.site._registry.items():
        name = model.__name__
        own, foreign = rows.own[model], rows.foreign[model]
        before = _snapshot(foreign)
        listing = client.get(_url(model, "changelist"))
        if _tenant_scoped(model):
            assert listing.status_code == 200, name
            html = listing.content.decode()
            assert "beta" not in html, f"{name} changelist shows tenant beta's row"
            assert OWN_MARKERS[model] in html, f"{name} changelist misses tenant alpha's own row"
            assert client.get(_url(model, "change", own.pk)).status_code == 200, name
            refused = 404
        else:
            # Not a tenant's rows: superusers only, whatever permissions a staff user holds.
            assert listing.status_code == 403, name
            refused = 403
        for view in ("change", "delete", "history"):
            response = client.get(_url(model, view, foreign.pk))
            assert response.status_code == refused, (name, view, response.status_code)
            assert b"beta" not in response.content, (name, view)
        delete = client.post(_url(model, "delete", foreign.pk), {"post": "yes"})
        assert delete.status_code == refused, (name, "delete POST", delete.status_code)

        request = RequestFactory().get("/admin/")
        request.user = alpha_staff
        request.cleat_tenant = tenant  # type: ignore[attr-defined]
        actions = list(model_admin.get_actions(request))
        if not actions and refused == 404:
            # An admin without actions: a forged one is refused by the action form (the
            # changelist again, 200); the row must stay as it is all the same.
            forged = client.post(
                _url(model, "changelist"),
                {"action": "delete_selected", "_selected_action": [str(foreign.pk)], "index": "0"},
            )
            assert forged.status_code == 200, (name, forged.status_code)
        for action in actions or ["delete_selected"] * (refused == 403):
            posted = client.post(
                _url(model, "changelist"),
                {"action": action, "_selected_action": [str(foreign.pk)], "index": "0"},
            )
            assert posted.status_code == refused, (name, action, posted.status_code)
            mixed = client.post(
                _url(model, "changelist"),
                {
                    "action": action,
                    "_selected_action": [str(own.pk), str(foreign.pk)],
                    "index": "0",
                },
            )
            assert mixed.status_code == refused, (name, action, "with an own id too")
        assert _snapshot(foreign) == before, f"{name}: tenant beta's row changed"


def test_console_pages_of_another_tenants_run_are_404(rows: Rows, client: Client) -> None:
    run = rows.foreign[WorkflowInstance]
    for suffix in ("change/", "state/?step=1", "timeline.svg", "action/terminate/"):
        response = client.get(f"{RUNS}{run.pk}/{suffix}")
        assert response.status_code == 404, (suffix, response.status_code)
    posted = client.post(f"{RUNS}{run.pk}/action/resume/", {"runs": f"{run.pk}:1", "reason": "x"})
    assert posted.status_code == 404
    definition = rows.foreign[WorkflowDefinition]
    assert (
        client.post(
            _url(WorkflowDefinition, "change", definition.pk), {"op": "deprecate"}
        ).status_code
        == 404
    )
    for page in ("/admin/console/dashboard/", "/admin/console/dead-letters/", "/admin/"):
        html = client.get(page).content.decode()
        assert "beta" not in html, page
    with tenant_context(run.tenant_id):
        stored = WorkflowInstance.objects.get(pk=run.pk)
        deprecated = WorkflowDefinition.objects.get(pk=definition.pk).deprecated
    assert stored.status == "paused" and not deprecated
