"""``/healthz`` (the database answers and every migration is applied) and ``/metrics``
(Prometheus text format). Neither needs a key: load balancers and Prometheus call them.

``/metrics`` serves this process's counters and, computed from the database at scrape time,
the fleet's gauges (:class:`FleetCollector`): the due backlog per task queue and definition
(every tenant's, summed: counts and ages, never a run or a tenant) and the registered
workers. Those are a couple of aggregate queries on indexed columns per scrape.

In a deployment with several web processes (gunicorn workers), each process serves its own
counters; use prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) to
aggregate them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.api.serializers import HealthSerializer
from workflows.models import WorkerProcess
from workflows.store.backlog import fleet_backlog
from workflows.store.workers import fleet_now

log = logging.getLogger("cleat.api")

# A positive migration check is remembered this long: computing the plan reads every
# migration file, which a load balancer polling every second should not cause each time.
MIGRATIONS_CACHE_SECONDS = 30.0
_migrations_ok_until = 0.0


def _pending_migrations() -> int:
    global _migrations_ok_until
    if time.monotonic() < _migrations_ok_until:
        return 0
    executor = MigrationExecutor(connection)
    pending = len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    if pending == 0:
        _migrations_ok_until = time.monotonic() + MIGRATIONS_CACHE_SECONDS
    return pending


class FirstRenderer(BaseContentNegotiation):
    """Probes and scrapers get the one format these endpoints have, whatever they accept."""

    def select_parser(self, request: Request, parsers: Any) -> Any:
        return parsers[0] if parsers else None

    def select_renderer(self, request: Request, renderers: Any, format_suffix: Any = None) -> Any:
        return renderers[0], renderers[0].media_type


class HealthView(APIView):
    content_negotiation_class = FirstRenderer
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []
    renderer_classes = [JSONRenderer]

    @extend_schema(
        tags=["operations"],
        summary="Health: the database answers and migrations are applied",
        responses={200: HealthSerializer, 503: HealthSerializer},
        auth=[],
    )
    def get(self, request: Request) -> Response:
        body = {"status": "ok", "database": "ok", "migrations": "ok"}
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchone()
        except DatabaseError as exc:
            log.warning("event=healthz database=unreachable error=%s", exc)
            body.update(status="unavailable", database="unreachable", migrations="unknown")
            return Response(body, status=503)
        try:
            pending = _pending_migrations()
        except DatabaseError as exc:
            log.warning("event=healthz migrations=unknown error=%s", exc)
            pending = -1
        if pending:
            body["status"] = "unavailable"
            body["migrations"] = f"{pending} pending" if pending > 0 else "unknown"
            return Response(body, status=503)
        return Response(body)


class FleetCollector(Collector):
    """The fleet's gauges, read from the database on each scrape."""

    def describe(self) -> list[GaugeMetricFamily]:
        return list(self._families())

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        labels = ["task_queue", "definition"]
        return (
            GaugeMetricFamily(
                "cleat_ready_runs",
                "Runs due and waiting for a worker, per task queue and definition",
                labels=labels,
            ),
            GaugeMetricFamily(
                "cleat_oldest_ready_seconds",
                "How long the oldest due run has waited for a worker",
                labels=labels,
            ),
            GaugeMetricFamily(
                "cleat_workers", "Registered workers, live or stale", labels=["state"]
            ),
            GaugeMetricFamily("cleat_workers_runs_held", "Segments the live workers were running"),
            GaugeMetricFamily(
                "cleat_workers_steps_per_second", "Durable steps per second of the live workers"
            ),
            GaugeMetricFamily(
                "cleat_fleet_metrics_up", "1 when the fleet gauges were read from the database"
            ),
        )

    def collect(self) -> list[GaugeMetricFamily]:
        ready, oldest, workers, held, steps, up = self._families()
        try:
            now = fleet_now()
            backlog = fleet_backlog(now)
            if getattr(settings, "CLEAT_METRICS_BACKLOG_LABELS", False):
                for item in backlog:
                    ready.add_metric([item.task_queue, item.definition], item.depth)
                    oldest.add_metric([item.task_queue, item.definition], item.oldest_age_s(now))
            else:
                # By default one series for the whole fleet: the names are the tenants' own
                # (free text), and /metrics needs no key.
                ready.add_metric(["", ""], sum(item.depth for item in backlog))
                ages = [item.oldest_age_s(now) for item in backlog]
                oldest.add_metric(["", ""], max(ages, default=0.0))
            counts = {"live": 0, "stale": 0}
            held_total, steps_total = 0, 0.0
            for worker in WorkerProcess.objects.all():
                if worker.is_stale(now):
                    counts["stale"] += 1
                else:
                    counts["live"] += 1
                    held_total += worker.runs_held
                    steps_total += worker.steps_per_s
        except DatabaseError as exc:
            log.warning("event=metrics fleet=unreadable error=%s", exc)
            up.add_metric([], 0)
            return [up]
        for state, n in counts.items():
            workers.add_metric([state], n)
        held.add_metric([], held_total)
        steps.add_metric([], steps_total)
        up.add_metric([], 1)
        return [ready, oldest, workers, held, steps, up]


# Apart from the process-wide REGISTRY: the worker's own /metrics (runworker --metrics-port)
# serves that one and must not query the fleet on every scrape.
FLEET_REGISTRY = CollectorRegistry()
FLEET_REGISTRY.register(FleetCollector())


class PrometheusRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> bytes:
        return data if isinstance(data, bytes) else str(data).encode()


class MetricsView(APIView):
    content_negotiation_class = FirstRenderer
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []
    renderer_classes = [PrometheusRenderer]

    @extend_schema(
        tags=["operations"],
        summary="Prometheus metrics",
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="Prometheus text exposition format."
            ),
        },
        auth=[],
    )
    def get(self, request: Request) -> Response:
        response = Response(generate_latest(REGISTRY) + generate_latest(FLEET_REGISTRY))
        response["Content-Type"] = CONTENT_TYPE_LATEST
        return response
