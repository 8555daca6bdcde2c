"""Who may create an API key of which role: a key can do no more than its creator could in
the console (``workflows.api.keys.ROLE_PERMISSIONS``). A staff user with only ``add_apikey``
once minted an ``admin`` key and deployed through the API with it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from tests.fixtures.wat import Wat
from tests.integration.test_api_support import Api
from workflows.api.keys import RoleNotHeld, issue_api_key, role_of_user
from workflows.models import ApiKey, Role, StaffTenant, Tenant
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/workflows/apikey/add/"


def quick() -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s('done')}) (call $finish)")
    return w.wasm()


def staff_with(tenant: Tenant, *codenames: str) -> Any:
    user = get_user_model().objects.create_user("kim", password="pw-12345678", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    StaffTenant.objects.create(user=user, tenant=tenant)
    return get_user_model().objects.get(pk=user.pk)  # no cached permissions


def keys(tenant: Tenant) -> dict[str, str]:
    with tenant_context(tenant.id):
        return dict(ApiKey.objects.filter(tenant_id=tenant.id).values_list("name", "role"))


def create(client: Client, name: str, role: str) -> str:
    response = client.post(ADD, {"name": name, "role": role}, follow=True)
    assert response.status_code == 200
    return response.content.decode()


def test_a_key_needs_its_roles_permissions_in_the_admin(tenant: Tenant) -> None:
    user = staff_with(tenant, "add_apikey", "view_apikey")
    client = Client()
    client.force_login(user)
    for role in (Role.ADMIN, Role.OPERATOR, Role.READ_ONLY):
        page = create(client, f"as-{role}", role)
        assert f"creating a key with the {role} role needs" in page, role
    assert keys(tenant) == {}

    operator = ("view_workflowinstance", "change_workflowinstance")
    user.user_permissions.add(*Permission.objects.filter(codename__in=operator))
    client.force_login(get_user_model().objects.get(pk=user.pk))
    assert "creating a key with the admin role needs" in create(client, "as-admin", "admin")
    create(client, "as-operator", "operator")
    create(client, "as-reader", "read_only")
    assert keys(tenant) == {"as-operator": "operator", "as-reader": "read_only"}

    definitions = ("add_workflowdefinition", "change_workflowdefinition")
    user.user_permissions.add(*Permission.objects.filter(codename__in=definitions))
    client.force_login(get_user_model().objects.get(pk=user.pk))
    # Purging versions is an admin key's too: without delete_workflowdefinition, no admin.
    assert "creating a key with the admin role needs" in create(client, "as-admin", "admin")
    user.user_permissions.add(Permission.objects.get(codename="delete_workflowdefinition"))
    client.force_login(get_user_model().objects.get(pk=user.pk))
    page = create(client, "as-admin", "admin")
    assert "clt_" in page and keys(tenant)["as-admin"] == "admin"


def test_a_key_of_a_refused_role_cannot_deploy_and_superusers_create_any(
    tenant: Tenant,
) -> None:
    only_keys = staff_with(tenant, "add_apikey")
    with pytest.raises(RoleNotHeld) as refused:
        issue_api_key(tenant, "sneaky", Role.ADMIN, issuer=only_keys)
    assert refused.value.field == "role" and refused.value.http_status == 403
    assert role_of_user(only_keys) is None
    root = get_user_model().objects.create_superuser("root", "r@example.com", "pw-12345678")
    client = Client()
    client.force_login(root)
    page = create(client, "root-admin", "admin")
    plaintext = "clt_" + page.split("clt_", 1)[1].split()[0].rstrip(".")
    deployed = Api(plaintext).deploy("quick", quick())
    assert deployed.status_code == 201, deployed.content
    # The command line is trusted (its user has the server's shell): no issuer, any role.
    key, _ = issue_api_key(tenant, "from-cli", Role.ADMIN)
    assert key.role == Role.ADMIN


def test_the_browsable_api_gives_staff_the_role_their_permissions_hold(tenant: Tenant) -> None:
    user = staff_with(
        tenant,
        "view_workflowinstance",
        "change_workflowinstance",
        "add_workflowdefinition",
        "change_workflowdefinition",
        "delete_workflowdefinition",
    )
    assert role_of_user(user) == Role.ADMIN
    user.user_permissions.remove(Permission.objects.get(codename="delete_workflowdefinition"))
    assert role_of_user(get_user_model().objects.get(pk=user.pk)) == Role.OPERATOR
    reader = get_user_model().objects.create_user("ro", is_staff=True)
    reader.user_permissions.add(Permission.objects.get(codename="change_workflowinstance"))
    assert role_of_user(reader) == Role.OPERATOR  # change implies view, as in the admin
