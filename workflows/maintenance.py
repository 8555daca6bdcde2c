"""The store's periodic duties (``workflows.duties``), run by the worker loop, or by the
Celery beat task (``workflows/tasks.py``) when the maintenance is on beat: the same code
either way.

* The reaper: runs whose worker stopped heartbeating go back to ``ready`` with a bumped
  generation, every half lease.
* The wake sweep: waiting runs whose wake-up was lost with a process that died between the
  satisfying commit and the wake (``workflows/store/wake.py`` says how they are found) are
  woken, every ``CLEAT_WAKE_SWEEP_SECONDS``."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import Counter

from workflows.duties import WorkerContext
from workflows.store.lifecycle import reap_expired_leases, wait_recheck
from workflows.store.wake import SWEEP_OVERLAP, sweep_missed_wakes

log = logging.getLogger("cleat.worker")

REAPED = Counter("cleat_reaped_total", "Expired leases reaped")
SWEPT = Counter(
    "cleat_wake_sweep_woken_total", "Waiting runs the wake sweep woke (their wake-up was lost)"
)

DEFAULT_WAKE_SWEEP_S = 3.0


class Reaper:
    def __init__(self, lease_s: float) -> None:
        self.lease = timedelta(seconds=lease_s)
        self.every_s = lease_s / 2
        self._next = 0.0

    def run_due(self, now: datetime) -> int:
        tick = time.monotonic()
        if tick < self._next:
            return 0
        self._next = tick + self.every_s
        reaped = reap_expired_leases(self.lease, now)
        if reaped:
            REAPED.inc(reaped)
            log.info("event=reaped count=%d", reaped)
        return reaped

    def seconds_until_due(self, now: datetime) -> float:
        return max(0.0, self._next - time.monotonic())


def reaper_duty(context: WorkerContext) -> Reaper:
    return Reaper(context.lease_s)


class WakeSweep:
    """Each pass looks at what arrived since its previous pass (less :data:`SWEEP_OVERLAP`);
    the first pass of a process, and a pass after one that failed, look further back, as far
    as the runs' re-check (``CLEAT_WAIT_RECHECK_SECONDS``): anything older than that has been
    re-checked already. ``now`` is the worker's clock (the database's, when they differ)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._next = 0.0
        self._last: datetime | None = None  # `now` of the last pass that completed

    def run_due(self, now: datetime) -> int:
        tick = time.monotonic()
        if tick < self._next:
            return 0
        self._next = tick + self.every_s
        since = now - wait_recheck() if self._last is None else self._last - SWEEP_OVERLAP
        woken = sweep_missed_wakes(since, now)
        self._last = now
        if woken:
            SWEPT.inc(woken)
            log.info("event=wake_sweep woken=%d", woken)
        return woken

    def seconds_until_due(self, now: datetime) -> float:
        return max(0.0, self._next - time.monotonic())


def wake_sweep_seconds() -> float:
    """``CLEAT_WAKE_SWEEP_SECONDS``: seconds between two passes of the wake sweep (0: off).
    Raises ImproperlyConfigured naming the setting for anything but a number >= 0."""
    value = getattr(settings, "CLEAT_WAKE_SWEEP_SECONDS", DEFAULT_WAKE_SWEEP_S)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if isinstance(value, bool) or not seconds >= 0 or seconds == float("inf"):
        raise ImproperlyConfigured(
            f"CLEAT_WAKE_SWEEP_SECONDS must be a number of seconds (0: off), not {value!r}"
        )
    return seconds


def wake_sweep_duty(context: WorkerContext) -> WakeSweep | None:
    every_s = wake_sweep_seconds()
    return WakeSweep(every_s) if every_s > 0 else None


def maintenance_on_beat() -> bool:
    """The worker loops leave their duties to the Celery beat task."""
    return bool(getattr(settings, "CLEAT_MAINTENANCE_ON_BEAT", False))
