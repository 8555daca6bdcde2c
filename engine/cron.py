"""Cron expressions and time zones: validation shared by the scheduler and the host.

The cron math itself lives in ``schedules/``; the engine only needs to refuse what the
scheduler could not interpret, with a message that names the offending field.
"""

from __future__ import annotations

import zoneinfo

from croniter import CroniterBadCronError, CroniterBadDateError, croniter

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_NAMES = {
    3: {"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"},
    4: {"sun", "mon", "tue", "wed", "thu", "fri", "sat"},
}


def expand(expr: str) -> str:
    text = " ".join(expr.split())
    return MACROS.get(text.lower(), text)


def _check_field(index: int, text: str) -> str | None:
    low, high = _RANGES[index]
    for part in text.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            return f"step {step!r} must be a positive integer"
        if base == "*":
            continue
        for bound in base.split("-"):
            if bound.lower() in _NAMES.get(index, set()):
                continue
            if not bound.isdigit():
                return f"{bound!r} is not a number"
            if not low <= int(bound) <= high:
                return f"{bound} is outside {low}-{high}"
    return None


def cron_error(expr: str) -> str | None:
    """None when ``expr`` is a five-field cron expression (or macro) that can fire, else
    a message naming the offending field."""
    text = expand(expr)
    fields = text.split(" ")
    if not text:
        return "the cron expression is empty"
    if text.startswith("@"):
        return f"unknown macro {text!r} (known: {', '.join(sorted(MACROS))})"
    if len(fields) != 5:
        return f"a cron expression has 5 fields (minute hour day month weekday), not {len(fields)}"
    for index, field in enumerate(fields):
        problem = _check_field(index, field)
        if problem:
            return f"{FIELDS[index]} field {field!r}: {problem}"
    try:
        itr = croniter(text, 0)
        # An expression that parses but can never match (0 0 30 2 *) fails to find a
        # next instant within croniter's search window.
        itr.get_next(float)
    except CroniterBadDateError:
        return f"{expr!r} never fires (no date matches it)"
    except (CroniterBadCronError, ValueError, KeyError) as exc:
        return f"invalid cron expression {expr!r}: {exc}"
    return None


def timezone_error(name: str) -> str | None:
    """None when ``name`` is an IANA zone in the tzdata this process ships."""
    if not name:
        return "the time zone is empty"
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):  # "Europe" is a directory
        return f"unknown time zone {name!r} (use an IANA name such as Europe/London)"
    return None
