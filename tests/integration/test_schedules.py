"""The scheduler end to end through the store: initialisation, exactly-once firing, misfire
and overlap policies (against a workflow that waits for a signal), pause on failure, rows it
cannot interpret, the service layer's validation, and the worker's loop waking for a
schedule. Runs on every database the suite is pointed at (SQLite; PostgreSQL as the
RLS-bound application role, where the due read is a definer function; MariaDB)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from schedules import services as sched
from schedules import store
from schedules.models import Schedule
from schedules.scheduler import deliver, firing_key, tick
from tests.fixtures.wat import Wat
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.services import Conflict, InvalidInput, NotFound, ServiceError
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)

# Instants are in the future of the wall clock on purpose: nothing below may depend on it.
BASE = datetime(2031, 1, 6, 12, 0, tzinfo=UTC)


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return BASE + timedelta(minutes=minutes, seconds=seconds)


# --- workflows -----------------------------------------------------------------------------------


def waiter() -> bytes:
    """Waits (a day at most) for the signal ``finish``, records the answer, completes. A
    cancellation request ends the wait with CANCELLED, which it records too."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_await_signals {w.js(["finish"])} (i64.const 86400000)))
    (call $finish)"""
    )
    return w.wasm()


def quick() -> bytes:
    w = Wat()
    w.run(f"(call $note {w.s('done')}) (call $finish)")
    return w.wasm()


def failing() -> bytes:
    w = Wat()
    w.run(w.reply(2, "the report could not be built"))  # PERMANENT: fails at once
    return w.wasm()


def creator() -> bytes:
    """Schedules ``quick`` every five minutes from inside a workflow (schedule_cron)."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $schedule_cron {w.s("quick")} {w.s("*/5 * * * *")} {w.s("UTC")}
                                    {w.js({"from": "wf"})}))
    (call $finish)"""
    )
    return w.wasm()


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    made = DatabaseWorkflowEnvironment(tenant)
    made.deploy("waiter", waiter())
    made.deploy("quick", quick())
    yield made
    made.close()


def create(tenant: Tenant, name: str, workflow: str = "waiter", **values: Any) -> Schedule:
    """A schedule whose first instant is ``BASE`` (every minute unless ``cron`` says else)."""
    values.setdefault("cron", "* * * * *")
    return sched.create_schedule(
        tenant, name=name, workflow_name=workflow, now=at(seconds=-30), **values
    )


def reload(tenant: Tenant, schedule: Schedule) -> Schedule:
    with tenant_context(tenant.id):
        return Schedule.objects.get(id=schedule.id)


def runs(tenant: Tenant, schedule: Schedule | None = None) -> list[WorkflowInstance]:
    """The runs started for ``schedule`` (by key prefix), oldest first."""
    with tenant_context(tenant.id):
        query = WorkflowInstance.objects.filter(tenant_id=tenant.id)
        if schedule is not None:
            query = query.filter(start_idempotency_key__startswith=f"schedule:{schedule.id}:")
        return list(query.order_by("created_at", "start_idempotency_key"))


def instants_of(tenant: Tenant, schedule: Schedule) -> list[datetime]:
    prefix = f"schedule:{schedule.id}:"
    return sorted(
        datetime.fromisoformat(r.start_idempotency_key[len(prefix) :])
        for r in runs(tenant, schedule)
    )


def status(tenant: Tenant, run: WorkflowInstance) -> str:
    with tenant_context(tenant.id):
        return str(WorkflowInstance.objects.get(id=run.id).status)


def tick_until_quiet(now: datetime, rounds: int = 200) -> list[Any]:
    reports = []
    for _ in range(rounds):
        report = tick(now)
        reports.append(report)
        if not report.progress:
            return reports
    raise AssertionError(f"still busy after {rounds} ticks at {now}")


# --- initialisation and exactly once -----------------------------------------------------------


def test_a_schedule_created_by_a_workflow_gets_next_run_at_and_fires(env: Any) -> None:
    """schedule_cron stores the schedule with its first instant after the step's time; the
    tick starts the run at that instant; the worker runs it to completion."""
    env.deploy("creator", creator())
    before = timezone.now()
    env.run("creator")
    with tenant_context(env.tenant.id):
        schedule = Schedule.objects.get(workflow_name="quick")
    assert schedule.next_run_at is not None
    assert before < schedule.next_run_at <= before + timedelta(minutes=5, seconds=1)
    assert schedule.next_run_at.minute % 5 == 0 and schedule.next_run_at.second == 0
    first = schedule.next_run_at
    assert tick(first - timedelta(seconds=1)).started == 0
    report = tick(first + timedelta(seconds=1))
    assert report.started == 1
    env.run_until_idle()
    (run,) = runs(env.tenant, schedule)
    assert run.status == RunStatus.DONE and run.input == '{"from":"wf"}'
    schedule = reload(env.tenant, schedule)
    assert schedule.last_run_id == run.id and schedule.last_run_at == first
    assert schedule.next_run_at == first + timedelta(minutes=5)
    assert tick(first + timedelta(seconds=2)).started == 0


def test_the_tick_initialises_a_row_stored_without_next_run_at(env: Any) -> None:
    with tenant_context(env.tenant.id):
        schedule = Schedule.objects.create(
            tenant=env.tenant,
            name="raw",
            workflow_name="quick",
            cron="0 9 * * *",
            timezone="Europe/London",
        )
    assert schedule.next_run_at is None
    report = tick(datetime(2031, 7, 1, 10, tzinfo=UTC))
    assert (report.initialised, report.started) == (1, 0)
    assert reload(env.tenant, schedule).next_run_at == datetime(2031, 7, 2, 8, tzinfo=UTC)  # BST


def test_a_duplicate_attempt_at_one_instant_starts_one_run(env: Any) -> None:
    """Even bypassing the compare-and-swap, two deliveries of one instant share the start
    idempotency key: one run."""
    schedule = create(env.tenant, "dup")
    with tenant_context(env.tenant.id):
        first = deliver(schedule, env.tenant, at(), at(seconds=1))
        second = deliver(reload(env.tenant, schedule), env.tenant, at(), at(seconds=2))
    assert [d.outcome for d in first + second] == ["started", "existing"]
    assert first[0].run_id == second[0].run_id
    (run,) = runs(env.tenant, schedule)
    assert run.start_idempotency_key == firing_key(schedule.id, at())


def test_the_compare_and_swap_has_one_winner(env: Any) -> None:
    schedule = create(env.tenant, "cas")
    with tenant_context(env.tenant.id):
        assert store.advance(schedule, at(), next_run_at=at(1)) is True
        stale = Schedule.objects.get(id=schedule.id)
        stale.next_run_at = at()  # what a slower scheduler read
        assert store.advance(stale, at(), next_run_at=at(1)) is False
    assert reload(env.tenant, schedule).next_run_at == at(1)


def test_schedules_of_every_tenant_fire_in_one_tick_each_in_its_own_tenant(
    env: Any, other_tenant: Tenant
) -> None:
    other = DatabaseWorkflowEnvironment(other_tenant)
    try:
        other.deploy("quick", quick())
        mine = create(env.tenant, "mine", "quick")
        theirs = create(other_tenant, "theirs", "quick")
        report = tick(at(seconds=5))
        assert report.started == 2
        assert [r.tenant_id for r in runs(env.tenant, mine)] == [env.tenant.id]
        assert [r.tenant_id for r in runs(other_tenant, theirs)] == [other_tenant.id]
        assert runs(env.tenant, theirs) == []
    finally:
        other.close()


# --- misfires -----------------------------------------------------------------------------------


def test_a_three_hour_outage_catch_up_delivers_the_limit_and_skip_delivers_none(env: Any) -> None:
    """Every five minutes from 12:00, nothing ticks until 15:02: 37 instants missed. catch_up
    (limit 10) delivers exactly 10, the newest, one per tick; skip delivers none; both then
    wait for 15:05, which each fires normally."""
    catching = create(env.tenant, "catching", "quick", cron="*/5 * * * *", catch_up_limit=10)
    skipping = create(env.tenant, "skipping", "quick", cron="*/5 * * * *", misfire_policy="skip")
    reports = tick_until_quiet(at(182))
    assert sum(r.started for r in reports) == 10
    assert len(reports) >= 10  # one instant per tick
    assert instants_of(env.tenant, catching) == [at(135 + 5 * i) for i in range(10)]
    assert instants_of(env.tenant, skipping) == []
    assert sum(r.missed for r in reports) == 27 + 37
    assert reload(env.tenant, catching).next_run_at == at(185)
    assert reload(env.tenant, skipping).next_run_at == at(185)
    assert tick(at(185, 1)).started == 2


def test_catch_up_under_its_limit_delivers_every_missed_instant(env: Any) -> None:
    schedule = create(env.tenant, "hourly", "quick", cron="@hourly")
    tick_until_quiet(at(180, 30))
    assert instants_of(env.tenant, schedule) == [at(0), at(60), at(120), at(180)]


# --- overlap policies (the previous run waits for a signal) -----------------------------------


def first_run_waiting(env: Any, policy: str) -> tuple[Schedule, WorkflowInstance]:
    schedule = create(env.tenant, f"ov-{policy}".replace("_", "-"), overlap_policy=policy)
    assert tick(at(seconds=1)).started == 1
    env.run_until_idle()
    (run,) = runs(env.tenant, schedule)
    assert status(env.tenant, run) == RunStatus.READY  # waiting for "finish"
    return schedule, run


def finish(env: Any, run: WorkflowInstance) -> None:
    env.signal(str(run.id), "finish", {})
    env.run_until_idle()
    assert status(env.tenant, run) == RunStatus.DONE


def test_overlap_allow_starts_while_the_previous_runs(env: Any) -> None:
    schedule, _ = first_run_waiting(env, "allow")
    assert tick(at(1, 1)).started == 1
    env.run_until_idle()
    assert [status(env.tenant, r) for r in runs(env.tenant, schedule)] == ["ready", "ready"]


def test_overlap_skip_drops_instants_while_the_previous_runs(env: Any) -> None:
    schedule, first = first_run_waiting(env, "skip")
    report = tick(at(1, 1))
    assert (report.started, report.skipped) == (0, 1)
    assert reload(env.tenant, schedule).next_run_at == at(2)
    finish(env, first)
    assert tick(at(2, 1)).started == 1
    assert instants_of(env.tenant, schedule) == [at(0), at(2)]


def test_overlap_buffer_one_keeps_one_instant_for_when_the_previous_ends(env: Any) -> None:
    schedule, first = first_run_waiting(env, "buffer_one")
    assert tick(at(1, 1)).buffered == 1
    assert tick(at(2, 1)).dropped == 1
    assert reload(env.tenant, schedule).buffered_instants == [at(1).isoformat()]
    assert tick(at(2, 30)).started == 0  # still going
    finish(env, first)
    report = tick(at(2, 40))  # not due by time: the ended run releases the buffer
    assert report.started == 1
    assert instants_of(env.tenant, schedule) == [at(0), at(1)]
    after = reload(env.tenant, schedule)
    assert (after.buffered_count, after.last_run_at) == (0, at(1))


def test_buffer_one_releases_the_held_instant_before_queueing_a_new_one(env: Any) -> None:
    """The previous run ended but no tick released the buffer before the next instant came:
    the held instant starts and the new one takes its place in the buffer."""
    schedule, first = first_run_waiting(env, "buffer_one")
    assert tick(at(1, 1)).buffered == 1
    finish(env, first)
    report = tick(at(2, 1))
    assert (report.started, report.buffered, report.dropped) == (1, 1, 0)
    assert instants_of(env.tenant, schedule) == [at(0), at(1)]
    assert reload(env.tenant, schedule).buffered_instants == [at(2).isoformat()]


def test_overlap_buffer_all_releases_every_instant_one_after_another(env: Any) -> None:
    schedule, first = first_run_waiting(env, "buffer_all")
    assert tick(at(1, 1)).buffered == 1
    assert tick(at(2, 1)).buffered == 1
    assert reload(env.tenant, schedule).buffered_count == 2
    finish(env, first)
    assert tick(at(2, 30)).started == 1
    assert tick(at(2, 31)).started == 0  # the released run is going now
    env.run_until_idle()
    second = runs(env.tenant, schedule)[-1]
    finish(env, second)
    assert tick(at(2, 40)).started == 1
    assert instants_of(env.tenant, schedule) == [at(0), at(1), at(2)]
    assert reload(env.tenant, schedule).buffered_count == 0


def test_overlap_cancel_other_requests_cancellation_and_starts_the_new_run(env: Any) -> None:
    schedule, first = first_run_waiting(env, "cancel_other")
    report = tick(at(1, 1))
    assert report.started == 1
    assert report.deliveries[0].replaced == (first.id,)
    with tenant_context(env.tenant.id):
        assert WorkflowInstance.objects.get(id=first.id).cancel_requested is True
    env.run_until_idle()
    # The wait ends with CANCELLED (status 5) and the run completes on its own terms.
    assert env.result(str(first.id)) == [[5, ""]]
    newer = runs(env.tenant, schedule)[-1]
    assert newer.id != first.id and status(env.tenant, newer) == RunStatus.READY


def test_overlap_terminate_other_terminates_and_starts_the_new_run(env: Any) -> None:
    schedule, first = first_run_waiting(env, "terminate_other")
    report = tick(at(1, 1))
    assert report.started == 1 and report.deliveries[0].replaced == (first.id,)
    assert status(env.tenant, first) == RunStatus.TERMINATED
    env.run_until_idle()
    assert [status(env.tenant, r) for r in runs(env.tenant, schedule)] == ["terminated", "ready"]


# --- failures and rows the scheduler cannot interpret ------------------------------------------


def test_pause_on_failure_disables_the_schedule_after_a_failed_run(env: Any) -> None:
    env.deploy("failing", failing())
    schedule = create(env.tenant, "fragile", "failing", pause_on_failure=True)
    assert tick(at(seconds=1)).started == 1
    env.run_until_idle()
    (run,) = runs(env.tenant, schedule)
    assert status(env.tenant, run) == RunStatus.FAILED
    report = tick(at(1, 1))
    assert (report.started, report.disabled) == (0, 1)
    after = reload(env.tenant, schedule)
    assert after.enabled is False
    assert f"its last run {run.id} ended failed" in after.notes
    assert tick(at(2, 1)).due == 0


def test_without_pause_on_failure_a_failed_run_does_not_stop_the_schedule(env: Any) -> None:
    env.deploy("failing", failing())
    schedule = create(env.tenant, "sturdy", "failing")
    tick(at(seconds=1))
    env.run_until_idle()
    assert tick(at(1, 1)).started == 1
    assert reload(env.tenant, schedule).enabled is True


@pytest.mark.parametrize(
    ("stored", "note"),
    [
        ({"cron": "61 * * * *"}, "minute field '61': 61 is outside 0-59"),
        ({"timezone": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"workflow_name": "vanished"}, "no workflow definition named 'vanished'"),
        ({"input": "{not json"}, "input is not valid JSON"),
    ],
)
def test_a_row_the_scheduler_cannot_interpret_is_disabled_with_a_note(
    env: Any, stored: dict[str, str], note: str
) -> None:
    """Stored around the validation (the ORM, an old release): the tick disables it with
    the reason in its notes and goes on with the other schedules."""
    good = create(env.tenant, "good", "quick")
    with tenant_context(env.tenant.id):
        bad = Schedule.objects.create(
            tenant=env.tenant,
            name="bad",
            workflow_name=stored.get("workflow_name", "quick"),
            cron=stored.get("cron", "* * * * *"),
            timezone=stored.get("timezone", "UTC"),
            input=stored.get("input", "null"),
            next_run_at=at(),
            notes="owned by the reports team",
        )
    report = tick(at(seconds=1))
    assert (report.started, report.disabled, report.errors) == (1, 1, 0)
    assert len(runs(env.tenant, good)) == 1 and runs(env.tenant, bad) == []
    after = reload(env.tenant, bad)
    assert after.enabled is False
    assert after.notes.startswith("owned by the reports team\n")
    assert "disabled by the scheduler" in after.notes and note in after.notes
    assert tick(at(1, 1)).started == 1


def test_a_database_error_is_logged_and_the_instant_retried_next_tick(
    env: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The due read failing, or one row's start failing, never raises out of the tick; the
    row's transaction rolls back whole (its next_run_at included), so the next tick fires
    the same instant."""
    from django.db import OperationalError

    import schedules.scheduler as scheduler

    schedule = create(env.tenant, "flaky", "quick")

    def read_fails(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(scheduler.store, "due_schedules", read_fails)
        report = tick(at(seconds=1))
    assert (report.errors, report.started) == (1, 0)

    real_start = scheduler.start_workflow
    calls = []

    def start_fails_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["idempotency_key"])
        if len(calls) == 1:
            raise OperationalError("connection reset during insert")
        return real_start(*args, **kwargs)

    monkeypatch.setattr(scheduler, "start_workflow", start_fails_once)
    report = tick(at(seconds=2))
    assert (report.errors, report.started, report.disabled) == (1, 0, 0)
    assert reload(env.tenant, schedule).next_run_at == at()  # rolled back with the start
    assert "event=schedule_error" in caplog.text
    assert tick(at(seconds=3)).started == 1
    assert calls == [firing_key(schedule.id, at())] * 2
    assert instants_of(env.tenant, schedule) == [at()]
    assert reload(env.tenant, schedule).next_run_at == at(1)


# --- the service layer -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "error", "field", "fragment"),
    [
        ({"cron": "abc * * * *"}, InvalidInput, "cron", "minute field 'abc'"),
        ({"cron": "61 * * * *"}, InvalidInput, "cron", "minute field '61': 61 is outside 0-59"),
        ({"cron": "0 0 30 2 *"}, InvalidInput, "cron", "never fires"),
        ({"cron": ""}, InvalidInput, "cron", "required"),
        ({"timezone": "Mars/Olympus"}, InvalidInput, "timezone", "unknown time zone"),
        ({"timezone": "Europe"}, InvalidInput, "timezone", "unknown time zone"),
        ({"misfire_policy": "later"}, InvalidInput, "misfire_policy", "catch_up, skip"),
        ({"overlap_policy": "queue"}, InvalidInput, "overlap_policy", "buffer_one"),
        ({"catch_up_limit": 0}, InvalidInput, "catch_up_limit", "from 1 to"),
        ({"name": "no spaces please"}, InvalidInput, "name", "is not a valid name"),
        ({"workflow_name": "nope"}, NotFound, "workflow_name", "nope"),
        ({"workflow_version": 9}, NotFound, "workflow_version", "no version 9"),
        ({"entry_point": "report"}, InvalidInput, "entry_point", "no entry point 'report'"),
        ({"input": "{oops"}, InvalidInput, "input", "not valid JSON"),
        ({"enabled": "yes"}, InvalidInput, "enabled", "true or false"),
        ({"colour": "blue"}, InvalidInput, "colour", "not a schedule field"),
    ],
)
def test_bad_input_is_refused_naming_the_field(
    env: Any, values: dict[str, Any], error: type[ServiceError], field: str, fragment: str
) -> None:
    arguments = {"name": "nightly", "workflow_name": "quick", "cron": "0 2 * * *", **values}
    with pytest.raises(error) as caught:
        sched.create_schedule(env.tenant, **arguments)
    assert caught.value.field == field
    assert fragment in caught.value.message
    with tenant_context(env.tenant.id):
        assert not Schedule.objects.exists()


@pytest.mark.parametrize("macro", ["@hourly", "@daily", "@weekly", "@monthly", "@yearly"])
def test_macros_are_accepted(env: Any, macro: str) -> None:
    made = sched.create_schedule(env.tenant, name="m", workflow_name="quick", cron=macro, now=BASE)
    assert made.next_run_at == sched.preview_expression(macro, "UTC", count=1, after=BASE)[0]


def test_names_are_unique_and_the_quota_holds(env: Any) -> None:
    create(env.tenant, "one", "quick")
    with pytest.raises(Conflict) as caught:
        create(env.tenant, "one", "quick")
    assert caught.value.field == "name"
    Tenant.objects.filter(id=env.tenant.id).update(schedule_quota=1)
    with pytest.raises(sched.QuotaExceeded):
        create(env.tenant, "two", "quick")


def test_update_pause_resume_and_preview(env: Any) -> None:
    schedule = create(env.tenant, "edit", "quick")
    updated = sched.update_schedule(
        env.tenant, "edit", cron="30 2 * * *", timezone="America/New_York", now=at()
    )
    assert updated.next_run_at == datetime(2031, 1, 7, 7, 30, tzinfo=UTC)  # 02:30 EST
    with pytest.raises(InvalidInput) as caught:
        sched.update_schedule(env.tenant, schedule.id, timezone="Nowhere/Land")
    assert caught.value.field == "timezone"
    paused = sched.pause_schedule(env.tenant, "edit", reason="maintenance", now=at())
    assert paused.enabled is False and "paused by api: maintenance" in paused.notes
    assert tick(datetime(2031, 1, 7, 7, 31, tzinfo=UTC)).started == 0
    resumed = sched.resume_schedule(env.tenant, "edit", now=datetime(2031, 1, 9, tzinfo=UTC))
    assert resumed.next_run_at == datetime(2031, 1, 9, 7, 30, tzinfo=UTC)  # nothing owed
    preview = sched.preview_schedule(
        env.tenant, "edit", count=3, after=datetime(2031, 3, 8, tzinfo=UTC)
    )
    # 02:30 EST; 9 March 2031 springs forward (02:30 does not exist: 03:00 EDT); 02:30 EDT
    assert preview == [
        datetime(2031, 3, 8, 7, 30, tzinfo=UTC),
        datetime(2031, 3, 9, 7, 0, tzinfo=UTC),
        datetime(2031, 3, 10, 6, 30, tzinfo=UTC),
    ]
    with pytest.raises(NotFound):
        sched.get_schedule(env.tenant, "missing")


def test_trigger_now_honours_the_overlap_policy(env: Any) -> None:
    schedule, _ = first_run_waiting(env, "skip")
    made = sched.trigger_schedule(env.tenant, schedule.id, now=at(0, 20))
    assert [d.outcome for d in made] == ["skipped"]
    made = sched.trigger_schedule(env.tenant, schedule.id, now=at(0, 21), overlap_policy="allow")
    assert [d.outcome for d in made] == ["started"]
    assert len(runs(env.tenant, schedule)) == 2


def test_backfill_delivers_each_instant_under_the_policy(env: Any) -> None:
    allow = create(env.tenant, "fill-allow", "quick", cron="0 * * * *")
    made = sched.backfill_schedule(env.tenant, allow, at(-300), at(-60), now=at())
    assert [d.outcome for d in made] == ["started"] * 5
    assert instants_of(env.tenant, allow) == [at(-300 + 60 * i) for i in range(5)]
    again = sched.backfill_schedule(env.tenant, allow, at(-120), at(-60), now=at())
    assert [d.outcome for d in again] == ["existing", "existing"]  # one run per instant

    skip = create(env.tenant, "fill-skip", "waiter", cron="0 * * * *", overlap_policy="skip")
    made = sched.backfill_schedule(env.tenant, skip, at(-300), at(-60), now=at())
    assert [d.outcome for d in made] == ["started"] + ["skipped"] * 4

    with pytest.raises(InvalidInput) as caught:
        sched.backfill_schedule(env.tenant, allow, at(-60), at(-120), now=at())
    assert caught.value.field == "end"
    with pytest.raises(InvalidInput) as caught:
        sched.backfill_schedule(env.tenant, allow, at(-60), at(60), now=at())
    assert caught.value.field == "end" and "future" in caught.value.message
    with pytest.raises(InvalidInput) as caught:
        sched.backfill_schedule(
            env.tenant, "fill-skip", at(-60 * 24 * 60), at(), now=at(), max_instants=100
        )
    assert caught.value.field == "end" and "more than 100" in caught.value.message


# --- the worker -----------------------------------------------------------------------------------


def test_a_burst_worker_fires_a_due_schedule_and_runs_it(env: Any) -> None:
    # Yearly, so that a burst that runs past a minute boundary on a loaded machine does not
    # find the next instant due as well (a minutely cron did, and started two runs).
    schedule = sched.create_schedule(env.tenant, name="w", workflow_name="quick", cron="@yearly")
    with tenant_context(env.tenant.id):
        Schedule.objects.filter(id=schedule.id).update(next_run_at=timezone.now())
    Worker(WorkerOptions(worker_id="sched-burst", concurrency=1, burst=True)).run()
    (run,) = runs(env.tenant, schedule)
    assert status(env.tenant, run) == RunStatus.DONE


def test_runscheduler_once_ticks_and_reports(env: Any) -> None:
    schedule = sched.create_schedule(env.tenant, name="op", workflow_name="quick", cron="@daily")
    with tenant_context(env.tenant.id):
        Schedule.objects.filter(id=schedule.id).update(next_run_at=timezone.now())
    out = io.StringIO()
    call_command("runscheduler", "--once", stdout=out)
    assert "due=1 initialised=0 started=1 " in out.getvalue()
    assert len(runs(env.tenant, schedule)) == 1
    with pytest.raises(CommandError, match="unknown tenant"):
        call_command("runscheduler", "--once", "--tenant", "nobody")


def test_an_idle_worker_wakes_for_the_next_schedule_instant(env: Any) -> None:
    """Poll interval 30 s; the schedule is due in 1.5 s: the worker sleeps until then, not
    for the poll interval, and starts the run within a second of the instant."""
    schedule = sched.create_schedule(env.tenant, name="soon", workflow_name="quick", cron="@yearly")
    instant = timezone.now() + timedelta(seconds=1.5)
    with tenant_context(env.tenant.id):
        Schedule.objects.filter(id=schedule.id).update(next_run_at=instant)
    worker = Worker(WorkerOptions(worker_id="sched-idle", concurrency=1, poll_interval_s=30.0))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not runs(env.tenant, schedule):
            time.sleep(0.05)
        started = runs(env.tenant, schedule)
        assert len(started) == 1, "the worker did not fire the schedule within 10 s"
        lateness = (started[0].created_at - instant).total_seconds()
        assert 0 <= lateness < 1.0
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
