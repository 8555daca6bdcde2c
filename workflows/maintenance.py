"""The reaper as a periodic duty (``workflows.duties``): runs whose worker stopped
heartbeating go back to ``ready`` with a bumped generation, every half lease. The worker
loop runs it, or the Celery beat task (``workflows/tasks.py``) when the maintenance is on
beat: the same code either way."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from prometheus_client import Counter

from workflows.duties import WorkerContext
from workflows.store.lifecycle import reap_expired_leases

log = logging.getLogger("cleat.worker")

REAPED = Counter("cleat_reaped_total", "Expired leases reaped")


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


def maintenance_on_beat() -> bool:
    """The worker loops leave their duties to the Celery beat task."""
    return bool(getattr(settings, "CLEAT_MAINTENANCE_ON_BEAT", False))
