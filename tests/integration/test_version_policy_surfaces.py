"""The version and policy settings of issue 14 through every surface that sets them: the
deploy command's flags, the API's deploy and the admin's deploy form (the rules themselves
are tested through both stores in ``test_version_scenarios.py``)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.test import Client

from tests.integration.test_api_support import Api, error_of, key_for, signal_waiter
from workflows.models import ApiKey, AuditLog, Role, Signal, Tenant, WorkflowDefinition
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)


def definition(tenant: Tenant, name: str, version: int = 1) -> WorkflowDefinition:
    with tenant_context(tenant.id):
        return WorkflowDefinition.objects.defer("wasm").get(name=name, version=version)


@pytest.fixture
def admin_api(tenant: Tenant) -> Api:
    return Api(key_for(tenant, Role.ADMIN))


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "parent.wasm"
    path.write_bytes(bytes(signal_waiter()))
    return path


# --- child binding --------------------------------------------------------------------------------


def test_the_deploy_command_sets_the_child_binding(tenant: Tenant, module: Path) -> None:
    out = io.StringIO()
    call_command(
        "deploy_workflow",
        "parent",
        str(module),
        "--child-binding",
        "frozen",
        "--child-version",
        "child=2",
        "--child-version",
        "other=1",
        stdout=out,
    )
    deployed = definition(tenant, "parent")
    assert (deployed.child_binding, deployed.child_versions) == (
        "frozen",
        {"child": 2, "other": 1},
    )
    with pytest.raises(CommandError, match="'child=two' is not NAME=VERSION"):
        call_command(
            "deploy_workflow", "parent", str(module), "--child-binding", "frozen",
            "--child-version", "child=two", stdout=io.StringIO(),
        )  # fmt: skip
    with pytest.raises(CommandError, match="only used with child_binding 'frozen'"):
        call_command(
            "deploy_workflow", "parent", str(module), "--child-version", "child=1",
            stdout=io.StringIO(),
        )  # fmt: skip


def test_the_api_deploy_sets_the_child_binding(tenant: Tenant, admin_api: Api) -> None:
    pins = quote('{"child": 3}')
    made = admin_api.deploy("parent", signal_waiter(), child_binding="frozen", child_versions=pins)
    assert made.status_code == 201, made.content
    assert (made.json()["child_binding"], made.json()["child_versions"]) == ("frozen", {"child": 3})
    stable = admin_api.deploy("parent", signal_waiter(), child_binding="stable")
    assert stable.json()["child_binding"] == "stable"
    refused = admin_api.deploy("parent", signal_waiter(), child_binding="newest")
    assert refused.status_code == 400 and error_of(refused)["field"] == "child_binding"
    bad_pin = admin_api.deploy(
        "parent", signal_waiter(), child_binding="frozen", child_versions=quote('{"child": -1}')
    )
    assert bad_pin.status_code == 400 and error_of(bad_pin) == {
        "code": "invalid",
        "field": "child_versions",
        "message": "child_versions['child'] must be a positive integer",
    }


@pytest.fixture
def op(tenant: Any) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    return client


def test_the_admin_deploy_form_sets_the_child_binding(tenant: Tenant, op: Client) -> None:
    form = {"name": "parent", "child_binding": "frozen", "child_versions": "child=1, other=4"}
    response = op.post(
        "/admin/workflows/workflowdefinition/add/",
        {**form, "wasm": SimpleUploadedFile("p.wasm", bytes(signal_waiter()))},
    )
    assert response.status_code == 302
    deployed = definition(tenant, "parent")
    assert (deployed.child_binding, deployed.child_versions) == (
        "frozen",
        {"child": 1, "other": 4},
    )
    page = op.get(f"/admin/workflows/workflowdefinition/{deployed.pk}/change/").content.decode()
    assert "frozen (versions pinned at deploy): child v1, other v4" in page
    refused = op.post(
        "/admin/workflows/workflowdefinition/add/",
        {
            "name": "parent",
            "child_versions": "child=1",
            "wasm": SimpleUploadedFile("p.wasm", bytes(signal_waiter())),
        },
    )
    assert refused.status_code == 400
    assert "only used with child_binding" in refused.content.decode()


# --- an operator's move to another version -----------------------------------------------------


def test_the_api_moves_a_run_to_another_version(tenant: Tenant, admin_api: Api) -> None:
    assert admin_api.deploy("waiter", signal_waiter()).status_code == 201
    assert admin_api.deploy("waiter", signal_waiter()).status_code == 201
    assert admin_api.deploy("waiter", signal_waiter(), min_version=2).status_code == 201
    run = admin_api.start("waiter", version=1).json()
    url = f"/api/v1/workflows/{run['id']}/move-version"
    missing = admin_api.post(url, {"version": 9})
    assert missing.status_code == 404 and error_of(missing) == {
        "code": "not_found",
        "field": "version",
        "message": "waiter has no version 9 to move to",
    }
    refused = admin_api.post(url, {"version": 3})
    assert refused.status_code == 409 and error_of(refused)["message"] == (
        "waiter version 1 cannot move to version 3: version 3 has min_version 2: it does not "
        "replay histories of version 1"
    )
    operator = Api(key_for(tenant, Role.OPERATOR, "operator"))
    assert operator.post(url, {"version": 2}).status_code == 403
    moved = admin_api.post(url, {"version": 2, "reason": "fixed in v2"})
    assert moved.status_code == 200, moved.content
    assert moved.json()["version"] == 2
    with tenant_context(tenant.id):
        entry = AuditLog.objects.get(instance_id=run["id"], action="move_to_version")
    assert (entry.reason, entry.detail) == ("fixed in v2", {"from_version": 1, "to_version": 2})
    bad = admin_api.post(url, {"version": 0})
    assert bad.status_code == 400 and error_of(bad)["field"] == "version"


# --- signal authorization ---------------------------------------------------------------------


def test_deploy_surfaces_set_the_allowed_signal_callers(
    tenant: Tenant, admin_api: Api, module: Path, op: Client
) -> None:
    call_command(
        "deploy_workflow", "target", str(module), "--signal-caller", "billing",
        "--signal-caller", "audit", stdout=io.StringIO(),
    )  # fmt: skip
    assert definition(tenant, "target", 1).allowed_signal_callers == ["billing", "audit"]
    made = admin_api.deploy("target", signal_waiter(), allowed_signal_callers=quote('["billing"]'))
    assert made.status_code == 201 and made.json()["allowed_signal_callers"] == ["billing"]
    refused = admin_api.deploy("target", signal_waiter(), allowed_signal_callers=quote('"x"'))
    assert refused.status_code == 400 and error_of(refused) == {
        "code": "invalid",
        "field": "allowed_signal_callers",
        "message": "allowed_signal_callers must be a list of workflow names",
    }
    response = op.post(
        "/admin/workflows/workflowdefinition/add/",
        {
            "name": "target",
            "allowed_signal_callers": "billing, shipping",
            "wasm": SimpleUploadedFile("t.wasm", bytes(signal_waiter())),
        },
    )
    assert response.status_code == 302
    assert definition(tenant, "target", 3).allowed_signal_callers == ["billing", "shipping"]


def test_the_api_refuses_a_signal_without_the_permission_with_403_and_an_audit_row(
    tenant: Tenant, admin_api: Api, settings: Any
) -> None:
    settings.CLEAT_REQUIRE_SIGNAL_AUTH = True
    assert admin_api.deploy("waiter", signal_waiter()).status_code == 201
    run = admin_api.start("waiter").json()
    refused = admin_api.post(f"/api/v1/workflows/{run['id']}/signal", {"name": "go"})
    assert refused.status_code == 403
    assert error_of(refused) == {
        "code": "denied",
        "field": "name",
        "message": "signal authorization: api-key:test has no permission to signal runs",
    }
    with tenant_context(tenant.id):
        entry = AuditLog.objects.get(action="signal_denied")
        assert not Signal.objects.filter(instance_id=run["id"]).exists()
    assert (str(entry.instance_id), entry.operator) == (run["id"], "api-key:test")
    with tenant_context(tenant.id):
        ApiKey.objects.filter(tenant_id=tenant.id).update(may_signal=True)
    sent = admin_api.post(f"/api/v1/workflows/{run['id']}/signal", {"name": "go"})
    assert sent.status_code == 202, sent.content
    settings.CLEAT_REQUIRE_SIGNAL_AUTH = False
    other = Api(key_for(tenant, Role.OPERATOR, "no-permission"))
    assert other.post(f"/api/v1/workflows/{run['id']}/signal", {"name": "go"}).status_code == 202


# --- quotas: the settings and a tenant's overrides ---------------------------------------------


def test_a_tenants_admin_overrides_beat_the_settings(
    tenant: Tenant, op: Client, settings: Any
) -> None:
    from tests.integration.test_policy_scenarios import leaf, starts_children
    from workflows.testing import DatabaseWorkflowEnvironment

    settings.CLEAT_MAX_CHILDREN_PER_RUN = 0  # unlimited by the setting
    page = f"/admin/workflows/tenant/{tenant.id}/change/"
    saved = op.post(
        page,
        {"schedule_quota": "", "max_children_per_run": "1", "max_locks_per_run": "0"},
    )
    assert saved.status_code == 302, saved.content.decode()[:2000]
    fresh = Tenant.objects.get(id=tenant.id)
    assert (fresh.schedule_quota, fresh.max_children_per_run, fresh.max_locks_per_run) == (
        None,
        1,
        0,
    )
    env = DatabaseWorkflowEnvironment(fresh)
    try:
        env.deploy("leaf", leaf())
        env.deploy("parent", starts_children(2))
        assert env.result(env.run("parent")) == [0, 8]
    finally:
        env.close()


def test_create_tenant_leaves_the_schedule_quota_to_the_setting(transactional_db: Any) -> None:
    out = io.StringIO()
    call_command("create_tenant", "acme", stdout=out)
    assert Tenant.objects.get(name="acme").schedule_quota is None
    call_command("create_tenant", "capped", "--schedule-quota", "0", stdout=out)
    assert Tenant.objects.get(name="capped").schedule_quota == 0


# --- plugins ------------------------------------------------------------------------------------


def test_deploy_surfaces_resolve_plugin_dependencies(
    tenant: Tenant, admin_api: Api, module: Path
) -> None:
    from engine.services import Services
    from workflows.executor import set_services

    versions = {v: object() for v in ("1.0.0", "1.3.1", "2.0.0")}
    set_services(Services.from_settings(plugins={"llm": versions}))
    try:
        made = admin_api.deploy(
            "asker", signal_waiter(), plugin_dependencies=quote('{"llm": "^1.0"}')
        )
        assert made.status_code == 201, made.content
        assert made.json()["plugin_versions"] == {"llm": "1.3.1"}
        refused = admin_api.deploy(
            "asker", signal_waiter(), plugin_dependencies=quote('{"llm": ">=3"}')
        )
        assert refused.status_code == 400 and error_of(refused) == {
            "code": "invalid",
            "field": "plugin_dependencies",
            "message": "no version of plugin 'llm' satisfies '>=3' "
            "(configured: 1.0.0, 1.3.1, 2.0.0)",
        }
        call_command(
            "deploy_workflow", "asker", str(module), "--plugin", "llm:>=2", stdout=io.StringIO()
        )
        assert definition(tenant, "asker", 2).plugin_versions == {"llm": "2.0.0"}
        with pytest.raises(CommandError, match="is not NAME:CONSTRAINT"):
            call_command(
                "deploy_workflow", "asker", str(module), "--plugin", "llm", stdout=io.StringIO()
            )
    finally:
        set_services(None)
