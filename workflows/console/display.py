"""Short texts the console shows about runs: what a run waits on, how old it is."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from engine.storable import parse_readable, readable

STATUS_COLOURS = {
    "ready": "#2563eb",
    "running": "#0891b2",
    "paused": "#a16207",
    "done": "#15803d",
    "failed": "#dc2626",
    "dead_lettered": "#9f1239",
    "terminated": "#4b5563",
}
# A ready run that is not due (it waits for a timer, a signal, a child...) reads as waiting.
WAITING = "waiting"
WAITING_COLOUR = "#6366f1"


def status_label(status: str) -> str:
    """A status as a person reads it, one spelling on every page: ``dead-lettered``."""
    return str(status).replace("_", "-")


def shown_status(status: str, waiting_on: Any, next_wake_at: datetime | None) -> str:
    """The status a page shows for a run: ``waiting`` for a ready run that waits on
    something and is not due yet (a run waiting a day for a signal is not "ready" to an
    operator), else its stored status."""
    if status != "ready" or not isinstance(waiting_on, dict) or not waiting_on.get("kind"):
        return str(status)
    if next_wake_at is not None and next_wake_at <= timezone.now():
        return str(status)
    return WAITING


def instance_status(instance: Any) -> str:
    return shown_status(
        instance.status,
        getattr(instance, "waiting_on", None),
        getattr(instance, "next_wake_at", None),
    )


def size_text(size: int | None) -> str:
    """A byte count for people: ``812 B``, ``4.2 KiB``, ``19.7 MiB``."""
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def clock_text(moment: datetime, now: datetime) -> str:
    """``14:05`` today, ``Mar 3 14:05`` on another day (in the current time zone)."""
    local = timezone.localtime(moment)
    if local.date() == timezone.localtime(now).date():
        return local.strftime("%H:%M:%S") if local.second else local.strftime("%H:%M")
    return local.strftime("%b %d %H:%M").replace(" 0", " ")


def _moment(ms: Any) -> datetime | None:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    return datetime.fromtimestamp(ms / 1000, UTC)


def wait_text(waiting_on: Any, now: datetime | None = None) -> str:
    """What a run waits on, short: ``timer until 14:05``, ``signals approve/reject``,
    ``child 3f2a…``. Falls back to the engine's own description for anything else."""
    if not isinstance(waiting_on, dict):
        return ""
    now = now or timezone.now()
    kind = waiting_on.get("kind")
    wake = _moment(waiting_on.get("wake_at_ms"))
    run_ids = [str(r) for r in waiting_on.get("run_ids") or []]
    timeout = f" (timeout {clock_text(wake, now)})" if wake else ""
    if kind == "timer" and wake:
        return f"timer until {clock_text(wake, now)}"
    if kind == "retry_backoff" and wake:
        return f"retry backoff until {clock_text(wake, now)}"
    if kind == "signals":
        names = "/".join(str(n) for n in waiting_on.get("signals") or []) or "any"
        return f"signals {names}{timeout}"
    if kind == "child" and run_ids:
        return f"child {run_ids[0][:4]}…"
    if kind in ("children", "any_child"):
        return f"{'all' if kind == 'children' else 'any'} of {len(run_ids)} children"
    if kind == "promise":
        return f"promise {str(waiting_on.get('promise_id', ''))[:8]}…{timeout}"
    return str(waiting_on.get("description", ""))


def age_text(since: datetime | None, now: datetime | None = None) -> str:
    """``42 s``, ``5 min``, ``3 h``, ``2 d``."""
    if since is None:
        return ""
    seconds = max(0.0, ((now or timezone.now()) - since).total_seconds())
    return duration_text(seconds)


def duration_text(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def pretty_json(text: str | None) -> str:
    """Indented JSON for display; the text itself when it does not parse."""
    if text is None:
        return ""
    try:
        return json.dumps(parse_readable(text), indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return readable(text)


def timedelta_s(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def detail_text(detail: Any) -> str:
    """An audit row's detail for people: ``name: shop-order · version: 2`` (values that are
    not text written as JSON), not a Python ``dict``'s repr."""
    if not isinstance(detail, dict):
        return "" if detail in (None, "") else json.dumps(detail, ensure_ascii=False)
    parts = []
    for key, value in detail.items():
        if value is None or value == "":
            continue
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{key.replace('_', ' ')}: {shown}")
    return " · ".join(parts)
