"""The admin pages render inside the tenant context (RLS on PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from workflows.demo import DEMO_WAT
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


def test_instance_changelist_and_page_show_the_run(tenant: Any) -> None:
    import wasmtime

    env = DatabaseWorkflowEnvironment(tenant, {"demo": "workflows.demo"})
    try:
        env.deploy("demo-order", wasmtime.wat2wasm(DEMO_WAT.read_text()))
        run = env.run("demo-order", {"x": 1})
    finally:
        env.close()
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    client = Client()
    client.force_login(user)
    listing = client.get("/admin/workflows/workflowinstance/")
    assert listing.status_code == 200
    assert run in listing.content.decode()
    page = client.get(f"/admin/workflows/workflowinstance/{run}/change/")
    assert page.status_code == 200
    assert "signals paid" in page.content.decode()
