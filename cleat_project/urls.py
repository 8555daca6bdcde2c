"""URL routes: the operator console (Django admin and its console pages)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/console/", include("workflows.console.urls")),
    path("admin/", admin.site.urls),
    # The REST API (/api/v1/, /api/schema/, /api/docs/), /healthz and /metrics.
    path("", include("workflows.api.urls")),
]

# JSON errors under /api/, Django's pages elsewhere.
handler404 = "workflows.api.errors.handler404"
handler500 = "workflows.api.errors.handler500"
