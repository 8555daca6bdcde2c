"""Routes of the REST API: the workflows' resources (``router``, mounted under ``/api/v1/``
by ``cleat_project/urls.py`` together with the routers of the apps built on workflows), the
schema and docs, and the operations endpoints. No trailing slashes:
``POST /api/v1/workflows/<run>/signal``."""

from __future__ import annotations

from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import SimpleRouter

from workflows.api.errors import not_found_view
from workflows.api.health import HealthView, MetricsView
from workflows.api.task_calls import TaskOutcomeView
from workflows.api.views import (
    NAME_REGEX,
    DefinitionVersionViewSet,
    DefinitionViewSet,
    PromiseViewSet,
    RetentionViewSet,
    WorkerViewSet,
    WorkflowViewSet,
)

router = SimpleRouter(trailing_slash=False)
router.register("definitions", DefinitionViewSet, basename="definition")
router.register(
    rf"definitions/(?P<name>{NAME_REGEX})/versions",
    DefinitionVersionViewSet,
    basename="definition-version",
)
router.register("workflows", WorkflowViewSet, basename="workflow")
router.register("promises", PromiseViewSet, basename="promise")
router.register("workers", WorkerViewSet, basename="worker")
# One resource per tenant, not a collection: GET and PUT /api/v1/retention.
retention_urls = [
    path(
        "retention",
        RetentionViewSet.as_view({"get": "retrieve", "put": "update"}, basename="retention"),
        name="retention",
    )
]

# Included after every app's /api/v1/ routes (cleat_project/urls.py): the catch-all below
# must come last.
urlpatterns = [
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    # Authenticated by the call's token, not an API key (workflows/api/task_calls.py).
    path(
        "api/v1/task-calls/<uuid:tenant>/<uuid:task_id>/outcome",
        TaskOutcomeView.as_view(),
        name="task-call-outcome",
    ),
    # Anything else under /api/ is a JSON 404, whatever DEBUG says.
    re_path(r"^api/", not_found_view),
    path("healthz", HealthView.as_view(), name="healthz"),
    path("metrics", MetricsView.as_view(), name="metrics"),
]
