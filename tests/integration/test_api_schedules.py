"""Schedules through the REST API, on every database: create, read (by id and by name), list
with filters and pages, replace and change, delete; pause and resume; trigger and backfill
under the overlap policies against a workflow that waits; previews; bad input refused with
the field named and nothing stored; roles and tenants; every change audited."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.core.cache import cache
from django.utils import timezone

from schedules.models import Schedule
from tests.integration.test_api_support import Api, error_of, key_for
from tests.integration.test_schedules import quick, waiter
from workflows.models import (
    AuditLog,
    Role,
    RunStatus,
    Tenant,
    WorkflowDefinition,
    WorkflowInstance,
)
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/schedules"


@pytest.fixture(autouse=True)
def _fresh_throttle_counts() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def api(tenant: Tenant) -> Api:
    admin = Api(key_for(tenant, Role.ADMIN))
    assert admin.deploy("waiter", waiter()).status_code == 201
    assert admin.deploy("quick", quick()).status_code == 201
    return Api(key_for(tenant, Role.OPERATOR, "operator"))


def create(api: Api, **fields: Any) -> dict[str, Any]:
    body = {"name": "nightly", "workflow_name": "quick", "cron": "30 2 * * *", **fields}
    response = api.post(URL, body)
    assert response.status_code == 201, response.content
    return dict(response.json())


def stored(tenant: Tenant) -> list[Schedule]:
    with tenant_context(tenant.id):
        return list(Schedule.objects.filter(tenant_id=tenant.id))


def audit(tenant: Tenant, action: str) -> list[AuditLog]:
    with tenant_context(tenant.id):
        found = AuditLog.objects.filter(tenant_id=tenant.id, action=action)
        return list(found.order_by("created_at"))


def runs(tenant: Tenant) -> list[WorkflowInstance]:
    with tenant_context(tenant.id):
        return list(WorkflowInstance.objects.filter(tenant_id=tenant.id).order_by("created_at"))


# --- CRUD ---------------------------------------------------------------------------------------


def test_create_read_by_id_and_name_and_list(api: Api, tenant: Tenant) -> None:
    before = timezone.now()
    made = create(api, timezone="Europe/London", input={"report": "sales"}, notes="for finance")
    assert made["cron"] == "30 2 * * *" and made["timezone"] == "Europe/London"
    assert made["input"] == {"report": "sales"} and made["enabled"] is True
    assert (made["misfire_policy"], made["overlap_policy"]) == ("catch_up", "allow")
    assert made["catch_up_limit"] == 60 and made["entry_point"] == "run"
    first = datetime.fromisoformat(made["next_run_at"])
    local = first.astimezone(ZoneInfo("Europe/London"))
    assert first > before and (local.hour, local.minute) == (2, 30)
    assert api.get(f"{URL}/{made['id']}").json() == made
    assert api.get(f"{URL}/nightly").json() == made
    create(api, name="hourly", cron="@hourly", enabled=False)
    create(api, name="waits", workflow_name="waiter", cron="*/5 * * * *")
    names = [s["name"] for s in api.get(URL).json()["results"]]
    assert names == ["hourly", "nightly", "waits"]
    assert [s["name"] for s in api.get(URL, {"enabled": "false"}).json()["results"]] == ["hourly"]
    by_workflow = api.get(URL, {"workflow_name": "waiter"}).json()["results"]
    assert [s["name"] for s in by_workflow] == ["waits"]
    assert [s["name"] for s in api.get(URL, {"search": "finance"}).json()["results"]] == ["nightly"]
    page = api.get(URL, {"limit": 2}).json()
    assert [s["name"] for s in page["results"]] == ["hourly", "nightly"]
    rest = api.client.get(page["next"], **api.headers).json()
    assert [s["name"] for s in rest["results"]] == ["waits"]
    created = audit(tenant, "schedule_created")
    assert len(created) == 3 and {a.operator for a in created} == {"api-key:operator"}


def test_patch_changes_only_what_is_given_and_a_new_cron_restarts(api: Api, tenant: Tenant) -> None:
    made = create(api, notes="keep me", overlap_policy="skip")
    changed = api.patch(f"{URL}/nightly", {"cron": "0 6 * * 1-5", "timezone": "Asia/Kathmandu"})
    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert body["notes"] == "keep me" and body["overlap_policy"] == "skip"
    local = datetime.fromisoformat(body["next_run_at"]).astimezone(ZoneInfo("Asia/Kathmandu"))
    assert (local.hour, local.minute) == (6, 0) and local.isoweekday() <= 5
    assert body["next_run_at"] != made["next_run_at"]
    renamed = api.patch(f"{URL}/{made['id']}", {"name": "weekday-report"})
    assert renamed.json()["name"] == "weekday-report"
    assert api.get(f"{URL}/nightly").status_code == 404
    updates = audit(tenant, "schedule_updated")
    assert [a.detail["fields"] for a in updates] == [["cron", "timezone"], ["name"]]


def test_put_replaces_every_setting_and_read_only_fields_sent_back_are_ignored(
    api: Api,
) -> None:
    made = create(api, notes="old", overlap_policy="skip", catch_up_limit=5)
    replaced = api.put(
        f"{URL}/nightly",
        {**made, "cron": "@daily", "next_run_at": "2000-01-01T00:00:00Z", "notes": "new"},
    )
    assert replaced.status_code == 200, replaced.content
    body = replaced.json()
    assert body["cron"] == "@daily" and body["notes"] == "new"
    assert datetime.fromisoformat(body["next_run_at"]) > timezone.now()
    minimal = {"name": "nightly", "workflow_name": "quick", "cron": "@daily"}
    bare = api.put(f"{URL}/nightly", minimal)
    assert bare.status_code == 200
    assert (bare.json()["overlap_policy"], bare.json()["catch_up_limit"]) == ("allow", 60)
    assert bare.json()["notes"] == ""


def test_delete_removes_it_and_keeps_its_runs(api: Api, tenant: Tenant) -> None:
    create(api)
    assert api.post(f"{URL}/nightly/trigger").status_code == 200
    response = api.client.delete(f"{URL}/nightly?reason=retired", **api.headers)
    assert response.status_code == 204
    assert api.get(f"{URL}/nightly").status_code == 404
    assert stored(tenant) == [] and len(runs(tenant)) == 1
    assert [a.reason for a in audit(tenant, "schedule_deleted")] == ["retired"]
    missing = api.delete(f"{URL}/nightly")
    assert missing.status_code == 404 and error_of(missing)["field"] == "schedule"


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field", "text"),
    [
        ({"cron": "abc * * * *"}, "cron", "abc"),
        ({"cron": "61 * * * *"}, "cron", "61"),
        ({"cron": "0 0 30 2 *"}, "cron", "never"),
        ({"cron": "* * * *"}, "cron", "5 fields"),
        ({"cron": ""}, "cron", "blank"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "Mars/Olympus_Mons"),
        ({"misfire_policy": "later"}, "misfire_policy", "later"),
        ({"overlap_policy": "queue"}, "overlap_policy", "queue"),
        ({"catch_up_limit": 0}, "catch_up_limit", "greater than or equal to 1"),
        ({"catch_up_limit": "many"}, "catch_up_limit", "integer"),
        ({"enabled": "perhaps"}, "enabled", "boolean"),
        ({"name": "has space"}, "name", "pattern"),
        ({"workflow_name": "nope"}, "workflow_name", "nope"),
        ({"workflow_version": 9}, "workflow_version", "9"),
        ({"workflow_tag": "stable"}, "workflow_tag", "stable"),
        ({"workflow_version": 1, "workflow_tag": "x"}, "workflow_tag", "not both"),
        ({"entry_point": "missing"}, "entry_point", "missing"),
        ({"overlap": "skip"}, "overlap", "not a field"),
        ({"name": "preview"}, "name", "cannot be used"),
        ({"name": "0123456789abcdef0123456789abcdef"}, "name", "reads as an id"),
        ({"input": {"password": "[REDACTED]"}}, "input", "placeholder of a redacted value"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(
    api: Api, tenant: Tenant, fields: dict[str, Any], field: str, text: str
) -> None:
    body = {"name": "nightly", "workflow_name": "quick", "cron": "30 2 * * *", **fields}
    response = api.post(URL, body)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["field"] == field, error
    assert text.lower() in error["message"].lower(), error
    assert stored(tenant) == []


def test_required_fields_are_named(api: Api) -> None:
    for missing in ("name", "workflow_name", "cron"):
        body = {"name": "n", "workflow_name": "quick", "cron": "@daily"}
        del body[missing]
        error = error_of(api.post(URL, body))
        assert error["field"] == missing and "required" in error["message"]


def test_a_bad_change_leaves_the_schedule_as_it_was(api: Api, tenant: Tenant) -> None:
    made = create(api)
    response = api.patch(f"{URL}/nightly", {"cron": "0 25 * * *", "notes": "changed"})
    assert response.status_code == 400 and error_of(response)["field"] == "cron"
    assert "hour" in error_of(response)["message"]
    assert api.get(f"{URL}/nightly").json() == made
    assert audit(tenant, "schedule_updated") == []


def test_a_taken_name_and_the_quota_are_409s(api: Api, tenant: Tenant) -> None:
    create(api)
    taken = api.post(URL, {"name": "nightly", "workflow_name": "quick", "cron": "@daily"})
    assert taken.status_code == 409 and error_of(taken)["field"] == "name"
    create(api, name="second")
    clash = api.patch(f"{URL}/second", {"name": "nightly"})
    assert clash.status_code == 409 and error_of(clash)["field"] == "name"
    Tenant.objects.filter(id=tenant.id).update(schedule_quota=2)
    full = api.post(URL, {"name": "third", "workflow_name": "quick", "cron": "@daily"})
    assert full.status_code == 409 and error_of(full)["code"] == "quota_exceeded"
    assert len(stored(tenant)) == 2


# --- pause, resume, trigger, backfill -----------------------------------------------------------


def test_pause_and_resume_are_idempotent_and_recorded(api: Api, tenant: Tenant) -> None:
    create(api)
    paused = api.post(f"{URL}/nightly/pause", {"reason": "quarter close"})
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    assert "paused by api-key:operator: quarter close" in paused.json()["notes"]
    assert api.post(f"{URL}/nightly/pause").json()["enabled"] is False
    resumed = api.post(f"{URL}/nightly/resume", {"reason": "done"})
    assert resumed.json()["enabled"] is True
    assert datetime.fromisoformat(resumed.json()["next_run_at"]) > timezone.now()
    assert api.post(f"{URL}/nightly/resume").json()["enabled"] is True
    assert [a.reason for a in audit(tenant, "schedule_paused")] == ["quarter close"]
    assert [a.reason for a in audit(tenant, "schedule_resumed")] == ["done"]


def test_trigger_fires_now_under_the_overlap_policy(api: Api, tenant: Tenant) -> None:
    create(api, workflow_name="waiter", overlap_policy="skip", enabled=False)
    first = api.post(f"{URL}/nightly/trigger")
    assert first.status_code == 200, first.content
    [delivery] = first.json()["deliveries"]
    assert delivery["outcome"] == "started" and delivery["run_id"]
    assert first.json()["schedule"] == "nightly"
    second = api.post(f"{URL}/nightly/trigger").json()["deliveries"]
    assert [d["outcome"] for d in second] == ["skipped"]  # the first run is still waiting
    forced = api.post(f"{URL}/nightly/trigger", {"overlap_policy": "terminate_other"})
    [replacing] = forced.json()["deliveries"]
    assert replacing["outcome"] == "started" and replacing["replaced"] == [delivery["run_id"]]
    statuses = {str(r.id): r.status for r in runs(tenant)}
    assert statuses[delivery["run_id"]] == RunStatus.TERMINATED
    assert statuses[replacing["run_id"]] == RunStatus.READY
    assert len(audit(tenant, "schedule_triggered")) == 3
    bad = api.post(f"{URL}/nightly/trigger", {"overlap_policy": "sometimes"})
    assert bad.status_code == 400 and error_of(bad)["field"] == "overlap_policy"


def test_backfill_delivers_each_past_instant_once(api: Api, tenant: Tenant) -> None:
    create(api, cron="0 * * * *")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    start, end = hour - timedelta(hours=3, minutes=30), hour - timedelta(minutes=1)
    body = {"start": start.isoformat(), "end": end.isoformat()}
    response = api.post(f"{URL}/nightly/backfill", body)
    assert response.status_code == 200, response.content
    deliveries = response.json()["deliveries"]
    instants = [datetime.fromisoformat(d["instant"]) for d in deliveries]
    assert instants == [hour - timedelta(hours=h) for h in (3, 2, 1)]
    assert {d["outcome"] for d in deliveries} == {"started"}
    again = api.post(f"{URL}/nightly/backfill", body).json()["deliveries"]
    assert [d["outcome"] for d in again] == ["existing"] * 3
    assert [d["run_id"] for d in again] == [d["run_id"] for d in deliveries]
    assert len(runs(tenant)) == 3
    [logged, _] = audit(tenant, "schedule_backfilled")
    assert logged.detail["instants"] == 3


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"start": "2026-01-01T00:00:00Z", "end": "2099-01-01T00:00:00Z"}, "end", "future"),
        ({"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end", "before"),
        ({"start": "yesterday", "end": "2026-01-01T00:00:00Z"}, "start", "format"),
        ({"start": "0001-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "start", "1970"),
        ({"end": "2026-01-01T00:00:00Z"}, "start", "required"),
        ({"start": "2020-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z"}, "end", "more than 100 "),
    ],
)
def test_backfill_refuses_a_bad_range_naming_the_field(
    api: Api, tenant: Tenant, body: dict[str, str], field: str, text: str
) -> None:
    create(api, cron="0 * * * *")
    response = api.post(f"{URL}/nightly/backfill", body)
    assert response.status_code == 400, response.content
    assert error_of(response)["field"] == field
    assert text in error_of(response)["message"], error_of(response)
    assert runs(tenant) == []


def test_preview_lists_the_next_fire_times_on_the_zone_wall_clock(api: Api) -> None:
    create(api, cron="30 1 * * *", timezone="Europe/London")
    # Across the autumn change (last Sunday of October 2027): 01:30 happens twice; fires once.
    after = datetime(2027, 10, 29, 12, 0, tzinfo=UTC)
    response = api.get(f"{URL}/nightly/preview", {"count": 4, "after": after.isoformat()})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["timezone"] == "Europe/London" and len(body["fire_times"]) == 4
    assert body["local_times"] == [
        "2027-10-30T01:30:00+01:00",
        "2027-10-31T01:30:00+01:00",  # the first of the two 01:30s
        "2027-11-01T01:30:00+00:00",
        "2027-11-02T01:30:00+00:00",
    ]
    assert [datetime.fromisoformat(t) for t in body["fire_times"]] == [
        datetime.fromisoformat(t) for t in body["local_times"]
    ]
    for query, field in (({"count": 0}, "count"), ({"after": "soon"}, "after")):
        bad = api.get(f"{URL}/nightly/preview", query)
        assert bad.status_code == 400 and error_of(bad)["field"] == field


def test_an_expression_can_be_previewed_before_it_is_saved(tenant: Tenant) -> None:
    reader = Api(key_for(tenant, Role.READ_ONLY, "reader"))
    body = {
        "cron": "0 2 * * *",
        "timezone": "America/New_York",
        "count": 2,
        "after": "2027-03-13T12:00:00Z",
    }
    response = reader.post(f"{URL}/preview", body)
    assert response.status_code == 200, response.content
    # 02:00 does not exist on 14 March 2027 in New York: it fires at 03:00 EDT instead.
    assert response.json()["local_times"] == [
        "2027-03-14T03:00:00-04:00",
        "2027-03-15T02:00:00-04:00",
    ]
    bad = reader.post(f"{URL}/preview", {"cron": "* * * * * *"})
    assert bad.status_code == 400 and error_of(bad)["field"] == "cron"
    zone = reader.post(f"{URL}/preview", {"cron": "@daily", "timezone": "Nowhere"})
    assert zone.status_code == 400 and error_of(zone)["field"] == "timezone"


# --- roles and tenants --------------------------------------------------------------------------


def test_read_only_keys_read_and_operators_change(api: Api, tenant: Tenant) -> None:
    create(api)
    reader = Api(key_for(tenant, Role.READ_ONLY, "reader"))
    assert reader.get(f"{URL}/nightly").status_code == 200
    assert reader.get(f"{URL}/nightly/preview").status_code == 200
    for response in (
        reader.post(URL, {"name": "x", "workflow_name": "quick", "cron": "@daily"}),
        reader.patch(f"{URL}/nightly", {"notes": "x"}),
        reader.post(f"{URL}/nightly/pause"),
        reader.post(f"{URL}/nightly/trigger"),
        reader.delete(f"{URL}/nightly"),
    ):
        assert response.status_code == 403 and error_of(response)["code"] == "permission_denied"
    assert len(stored(tenant)) == 1 and runs(tenant) == []


def test_another_tenant_cannot_see_or_touch_a_schedule(
    api: Api, tenant: Tenant, other_tenant: Tenant
) -> None:
    made = create(api)
    stranger = Api(key_for(other_tenant, Role.ADMIN, "stranger"))
    assert stranger.get(URL).json()["results"] == []
    for path in (f"{URL}/nightly", f"{URL}/{made['id']}"):
        assert stranger.get(path).status_code == 404
        assert stranger.post(f"{path}/trigger").status_code == 404
        assert stranger.delete(path).status_code == 404
    # Its own schedule of the same name is its own (it has no "quick" definition, though).
    refused = stranger.post(URL, {"name": "nightly", "workflow_name": "quick", "cron": "@daily"})
    assert refused.status_code == 400 and error_of(refused)["code"] == "unknown_definition"
    assert len(stored(tenant)) == 1 and runs(tenant) == []


def test_triggering_a_schedule_whose_workflow_is_gone_is_a_409(api: Api, tenant: Tenant) -> None:
    create(api, workflow_name="quick", workflow_version=1)
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant_id=tenant.id, name="quick").delete()
    response = api.post(f"{URL}/nightly/trigger")
    assert response.status_code == 409, response.content
    error = error_of(response)
    assert error["field"] == "workflow_name" and "cannot be started" in error["message"]
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    body = {"start": (hour - timedelta(days=2)).isoformat(), "end": hour.isoformat()}
    assert api.post(f"{URL}/nightly/backfill", body).status_code == 409
    assert runs(tenant) == []


def test_a_json_string_is_an_input_like_any_other_value(api: Api) -> None:
    assert create(api, input="hello")["input"] == "hello"
    assert api.patch(f"{URL}/nightly", {"input": "42"}).json()["input"] == "42"


def test_a_get_body_with_redacted_values_cannot_overwrite_the_real_ones(
    api: Api, tenant: Tenant
) -> None:
    made = create(api, input={"user": "a", "password": "hunter2"})
    assert made["input"] == {"user": "a", "password": "[REDACTED]"}
    refused = api.put(f"{URL}/nightly", made)
    assert refused.status_code == 400 and error_of(refused)["field"] == "input"
    kept = api.put(f"{URL}/nightly", {k: v for k, v in made.items() if k != "input"})
    assert kept.status_code == 200
    (row,) = stored(tenant)
    assert row.input == "null"  # PUT without input: the default (documented)
    api.patch(f"{URL}/nightly", {"input": {"user": "a", "password": "hunter2"}})
    api.patch(f"{URL}/nightly", {"notes": "input untouched by a PATCH without it"})
    (row,) = stored(tenant)
    assert "hunter2" in row.input


def test_a_version_and_a_tag_cannot_both_be_set_by_a_change(api: Api) -> None:
    create(api, workflow_version=1)
    response = api.patch(f"{URL}/nightly", {"workflow_tag": "stable"})
    assert response.status_code == 400 and error_of(response)["field"] == "workflow_tag"
    moved = api.patch(f"{URL}/nightly", {"workflow_tag": "", "workflow_version": None})
    assert moved.status_code == 200 and moved.json()["workflow_version"] is None


def test_a_schedule_whose_workflow_is_gone_can_still_be_changed_and_paused(
    api: Api, tenant: Tenant
) -> None:
    create(api)
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant_id=tenant.id, name="quick").delete()
    assert api.patch(f"{URL}/nightly", {"enabled": False, "notes": "x"}).status_code == 200
    again = api.patch(f"{URL}/nightly", {"enabled": True})
    assert again.status_code == 400 and error_of(again)["code"] == "unknown_definition"
    moved = api.patch(f"{URL}/nightly", {"workflow_name": "waiter"})
    assert moved.status_code == 200 and moved.json()["workflow_name"] == "waiter"


def test_the_runs_a_schedule_started_are_listed_newest_first(api: Api, tenant: Tenant) -> None:
    create(api, name="hourly", cron="0 * * * *")
    create(api, name="other", cron="0 * * * *")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    body = {"start": (hour - timedelta(hours=2)).isoformat(), "end": hour.isoformat()}
    made = api.post(f"{URL}/hourly/backfill", body).json()["deliveries"]
    api.post(f"{URL}/other/trigger")
    renamed = api.patch(f"{URL}/hourly", {"name": "renamed"}).json()
    listed = api.get(f"{URL}/{renamed['id']}/runs").json()["results"]
    assert [r["id"] for r in listed] == [d["run_id"] for d in reversed(made)]
    assert {r["definition"] for r in listed} == {"quick"}
    page = api.get(f"{URL}/renamed/runs", {"limit": 1}).json()
    assert len(page["results"]) == 1 and page["next"]
    assert len(api.get(f"{URL}/other/runs").json()["results"]) == 1
    assert api.get(f"{URL}/missing/runs").status_code == 404
