"""Versions looked after periodically: a worker duty (workflows/duties.py; on Celery beat with
the other duties when ``CLEAT_MAINTENANCE_ON_BEAT`` is on) that, every
``CLEAT_VERSION_CHECK_INTERVAL_SECONDS`` (a day; 0: never), runs the stale-version check of
each active tenant (``definitions.check_stale_versions``, the same as
``GET /api/v1/definitions/stale``): each alert is logged (``event=stale_version``) and counted
in the gauge ``cleat_stale_versions{kind}``. With ``CLEAT_VERSION_GC`` on (off by default:
deleting versions is an operator's decision unless they make it the policy) it then runs the
version garbage collection (``definitions.garbage_collect_versions``, not a dry run, with its
defaults: deprecated, older than the maximum age, no active run, not among the newest kept,
not pinned by a tag or a routing rule).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import close_old_connections
from prometheus_client import Gauge

from workflows.duties import WorkerContext
from workflows.models import Tenant

log = logging.getLogger("cleat.worker")

STALE_VERSIONS = Gauge(
    "cleat_stale_versions",
    "Versions the last stale-version check flagged: 'migrate' (old, active runs, a newer "
    "version exists) or 'purge' (deprecated, old, no active run)",
    ["kind"],
)
FIRST_CHECK_DELAY_S = 120.0


class VersionDuty:
    def __init__(
        self, tenant: uuid.UUID | None, interval_s: float, gc: bool, now: datetime
    ) -> None:
        self.tenant = tenant
        self.interval = timedelta(seconds=interval_s)
        self.gc = gc
        self.next_at = now + min(self.interval, timedelta(seconds=FIRST_CHECK_DELAY_S))
        self.last_alerts: list[str] = []
        self.last_removed: list[str] = []

    def seconds_until_due(self, now: datetime) -> float:
        return max(0.0, (self.next_at - now).total_seconds())

    def run_due(self, now: datetime) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.interval
        try:
            self.check(now)
        except Exception:
            log.exception("event=version_check_error")
        finally:
            close_old_connections()
        return True

    def check(self, now: datetime) -> None:
        from workflows import definitions

        tenants = Tenant.objects.filter(is_active=True)
        if self.tenant is not None:
            tenants = tenants.filter(id=self.tenant)
        counts = {"migrate": 0, "purge": 0}
        alerts: list[str] = []
        removed: list[str] = []
        for tenant in tenants.order_by("name"):
            for alert in definitions.check_stale_versions(tenant, now=now):
                counts["purge" if alert.deprecated else "migrate"] += 1
                alerts.append(f"{tenant.name}: {alert.message}")
                log.warning(
                    "event=stale_version tenant=%s definition=%s version=%d %s",
                    tenant.id,
                    alert.name,
                    alert.version,
                    alert.message,
                )
            if self.gc:
                result = definitions.garbage_collect_versions(
                    tenant, now=now, dry_run=False, operator="version-gc"
                )
                for ref in result.removed:
                    removed.append(f"{tenant.name}: {ref.name} v{ref.version}")
                    log.info(
                        "event=version_gc tenant=%s definition=%s version=%d",
                        tenant.id,
                        ref.name,
                        ref.version,
                    )
        for kind, n in counts.items():
            STALE_VERSIONS.labels(kind).set(n)
        self.last_alerts, self.last_removed = alerts, removed


def worker_duty(worker: WorkerContext) -> VersionDuty | None:
    interval = float(getattr(settings, "CLEAT_VERSION_CHECK_INTERVAL_SECONDS", 86400.0))
    if interval <= 0:
        return None
    gc = bool(getattr(settings, "CLEAT_VERSION_GC", False))
    from django.utils import timezone

    return VersionDuty(worker.tenant, interval, gc, timezone.now())
