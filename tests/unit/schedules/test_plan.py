"""Misfire planning (schedules.scheduler.plan_firing), pure: what a due schedule delivers at a
given time, simulated tick by tick the way the scheduler applies it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from schedules.cron import compile_cron
from schedules.scheduler import plan_firing

GRACE = timedelta(seconds=60)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def run_ticks(
    expr: str, next_run_at: datetime, now: datetime, policy: str, limit: int
) -> tuple[list[datetime], datetime, int]:
    """Tick at ``now`` until nothing is due: (delivered, final next_run_at, missed)."""
    timing = compile_cron(expr, "UTC")
    delivered: list[datetime] = []
    missed = 0
    for _ in range(10_000):
        if next_run_at > now:
            break
        plan = plan_firing(timing, next_run_at, now, policy, limit, GRACE)
        assert plan.next_run_at is not None and plan.next_run_at > next_run_at
        if plan.deliver is not None:
            delivered.append(plan.deliver)
        missed += plan.missed
        next_run_at = plan.next_run_at
    return delivered, next_run_at, missed


def test_on_time_delivers_the_instant_and_moves_to_the_next() -> None:
    timing = compile_cron("*/5 * * * *", "UTC")
    plan = plan_firing(timing, utc(2025, 1, 1, 12), utc(2025, 1, 1, 12, 0, 59), "skip", 60, GRACE)
    assert (plan.deliver, plan.next_run_at, plan.missed) == (
        utc(2025, 1, 1, 12),
        utc(2025, 1, 1, 12, 5),
        0,
    )


def test_three_hour_outage_catch_up_delivers_exactly_the_limit() -> None:
    """12:00 .. 15:00 every 5 minutes is 37 missed instants; with a limit of 10 the newest 10
    are delivered, oldest first, one per tick; the schedule then waits for 15:05."""
    delivered, following, missed = run_ticks(
        "*/5 * * * *", utc(2025, 1, 1, 12), utc(2025, 1, 1, 15, 2), "catch_up", 10
    )
    assert len(delivered) == 10
    assert delivered == [utc(2025, 1, 1, 14, 15) + timedelta(minutes=5 * i) for i in range(10)]
    assert following == utc(2025, 1, 1, 15, 5)
    assert missed == 27


def test_three_hour_outage_catch_up_under_the_limit_delivers_every_missed_instant() -> None:
    delivered, following, missed = run_ticks(
        "*/5 * * * *", utc(2025, 1, 1, 12), utc(2025, 1, 1, 15, 2), "catch_up", 60
    )
    assert len(delivered) == 37 == len(set(delivered))
    assert delivered[0] == utc(2025, 1, 1, 12) and delivered[-1] == utc(2025, 1, 1, 15)
    assert (following, missed) == (utc(2025, 1, 1, 15, 5), 0)


def test_three_hour_outage_skip_delivers_none() -> None:
    delivered, following, missed = run_ticks(
        "*/5 * * * *", utc(2025, 1, 1, 12), utc(2025, 1, 1, 15, 2), "skip", 60
    )
    assert delivered == []
    assert (following, missed) == (utc(2025, 1, 1, 15, 5), 37)


def test_skip_still_delivers_the_newest_instant_when_it_is_on_time() -> None:
    """Back at 15:00:30: the 15:00 instant is 30 s late (on time), the rest is backlog."""
    delivered, following, missed = run_ticks(
        "*/5 * * * *", utc(2025, 1, 1, 12), utc(2025, 1, 1, 15, 0, 30), "skip", 60
    )
    assert delivered == [utc(2025, 1, 1, 15)]
    assert (following, missed) == (utc(2025, 1, 1, 15, 5), 36)


def test_a_late_daily_digest_is_skipped_or_caught_up() -> None:
    """One instant, five hours late: skip drops it, catch_up delivers it."""
    skipped = run_ticks("0 9 * * *", utc(2025, 1, 1, 9), utc(2025, 1, 1, 14), "skip", 60)
    assert skipped == ([], utc(2025, 1, 2, 9), 1)
    caught = run_ticks("0 9 * * *", utc(2025, 1, 1, 9), utc(2025, 1, 1, 14), "catch_up", 60)
    assert caught == ([utc(2025, 1, 1, 9)], utc(2025, 1, 2, 9), 0)


def test_catch_up_limit_one_delivers_only_the_newest() -> None:
    delivered, following, _ = run_ticks(
        "0 * * * *", utc(2025, 1, 1, 0), utc(2025, 1, 1, 5, 30), "catch_up", 1
    )
    assert delivered == [utc(2025, 1, 1, 5)]
    assert following == utc(2025, 1, 1, 6)
