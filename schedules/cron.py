"""Cron math on a wall clock in an IANA time zone.

Pure: every function takes the instant it reasons about; nothing here reads the clock.
Expressions are validated by ``engine.cron`` (the same checks the ``schedule_cron`` host call
makes), zones are loaded from the ``tzdata`` package this project pins, never from the host's
``/usr/share/zoneinfo``: two workers on different base images must compute the same instants.

How an expression becomes instants
----------------------------------

The five fields are matched against the *wall clock* of the schedule's zone (standard cron
semantics: when both day-of-month and day-of-week are restricted, either may match). Walking
civil days -- not absolute minutes -- is what keeps "02:30 every day" meaning 02:30 on the
wall, whatever the UTC offset is that day. A day on which the zone's offset changes is
treated wall time by wall time:

* **Fixed-hour schedules** (the hour field is not ``*`` or ``*/n``: ``30 2 * * *``,
  ``@daily``): each matching wall time fires exactly once.

  - a wall time inside a spring-forward gap (it does not exist) fires at the first instant
    after it, which is the transition itself (``02:30`` in New York on the March change
    fires at ``03:00`` EDT);
  - an ambiguous wall time in a fall-back overlap fires at its first occurrence (``01:30``
    in New York on the November change fires at ``01:30`` EDT, not again at ``01:30`` EST);
  - several wall times that land on one instant fire once.

* **Periodic schedules** (the hour field is ``*`` or ``*/n``: ``*/15 * * * *``,
  ``@hourly``): they fire at every absolute instant whose wall-clock reading matches, once.
  Wall times in a spring-forward gap have no instant and do not fire; wall times in a
  fall-back overlap fire in both passes. So ``*/15`` keeps a 15-minute rhythm in absolute
  time through both changes (``01:45`` EST is followed by ``03:00`` EDT; the repeated hour
  fires at ``01:00``, ``01:15``, ... EDT and again at ``01:00``, ``01:15``, ... EST), and
  ``@hourly`` stays hourly.

This is the rule Vixie cron applies (wildcard jobs follow the clock, fixed-time jobs are
neither skipped nor doubled) made exact; UTC schedules (the default) never meet any of it.
"""

from __future__ import annotations

import bisect
import functools
import importlib.resources
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Protocol

import tzdata
from croniter import croniter

from engine.cron import cron_error, expand, timezone_error

# A day-of-month-only expression such as "0 0 29 2 *" may wait eight years (2096 -> 2104).
MAX_SEARCH_DAYS = 366 * 9
DEFAULT_TIMEZONE = "UTC"
TZDATA_VERSION: str = tzdata.IANA_VERSION


class CronError(ValueError):
    """A cron expression or time zone the scheduler cannot evaluate; ``field`` names which."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class Timing(Protocol):
    """What the scheduler needs from a schedule's timing (a cron expression in a zone)."""

    def next_after(self, t: datetime) -> datetime | None: ...

    def prev_before(self, t: datetime) -> datetime | None: ...


@functools.lru_cache(maxsize=512)
def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone ``name`` from the shipped ``tzdata`` package (CronError naming ``timezone``)."""
    try:
        problem = timezone_error(name)
    except OSError:  # a directory of the database such as "Europe"
        problem = f"unknown time zone {name!r} (use an IANA name such as Europe/London)"
    if problem:
        raise CronError("timezone", problem)
    try:
        resource = importlib.resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
        with resource.open("rb") as handle:
            return zoneinfo.ZoneInfo.from_file(handle, key=name)
    except (OSError, ValueError):
        raise CronError(
            "timezone", f"time zone {name!r} is not in the shipped tzdata {TZDATA_VERSION}"
        ) from None


def _field_values(values: Sequence[object], low: int, high: int) -> tuple[int, ...] | None:
    """croniter's expansion of one field as sorted ints; None for an unrestricted ``*``."""
    if list(values) == ["*"]:
        return None
    found = sorted({int(str(v)) for v in values})
    if not found or found[0] < low or found[-1] > high:
        raise ValueError(f"values {found} outside {low}-{high}")
    return tuple(found)


@dataclass(frozen=True, eq=False)  # identity: compile_cron caches one per (expr, zone)
class CronSchedule:
    """A validated cron expression evaluated in one zone. Build it with :func:`compile_cron`."""

    expression: str  # as stored (macros kept)
    timezone: str
    zone: zoneinfo.ZoneInfo
    minutes_of_day: tuple[int, ...]  # sorted hour * 60 + minute
    days: frozenset[int] | None  # day of month; None: any
    months: frozenset[int]
    weekdays: frozenset[int] | None  # 0 = Sunday; None: any
    periodic: bool  # the hour field is * or */n (see the module docstring)

    # --- days ---------------------------------------------------------------------------

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        dom = self.days is None or day.day in self.days
        dow = self.weekdays is None or day.isoweekday() % 7 in self.weekdays
        if self.days is not None and self.weekdays is not None:
            return dom or dow  # cron: both restricted means either
        return dom and dow

    def day_instants(self, day: date) -> tuple[int, ...]:
        """Every instant (epoch seconds, ascending) at which the schedule fires for the
        wall-clock times of ``day`` (which must match)."""
        return _day_instants(self, day)

    # --- instants -------------------------------------------------------------------------

    def next_after(self, t: datetime) -> datetime | None:
        """The first firing strictly after ``t`` (aware), in UTC; None if it never fires."""
        stamp = t.timestamp()
        start = t.astimezone(self.zone).date() - timedelta(days=1)
        best: int | None = None
        found_on: date | None = None
        for offset in range(MAX_SEARCH_DAYS):
            day = start + timedelta(days=offset)
            # A fall-back overlap across midnight can interleave two adjacent days: look at
            # the day after the first hit too, then stop.
            if found_on is not None and day > found_on + timedelta(days=1):
                break
            if not self.day_matches(day):
                continue
            instants = self.day_instants(day)
            index = bisect.bisect_right(instants, stamp)
            if index < len(instants) and (best is None or instants[index] < best):
                best = instants[index]
                found_on = found_on or day
        return None if best is None else datetime.fromtimestamp(best, UTC)

    def prev_before(self, t: datetime) -> datetime | None:
        """The last firing strictly before ``t``, in UTC; None if there is none in reach."""
        stamp = t.timestamp()
        start = t.astimezone(self.zone).date() + timedelta(days=1)
        best: int | None = None
        found_on: date | None = None
        for offset in range(MAX_SEARCH_DAYS):
            day = start - timedelta(days=offset)
            if found_on is not None and day < found_on - timedelta(days=1):
                break
            if not self.day_matches(day):
                continue
            instants = self.day_instants(day)
            index = bisect.bisect_left(instants, stamp) - 1
            if index >= 0 and (best is None or instants[index] > best):
                best = instants[index]
                found_on = found_on or day
        return None if best is None else datetime.fromtimestamp(best, UTC)

    def preview(self, after: datetime, count: int) -> list[datetime]:
        """The next ``count`` firings strictly after ``after``."""
        found: list[datetime] = []
        cursor = after
        while len(found) < count:
            following = self.next_after(cursor)
            if following is None:
                break
            found.append(following)
            cursor = following
        return found

    def between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """Firings ``start <= i <= end``, at most ``limit + 1`` of them (so a caller can tell
        "more than the limit" from "exactly the limit")."""
        found: list[datetime] = []
        cursor = start - timedelta(microseconds=1)
        while len(found) <= limit:
            following = self.next_after(cursor)
            if following is None or following > end:
                break
            found.append(following)
            cursor = following
        return found

    def local(self, t: datetime) -> datetime:
        """``t`` on this schedule's wall clock."""
        return t.astimezone(self.zone)


@functools.lru_cache(maxsize=8192)
def _day_instants(schedule: CronSchedule, day: date) -> tuple[int, ...]:
    midnight = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())
    offset = _constant_offset(schedule.zone, day)
    if offset is not None:
        return tuple(midnight + m * 60 - offset for m in schedule.minutes_of_day)
    found: set[int] = set()
    for m in schedule.minutes_of_day:
        wall = datetime(day.year, day.month, day.day, m // 60, m % 60)
        found.update(_wall_instants(schedule.zone, wall, schedule.periodic))
    return tuple(sorted(found))


@functools.lru_cache(maxsize=8192)
def _constant_offset(zone: zoneinfo.ZoneInfo, day: date) -> int | None:
    """The zone's UTC offset in seconds if it is the same for every wall time of ``day``,
    else None. Offsets lie within +-16 h, so checking each hour of the absolute window that
    any wall time of the day can fall in is enough (no zone changes twice within an hour)."""
    first = datetime(day.year, day.month, day.day, tzinfo=UTC) - timedelta(hours=16)
    offsets = {
        _offset_at(zone, first + timedelta(hours=hour)) for hour in range(0, 24 + 2 * 16 + 1)
    }
    return offsets.pop() if len(offsets) == 1 else None


def _offset_at(zone: zoneinfo.ZoneInfo, instant: datetime) -> int:
    delta = instant.astimezone(zone).utcoffset()
    return int(delta.total_seconds()) if delta is not None else 0


def _wall_instants(zone: zoneinfo.ZoneInfo, wall: datetime, periodic: bool) -> tuple[int, ...]:
    """The instants of one wall-clock time under the module's DST rules."""
    first = int(wall.replace(tzinfo=zone, fold=0).timestamp())
    second = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    if first == second:
        return (first,)
    if first < second:  # an overlap: fold=0 is the earlier occurrence (PEP 495)
        return (first, second) if periodic else (first,)
    # A gap: fold=0 used the offset from before the change, fold=1 the one after, so the
    # transition lies in (second, first]. The wall time does not exist.
    if periodic:
        return ()
    return (_transition_between(zone, second, first),)


def _transition_between(zone: zoneinfo.ZoneInfo, low: int, high: int) -> int:
    """The first second in (low, high] at which the zone's offset differs from at ``low``."""
    before = _offset_at(zone, datetime.fromtimestamp(low, UTC))
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(zone, datetime.fromtimestamp(middle, UTC)) == before:
            low = middle
        else:
            high = middle
    return high


@functools.lru_cache(maxsize=1024)
def compile_cron(expression: str, timezone: str = DEFAULT_TIMEZONE) -> CronSchedule:
    """Validate ``expression`` and ``timezone`` and build the schedule; raises
    :class:`CronError` with ``field`` ``"cron"`` or ``"timezone"`` and a message naming the
    offending cron field (``minute field '61': 61 is outside 0-59``)."""
    problem = cron_error(expression)
    if problem:
        raise CronError("cron", problem)
    zone = load_zone(timezone or DEFAULT_TIMEZONE)
    text = expand(expression)
    try:
        fields, _ = croniter.expand(text)
        minutes = _field_values(fields[0], 0, 59) or tuple(range(60))
        hours = _field_values(fields[1], 0, 23) or tuple(range(24))
        days = _field_values(fields[2], 1, 31)
        months = _field_values(fields[3], 1, 12) or tuple(range(1, 13))
        weekdays = _field_values([int(v) % 7 if v != "*" else v for v in fields[4]], 0, 6)
    except (ValueError, TypeError, KeyError) as exc:
        raise CronError("cron", f"invalid cron expression {expression!r}: {exc}") from None
    schedule = CronSchedule(
        expression=expression,
        timezone=timezone or DEFAULT_TIMEZONE,
        zone=zone,
        minutes_of_day=tuple(h * 60 + m for h in hours for m in minutes),
        days=None if days is None else frozenset(days),
        months=frozenset(months),
        weekdays=None if weekdays is None else frozenset(weekdays),
        periodic=text.split(" ")[1].startswith("*"),
    )
    return schedule


def next_fire_time(expression: str, timezone: str, after: datetime) -> datetime | None:
    """The first firing of ``expression`` in ``timezone`` strictly after ``after``."""
    return compile_cron(expression, timezone).next_after(after)


def preview(expression: str, timezone: str, after: datetime, count: int = 5) -> list[datetime]:
    return compile_cron(expression, timezone).preview(after, count)


__all__ = [
    "DEFAULT_TIMEZONE",
    "TZDATA_VERSION",
    "CronError",
    "CronSchedule",
    "Timing",
    "compile_cron",
    "load_zone",
    "next_fire_time",
    "preview",
]
