"""Schedules in the operator console: the list (zone, next five fire times, last run linked
to its instance page), the form's errors naming the field, and the actions (enable, disable,
trigger now, backfill through an intermediate form). Pages render in the tenant context."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from schedules import services as sched
from schedules.models import Schedule
from schedules.scheduler import tick
from tests.fixtures.wat import Wat
from workflows.models import AuditLog, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/schedules/schedule/"


def quick() -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s('done')}) (call $finish)")
    return w.wasm()


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("quick", quick())
    yield made
    made.close()


@pytest.fixture
def client(env: Any) -> Client:
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    made = Client()
    made.force_login(user)
    return made


def form_data(**values: Any) -> dict[str, Any]:
    data = {
        "name": "nightly",
        "workflow_name": "quick",
        "workflow_version": "",
        "workflow_tag": "",
        "entry_point": "run",
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "input": '{"n": 1}',
        "enabled": "on",
        "misfire_policy": "catch_up",
        "catch_up_limit": "60",
        "overlap_policy": "allow",
        "notes": "",
    }
    data.update(values)
    return {k: v for k, v in data.items() if v is not None}


def schedules(tenant: Tenant) -> list[Schedule]:
    with tenant_context(tenant.id):
        return list(Schedule.objects.all())


def test_the_list_shows_zone_preview_and_the_last_run_linked(env: Any, client: Client) -> None:
    made = sched.create_schedule(
        env.tenant,
        name="nightly",
        workflow_name="quick",
        cron="30 2 * * *",
        timezone="America/New_York",
        now=datetime(2031, 3, 7, tzinfo=UTC),
    )
    tick(datetime(2031, 3, 7, 7, 30, 5, tzinfo=UTC))
    with tenant_context(env.tenant.id):
        run = WorkflowInstance.objects.get()
    page = client.get(CHANGELIST).content.decode()
    assert "America/New_York" in page
    # The five instants from next_run_at, on the schedule's wall clock, across the change.
    assert "2031-03-08 02:30 EST" in page
    assert "2031-03-09 03:00 EDT" in page
    assert "2031-03-12 02:30 EDT" in page
    assert f'href="/admin/workflows/workflowinstance/{run.id}/change/"' in page
    assert made.name in page
    change = client.get(f"{CHANGELIST}{made.id}/change/")
    assert change.status_code == 200 and "2031-03-09 03:00 EDT" in change.content.decode()


def test_adding_through_the_form_goes_through_the_service(env: Any, client: Client) -> None:
    response = client.post(f"{CHANGELIST}add/", form_data())
    assert response.status_code == 302, response.content.decode()[:2000]
    (made,) = schedules(env.tenant)
    assert (made.cron, made.timezone, made.input) == ("30 2 * * *", "America/New_York", '{"n": 1}')
    assert made.next_run_at is not None and made.next_run_at > timezone.now()
    response = client.post(
        f"{CHANGELIST}{made.id}/change/", form_data(cron="0 6 * * *", timezone="UTC")
    )
    assert response.status_code == 302
    (changed,) = schedules(env.tenant)
    assert changed.next_run_at is not None and changed.next_run_at.hour == 6


@pytest.mark.parametrize(
    ("values", "field", "fragment"),
    [
        ({"cron": "abc * * * *"}, "cron", "minute field &#x27;abc&#x27;"),
        ({"cron": "61 * * * *"}, "cron", "61 is outside 0-59"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({"workflow_name": "nope"}, "workflow_name", "no workflow definition named"),
        ({"entry_point": "report"}, "entry_point", "no entry point"),
        ({"input": "{oops"}, "input", "not valid JSON"),
    ],
)
def test_the_form_names_the_bad_field(
    env: Any, client: Client, values: dict[str, str], field: str, fragment: str
) -> None:
    response = client.post(f"{CHANGELIST}add/", form_data(**values))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert fragment.replace("&#x27;", "'") in errors[field][0]
    assert fragment in response.content.decode()
    assert schedules(env.tenant) == []


def test_enable_disable_and_trigger_actions(env: Any, client: Client) -> None:
    made = sched.create_schedule(env.tenant, name="a", workflow_name="quick", cron="@daily")
    post = {"_selected_action": [str(made.id)]}
    assert client.post(CHANGELIST, {**post, "action": "disable_schedules"}).status_code == 302
    assert schedules(env.tenant)[0].enabled is False
    assert client.post(CHANGELIST, {**post, "action": "enable_schedules"}).status_code == 302
    (enabled,) = schedules(env.tenant)
    assert enabled.enabled is True and "resumed by admin:op" in enabled.notes
    response = client.post(CHANGELIST, {**post, "action": "trigger_now"}, follow=True)
    assert "a: 1 started" in [str(m) for m in response.context["messages"]]
    with tenant_context(env.tenant.id):
        assert WorkflowInstance.objects.count() == 1
        logged = AuditLog.objects.filter(action__startswith="schedule_").order_by("created_at")
        assert [(a.action, a.operator) for a in logged] == [
            ("schedule_created", "system"),
            ("schedule_paused", "admin:op"),
            ("schedule_resumed", "admin:op"),
            ("schedule_triggered", "admin:op"),
        ]


def test_backfill_action_asks_for_the_range_then_delivers_it(env: Any, client: Client) -> None:
    made = sched.create_schedule(env.tenant, name="hourly", workflow_name="quick", cron="@hourly")
    post = {"_selected_action": [str(made.id)], "action": "backfill"}
    page = client.post(CHANGELIST, post)
    assert page.status_code == 200 and 'name="apply"' in page.content.decode()
    end = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    start = end - timedelta(hours=3)
    fmt = "%Y-%m-%d %H:%M:%S"
    bad = client.post(
        CHANGELIST, {**post, "apply": "1", "start": end.strftime(fmt), "end": start.strftime(fmt)}
    )
    assert bad.status_code == 200
    assert bad.context["form"].errors == {"end": ["end is before start"]}
    future = client.post(
        CHANGELIST,
        {
            **post,
            "apply": "1",
            "start": start.strftime(fmt),
            "end": (end + timedelta(days=2)).strftime(fmt),
        },
    )
    assert future.status_code == 200
    assert "future" in future.context["form"].errors["end"][0]
    done = client.post(
        CHANGELIST,
        {**post, "apply": "1", "start": start.strftime(fmt), "end": end.strftime(fmt)},
        follow=True,
    )
    assert [str(m) for m in done.context["messages"]] == ["Backfilled hourly: 4 started."]
    with tenant_context(env.tenant.id):
        keys = sorted(WorkflowInstance.objects.values_list("start_idempotency_key", flat=True))
    assert keys == [
        f"schedule:{made.id}:{(start + timedelta(hours=i)).isoformat()}" for i in range(4)
    ]
