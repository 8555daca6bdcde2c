"""URL routes: the operator console (Django admin and its console pages), and the REST API
composed from each app's router (workflows, then schedules, which builds on it)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from schedules.api.urls import router as schedules_api
from workflows.api.urls import retention_urls
from workflows.api.urls import router as workflows_api

urlpatterns = [
    path("admin/console/", include("workflows.console.urls")),
    path("admin/", admin.site.urls),
    # The REST API's resources.
    path("api/v1/", include([*workflows_api.urls, *retention_urls, *schedules_api.urls])),
    # Its schema (/api/schema/) and docs (/api/docs/), the JSON 404 for anything else under
    # /api/, /healthz and /metrics.
    path("", include("workflows.api.urls")),
]

# JSON errors under /api/, Django's pages elsewhere.
handler404 = "workflows.api.errors.handler404"
handler500 = "workflows.api.errors.handler500"
