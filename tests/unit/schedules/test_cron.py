"""Cron math on a wall clock (schedules.cron): DST changes in both directions for fixed-hour
and periodic schedules, half-hour and 45-minute zones, validation naming the field, the
shipped tzdata. Pure: no database, every instant passed in."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from schedules.cron import CronError, compile_cron, load_zone, next_fire_time


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fires(expr: str, zone: str, start: datetime, end: datetime) -> list[str]:
    """Every firing in [start, end) as wall-clock text with the zone's abbreviation/offset."""
    schedule = compile_cron(expr, zone)
    found = schedule.between(start, end - timedelta(microseconds=1), 10_000)
    return [schedule.local(t).strftime("%m-%d %H:%M %Z") for t in found]


def gaps_minutes(expr: str, zone: str, start: datetime, end: datetime) -> list[int]:
    schedule = compile_cron(expr, zone)
    found = schedule.between(start, end, 10_000)
    return [int((b - a).total_seconds() // 60) for a, b in itertools.pairwise(found)]


# --- America/New_York: 2025-03-09 02:00 EST -> 03:00 EDT; 2025-11-02 02:00 EDT -> 01:00 EST ---


def test_new_york_spring_forward_daily_0230_fires_once_at_the_transition() -> None:
    """02:30 does not exist on 9 March: it fires once, at 03:00 EDT (07:00Z), the first
    instant after the gap; the days around it are ordinary."""
    assert fires("30 2 * * *", "America/New_York", utc(2025, 3, 8), utc(2025, 3, 11)) == [
        "03-08 02:30 EST",
        "03-09 03:00 EDT",
        "03-10 02:30 EDT",
    ]
    assert next_fire_time("30 2 * * *", "America/New_York", utc(2025, 3, 9)) == utc(2025, 3, 9, 7)


def test_new_york_spring_forward_daily_0130_is_unaffected() -> None:
    assert fires("30 1 * * *", "America/New_York", utc(2025, 3, 8), utc(2025, 3, 11)) == [
        "03-08 01:30 EST",
        "03-09 01:30 EST",
        "03-10 01:30 EDT",
    ]


def test_new_york_fall_back_daily_0130_fires_once_at_its_first_occurrence() -> None:
    """01:30 happens twice on 2 November (EDT, then EST): it fires at the first (05:30Z)
    and not again an hour later."""
    assert fires("30 1 * * *", "America/New_York", utc(2025, 11, 1), utc(2025, 11, 4)) == [
        "11-01 01:30 EDT",
        "11-02 01:30 EDT",
        "11-03 01:30 EST",
    ]
    schedule = compile_cron("30 1 * * *", "America/New_York")
    assert schedule.next_after(utc(2025, 11, 2, 5, 30)) == utc(2025, 11, 3, 6, 30)


def test_new_york_fall_back_daily_0230_is_unaffected() -> None:
    assert fires("30 2 * * *", "America/New_York", utc(2025, 11, 1), utc(2025, 11, 4)) == [
        "11-01 02:30 EDT",
        "11-02 02:30 EST",
        "11-03 02:30 EST",
    ]


def test_new_york_every_15_minutes_on_spring_forward_keeps_a_15_minute_rhythm() -> None:
    """Wall times 02:00-02:45 do not exist and do not fire; 01:45 EST is followed by
    03:00 EDT, 15 real minutes later."""
    assert fires(
        "*/15 * * * *", "America/New_York", utc(2025, 3, 9, 6, 30), utc(2025, 3, 9, 7, 31)
    ) == [
        "03-09 01:30 EST",
        "03-09 01:45 EST",
        "03-09 03:00 EDT",
        "03-09 03:15 EDT",
        "03-09 03:30 EDT",
    ]
    day = gaps_minutes("*/15 * * * *", "America/New_York", utc(2025, 3, 9, 5), utc(2025, 3, 10, 4))
    assert set(day) == {15}
    assert len(day) == 23 * 4  # a 23-hour day, midnight to midnight


def test_new_york_every_15_minutes_on_fall_back_fires_in_both_passes() -> None:
    """The repeated hour fires in both passes (each absolute instant once): 25 hours of
    firings, always 15 real minutes apart."""
    assert fires(
        "*/15 * * * *", "America/New_York", utc(2025, 11, 2, 5, 30), utc(2025, 11, 2, 7, 1)
    ) == [
        "11-02 01:30 EDT",
        "11-02 01:45 EDT",
        "11-02 01:00 EST",
        "11-02 01:15 EST",
        "11-02 01:30 EST",
        "11-02 01:45 EST",
        "11-02 02:00 EST",
    ]
    day = gaps_minutes("*/15 * * * *", "America/New_York", utc(2025, 11, 2, 4), utc(2025, 11, 3, 5))
    assert set(day) == {15}
    assert len(day) == 25 * 4  # a 25-hour day


def test_hourly_stays_hourly_through_both_changes() -> None:
    spring = gaps_minutes("@hourly", "America/New_York", utc(2025, 3, 9, 3), utc(2025, 3, 9, 12))
    autumn = gaps_minutes("@hourly", "America/New_York", utc(2025, 11, 2, 3), utc(2025, 11, 2, 12))
    assert set(spring) == set(autumn) == {60}


# --- Europe/London: 2025-03-30 01:00 GMT -> 02:00 BST; 2025-10-26 02:00 BST -> 01:00 GMT ---


def test_london_spring_forward_0130_fires_at_0200_bst_and_0230_is_unaffected() -> None:
    assert fires("30 1 * * *", "Europe/London", utc(2025, 3, 29), utc(2025, 4, 1)) == [
        "03-29 01:30 GMT",
        "03-30 02:00 BST",
        "03-31 01:30 BST",
    ]
    assert next_fire_time("30 1 * * *", "Europe/London", utc(2025, 3, 30)) == utc(2025, 3, 30, 1)
    assert fires("30 2 * * *", "Europe/London", utc(2025, 3, 29), utc(2025, 4, 1)) == [
        "03-29 02:30 GMT",
        "03-30 02:30 BST",
        "03-31 02:30 BST",
    ]


def test_london_fall_back_0130_fires_once_and_0230_is_unaffected() -> None:
    assert fires("30 1 * * *", "Europe/London", utc(2025, 10, 25), utc(2025, 10, 28)) == [
        "10-25 01:30 BST",
        "10-26 01:30 BST",
        "10-27 01:30 GMT",
    ]
    assert fires("30 2 * * *", "Europe/London", utc(2025, 10, 25), utc(2025, 10, 28)) == [
        "10-25 02:30 BST",
        "10-26 02:30 GMT",
        "10-27 02:30 GMT",
    ]


def test_london_every_15_minutes_on_both_change_days() -> None:
    assert fires(
        "*/15 * * * *", "Europe/London", utc(2025, 3, 30, 0, 30), utc(2025, 3, 30, 1, 16)
    ) == [
        "03-30 00:30 GMT",
        "03-30 00:45 GMT",
        "03-30 02:00 BST",
        "03-30 02:15 BST",
    ]
    assert fires(
        "*/15 * * * *", "Europe/London", utc(2025, 10, 26, 0, 30), utc(2025, 10, 26, 1, 16)
    ) == [
        "10-26 01:30 BST",
        "10-26 01:45 BST",
        "10-26 01:00 GMT",
        "10-26 01:15 GMT",
    ]
    for start, hours in ((utc(2025, 3, 29, 23), 23), (utc(2025, 10, 25, 23), 25)):
        day = gaps_minutes("*/15 * * * *", "Europe/London", start, start + timedelta(hours=hours))
        assert set(day) == {15}
        assert len(day) == hours * 4


# --- half-hour and 45-minute offsets ---


def test_lord_howe_half_hour_spring_forward() -> None:
    """Lord Howe moves 02:00 +10:30 -> 02:30 +11 (5 October 2025): 02:15 does not exist and
    fires at 02:30, 02:45 exists; */15 goes from 01:45 straight to 02:30, 15 real minutes."""
    zone = "Australia/Lord_Howe"
    assert fires("15 2 * * *", zone, utc(2025, 10, 3, 12), utc(2025, 10, 6, 12)) == [
        "10-04 02:15 +1030",
        "10-05 02:30 +11",
        "10-06 02:15 +11",
    ]
    assert fires("45 2 * * *", zone, utc(2025, 10, 4, 12), utc(2025, 10, 5, 12)) == [
        "10-05 02:45 +11"
    ]
    assert fires("*/15 * * * *", zone, utc(2025, 10, 4, 15, 0), utc(2025, 10, 4, 15, 31)) == [
        "10-05 01:30 +1030",
        "10-05 01:45 +1030",
        "10-05 02:30 +11",
    ]


def test_lord_howe_half_hour_fall_back() -> None:
    """6 April 2025: 02:00 +11 -> 01:30 +10:30, so 01:30-01:59 happen twice. 01:45 daily
    fires once (the +11 occurrence); */15 fires 01:30 and 01:45 in both passes."""
    zone = "Australia/Lord_Howe"
    assert fires("45 1 * * *", zone, utc(2025, 4, 4, 12), utc(2025, 4, 7, 12)) == [
        "04-05 01:45 +11",
        "04-06 01:45 +11",
        "04-07 01:45 +1030",
    ]
    assert fires("*/15 * * * *", zone, utc(2025, 4, 5, 14, 15), utc(2025, 4, 5, 15, 31)) == [
        "04-06 01:15 +11",
        "04-06 01:30 +11",
        "04-06 01:45 +11",
        "04-06 01:30 +1030",
        "04-06 01:45 +1030",
        "04-06 02:00 +1030",
    ]


def test_kathmandu_plus_0545() -> None:
    """No DST, an offset of +05:45: 09:00 local is 03:15Z every day."""
    schedule = compile_cron("0 9 * * *", "Asia/Kathmandu")
    found = schedule.preview(utc(2025, 6, 1), 3)
    assert found == [utc(2025, 6, 1, 3, 15), utc(2025, 6, 2, 3, 15), utc(2025, 6, 3, 3, 15)]
    assert schedule.local(found[0]).strftime("%H:%M %z") == "09:00 +0545"
    assert compile_cron("*/30 * * * *", "Asia/Kathmandu").next_after(utc(2025, 6, 1, 0, 0)) == utc(
        2025, 6, 1, 0, 15
    )


# --- general behaviour ---


def test_next_is_strictly_after_and_prev_strictly_before() -> None:
    schedule = compile_cron("0 * * * *", "UTC")
    assert schedule.next_after(utc(2025, 1, 1, 10)) == utc(2025, 1, 1, 11)
    assert schedule.next_after(utc(2025, 1, 1, 10, 0, 0) - timedelta(microseconds=1)) == utc(
        2025, 1, 1, 10
    )
    assert schedule.prev_before(utc(2025, 1, 1, 10)) == utc(2025, 1, 1, 9)
    assert schedule.prev_before(utc(2025, 1, 1, 10, 0, 1)) == utc(2025, 1, 1, 10)


def test_prev_walks_back_through_a_fall_back_overlap() -> None:
    schedule = compile_cron("*/15 * * * *", "America/New_York")
    cursor = utc(2025, 11, 2, 7, 1)
    back = []
    for _ in range(7):
        found = schedule.prev_before(cursor)
        assert found is not None
        back.append(found)
        cursor = found
    assert [int((a - b).total_seconds()) for a, b in itertools.pairwise(back)] == [900] * 6


def test_day_fields_follow_cron_or_semantics() -> None:
    """Both day fields restricted: either matches (the 1st, or any Monday)."""
    found = compile_cron("0 0 1 * 1", "UTC").preview(utc(2025, 9, 1, 1), 3)
    assert found == [utc(2025, 9, 8), utc(2025, 9, 15), utc(2025, 9, 22)]
    only_mondays = compile_cron("0 0 * * mon", "UTC").preview(utc(2025, 9, 1, 1), 2)
    assert only_mondays == [utc(2025, 9, 8), utc(2025, 9, 15)]
    sunday_as_7 = compile_cron("0 0 * * 7", "UTC").next_after(utc(2025, 9, 1))
    assert sunday_as_7 == utc(2025, 9, 7)


def test_february_29_waits_for_a_leap_year() -> None:
    assert compile_cron("0 0 29 2 *", "UTC").preview(utc(2025, 1, 1), 2) == [
        utc(2028, 2, 29),
        utc(2032, 2, 29),
    ]


@pytest.mark.parametrize(
    ("macro", "after", "expected"),
    [
        ("@hourly", utc(2025, 5, 5, 10, 10), utc(2025, 5, 5, 11)),
        ("@daily", utc(2025, 5, 5, 10, 10), utc(2025, 5, 6)),
        ("@weekly", utc(2025, 5, 5, 10, 10), utc(2025, 5, 11)),  # Sunday
        ("@monthly", utc(2025, 5, 5, 10, 10), utc(2025, 6, 1)),
        ("@yearly", utc(2025, 5, 5, 10, 10), utc(2026, 1, 1)),
    ],
)
def test_macros(macro: str, after: datetime, expected: datetime) -> None:
    assert compile_cron(macro, "UTC").next_after(after) == expected


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("abc * * * *", "minute field 'abc'"),
        ("61 * * * *", "minute field '61': 61 is outside 0-59"),
        ("0 0 30 2 *", "never fires"),
        ("0 24 * * *", "hour field '24'"),
        ("* * * *", "5 fields"),
        ("@every", "unknown macro"),
    ],
)
def test_invalid_expressions_are_refused_naming_the_field(expr: str, names: str) -> None:
    with pytest.raises(CronError) as caught:
        compile_cron(expr, "UTC")
    assert caught.value.field == "cron"
    assert names in caught.value.message


@pytest.mark.parametrize("name", ["Mars/Olympus", "../../etc/passwd", "", "Europe"])
def test_unknown_zones_are_refused_naming_the_field(name: str) -> None:
    with pytest.raises(CronError) as caught:
        compile_cron("0 9 * * *", name) if name else load_zone(name)
    assert caught.value.field == "timezone"


def test_zones_come_from_the_shipped_tzdata_package() -> None:
    import tzdata

    zone = load_zone("Europe/London")
    assert zone.key == "Europe/London"
    assert load_zone("Europe/London") is zone  # loaded once
    assert tzdata.IANA_VERSION  # the version the project pins in requirements.txt


def test_compiling_is_cheap_enough_for_every_minute_schedules() -> None:
    """A minute schedule's next instant is a lookup in a cached day, not a minute scan."""
    import time

    schedule = compile_cron("* * * * *", "Europe/London")
    start = time.perf_counter()
    cursor = utc(2025, 10, 25, 22)
    for _ in range(3000):  # across the fall-back night
        found = schedule.next_after(cursor)
        assert found is not None and found > cursor
        cursor = found
    assert time.perf_counter() - start < 2.0
    assert cursor == utc(2025, 10, 25, 22) + timedelta(minutes=3000)
