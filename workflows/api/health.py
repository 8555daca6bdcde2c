"""``/healthz`` (the database answers and every migration is applied) and ``/metrics``
(Prometheus text format). Neither needs a key: load balancers and Prometheus call them.
Neither reads a tenant's rows; ``/metrics`` exposes process-wide counters only.

In a deployment with several web processes (gunicorn workers), each process serves its own
counters; use prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``) to
aggregate them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from workflows.api.serializers import HealthSerializer

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
        response = Response(generate_latest(REGISTRY))
        response["Content-Type"] = CONTENT_TYPE_LATEST
        return response
