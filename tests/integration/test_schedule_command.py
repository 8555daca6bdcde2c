"""``manage.py schedule``: every action through the services, output an operator can read,
and bad input as a non-zero exit naming the problem (nothing stored)."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from schedules.models import Schedule
from tests.integration.test_schedules import quick, waiter
from workflows.models import AuditLog, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("quick", quick())
    made.deploy("waiter", waiter())
    yield made
    made.close()


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("schedule", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def rows(tenant: Tenant) -> list[Schedule]:
    with tenant_context(tenant.id):
        return list(Schedule.objects.filter(tenant_id=tenant.id).order_by("name"))


def test_create_list_preview_pause_resume_delete(env: Any) -> None:
    out = run(
        "create", "nightly", "--workflow", "quick", "--cron", "30 2 * * *",
        "--timezone", "Europe/London", "--input", '{"kind": "daily"}', "--overlap", "skip",
    )  # fmt: skip
    assert out.startswith("nightly  quick  '30 2 * * *' Europe/London  enabled  next 20")
    (made,) = rows(env.tenant)
    assert (made.input, made.overlap_policy) == ('{"kind": "daily"}', "skip")
    assert "nightly" in run("list")
    preview = run("preview", "nightly", "--count", "3", "--after", "2027-10-30T12:00Z")
    # 31 October 2027 is London's autumn change: 02:30 that day is GMT already.
    assert preview.splitlines()[0] == "2027-10-31T02:30:00+00:00  (2027-10-31T02:30:00+00:00)"
    assert [line.split()[0] for line in preview.splitlines()] == [
        "2027-10-31T02:30:00+00:00",
        "2027-11-01T02:30:00+00:00",
        "2027-11-02T02:30:00+00:00",
    ]
    assert "paused" in run("pause", "nightly", "--reason", "quarter close")
    assert "enabled" in run("resume", str(made.id))
    assert run("delete", "nightly") == "deleted nightly\n"
    assert rows(env.tenant) == []
    with tenant_context(env.tenant.id):
        actions = set(AuditLog.objects.filter(operator="cli").values_list("action", flat=True))
    assert actions == {
        "schedule_created",
        "schedule_paused",
        "schedule_resumed",
        "schedule_deleted",
    }


def test_an_expression_preview_needs_no_schedule(env: Any) -> None:
    out = run(
        "preview", "--cron", "0 2 * * *", "--timezone", "America/New_York",
        "--count", "2", "--after", "2027-03-13T12:00:00Z",
    )  # fmt: skip
    assert [line.split()[0] for line in out.splitlines()] == [
        "2027-03-14T03:00:00-04:00",  # 02:00 does not exist that day
        "2027-03-15T02:00:00-04:00",
    ]


def test_trigger_and_backfill_report_each_delivery(env: Any) -> None:
    run("create", "w", "--workflow", "waiter", "--cron", "0 * * * *", "--overlap", "skip")
    first = run("trigger", "w")
    assert " started run " in first
    assert " skipped" in run("trigger", "w")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    start = (hour - timedelta(hours=2, minutes=30)).isoformat()
    end = (hour - timedelta(minutes=1)).isoformat()
    out = run("backfill", "w", "--start", start, "--end", end, "--overlap", "allow")
    assert out.count(" started run ") == 2
    with tenant_context(env.tenant.id):
        assert WorkflowInstance.objects.filter(tenant_id=env.tenant.id).count() == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "x", "--workflow", "quick", "--cron", "61 * * * *"], "61 is outside 0-59"),
        (["create", "x", "--workflow", "quick", "--cron", "@daily", "--timezone", "Nowhere"],
         "(timezone)"),
        (["create", "x", "--workflow", "nope", "--cron", "@daily"], "(workflow_name)"),
        (["create", "x", "--workflow", "quick", "--cron", "@daily", "--input", "{oops"],
         "--input is not valid JSON"),
        (["create", "x", "--workflow", "quick", "--cron", "@daily", "--catch-up-limit", "0"],
         "(catch_up_limit)"),
        (["pause", "missing"], "no schedule missing"),
        (["preview"], "give a schedule"),
        (["preview", "--cron", "0 0 30 2 *"], "never"),
        (["backfill", "x", "--start", "soon", "--end", "2026-01-01"], "--start 'soon'"),
        (["list", "--tenant", "nobody"], "unknown tenant"),
        (["preview", "--cron", "@daily", "--after", "9999-12-31T00:00Z"], "(after)"),
        (
            ["preview", "--cron", "@daily", "--after", "0001-01-01T00:00Z", "--timezone",
             "America/New_York"],
            "from 1970 to 2199",
        ),
        (["create", "x", "--workflow", "quick", "--cron", "@daily", "--workflow-version", "1",
          "--workflow-tag", "t"], "not both"),
    ],
)  # fmt: skip
def test_bad_input_fails_with_the_reason(env: Any, args: list[str], message: str) -> None:
    with pytest.raises(CommandError) as caught:
        run(*args)
    assert message in str(caught.value)
    assert rows(env.tenant) == []


def test_the_real_command_exits_non_zero_with_the_reason_and_no_traceback(
    tmp_path: Path,
) -> None:
    env = {"DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "DEBUG": "1", "PATH": ""}

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    bad = ["schedule", "preview", "--cron", "abc * * * *"]
    unmigrated = manage(*bad)
    assert unmigrated.returncode != 0 and "Traceback" not in unmigrated.stderr
    assert "manage.py migrate" in unmigrated.stderr
    assert manage("migrate", "--verbosity", "0").returncode == 0
    done = manage(*bad)
    assert done.returncode != 0
    assert "minute field 'abc'" in done.stderr and "Traceback" not in done.stderr
