"""The console redacts what the REST API redacts (``engine.redaction``): a staff user who may
view runs and schedules sees ``[REDACTED]`` for a password in a run's input, its query
state, a pending signal, the event table, the timeline, the state at step N, an error in the
dead-letter queue, an audit reason and a schedule's input; and a search for the secret text
finds nothing."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from schedules import services as sched
from schedules.models import Schedule
from tests.integration.test_api_support import signal_waiter
from workflows import services as svc
from workflows.models import StaffTenant, Tenant, WorkflowEvent, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/workflows/workflowinstance/"
SCHEDULES = "/admin/schedules/schedule/"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
# Every secret the pages must not show (the waiter's query state holds "t0ps3cret").
SECRETS = ("hunter2", "s3cr3t-sig", "t0ps3cret", JWT)


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("waiter", signal_waiter())
    yield made
    made.close()


@pytest.fixture
def viewer(tenant: Tenant) -> Client:
    """A staff user of the tenant who may only view."""
    user = get_user_model().objects.create_user("vera", password="pw-12345678", is_staff=True)
    codenames = ("view_workflowinstance", "view_schedule", "view_auditlog")
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    StaffTenant.objects.create(user=user, tenant=tenant)
    client = Client()
    client.force_login(user)
    return client


def shown(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    text = html.unescape(response.content.decode())
    for secret in SECRETS:
        assert secret not in text, f"{url} shows {secret!r}"
    return text


def test_every_run_page_shows_secrets_redacted(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, viewer: Client
) -> None:
    run_id = env.start("waiter", {"user": "ada-lovelace", "password": "hunter2"})
    env.run_until_idle()  # waiting for "go", query state {"api_token": "t0ps3cret"}
    svc.signal_workflow(
        tenant, run_id, "go", {"secret": "s3cr3t-sig"}, operator="admin:op", reason=f"b {JWT}"
    )
    page = shown(viewer, f"{RUNS}{run_id}/change/")  # the signal pending
    assert '"password": "[REDACTED]"' in page and "ada-lovelace" in page
    assert "[REDACTED]" in page.split('id="run-input"', 1)[1].split("</pre>", 1)[0]
    env.run_until_idle()  # the signal consumed: in the history and in the result
    assert env.status(run_id) == "done"
    page = shown(viewer, f"{RUNS}{run_id}/change/")
    assert "api_token" in page and "secret" in page  # the fields are there, their values not
    shown(viewer, f"{RUNS}{run_id}/timeline.svg")
    with tenant_context(tenant.id):
        steps = WorkflowEvent.objects.filter(instance_id=run_id).count()
    for step in range(steps + 1):
        shown(viewer, f"{RUNS}{run_id}/state/?step={step}")
    shown(viewer, RUNS)
    shown(viewer, "/admin/workflows/auditlog/")
    with tenant_context(tenant.id):
        audit = svc.get_instance(tenant, run_id).audit.first()
    assert audit is not None
    shown(viewer, f"/admin/workflows/auditlog/{audit.pk}/change/")


def test_a_search_does_not_match_secret_text(
    env: DatabaseWorkflowEnvironment, viewer: Client
) -> None:
    run_id = env.start("waiter", {"user": "ada-lovelace", "password": "hunter2"})

    def found(query: str) -> bool:
        response = viewer.get(RUNS, {"q": query})
        assert response.status_code == 200
        return run_id[:8] in response.content.decode()

    assert found("ada-lovelace") and found("lovelace ada")  # every word, any order
    assert not found("hunter2")
    assert not found('"password": "hunter2"')
    assert not found("ada hunter2")


def test_the_dead_letter_queue_shows_errors_redacted(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, viewer: Client
) -> None:
    run_id = env.start("waiter", None)
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=run_id).update(
            status="dead_lettered",
            error_code="internal",
            error=f"service said 401 for bearer {JWT}",
            completed_at=timezone.now(),
        )
    page = shown(viewer, "/admin/console/dead-letters/")
    # Text holding a token is replaced whole, as the API replaces it.
    assert 'data-code="internal"' in page and "[REDACTED]" in page
    assert "[REDACTED]" in shown(viewer, f"{RUNS}{run_id}/change/")


def test_a_schedules_input_is_shown_redacted_and_kept_when_saved_unchanged(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, viewer: Client
) -> None:
    stored = {"account": "acme", "password": "hunter2"}
    schedule = sched.create_schedule(
        tenant, name="nightly", workflow_name="waiter", cron="0 3 * * *", input=json.dumps(stored)
    )
    page = shown(viewer, f"{SCHEDULES}{schedule.pk}/change/")  # view only
    assert "acme" in page and "[REDACTED]" in page
    root = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    editor = Client()
    editor.force_login(root)
    form = shown(editor, f"{SCHEDULES}{schedule.pk}/change/")
    assert "[REDACTED]" in form
    data: dict[str, Any] = {
        "name": "nightly",
        "workflow_name": "waiter",
        "workflow_version": "",
        "workflow_tag": "",
        "entry_point": "run",
        "cron": "0 4 * * *",
        "timezone": "UTC",
        "input": '{"account":"acme","password":"[REDACTED]"}',  # as shown
        "misfire_policy": "catch_up",
        "catch_up_limit": "60",
        "overlap_policy": "allow",
        "notes": "",
        "enabled": "on",
    }
    saved = editor.post(f"{SCHEDULES}{schedule.pk}/change/", data)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    with tenant_context(tenant.id):
        row = Schedule.objects.get(pk=schedule.pk)
    assert (row.cron, json.loads(row.input)) == ("0 4 * * *", stored)
    data["input"] = '{"account":"other","password":"[REDACTED]"}'  # changed, placeholder kept
    refused = editor.post(f"{SCHEDULES}{schedule.pk}/change/", data)
    assert refused.status_code == 200
    assert "the placeholder of a redacted value" in refused.content.decode()
    with tenant_context(tenant.id):
        assert json.loads(Schedule.objects.get(pk=schedule.pk).input) == stored
