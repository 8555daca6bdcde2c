"""The console's own pages, mounted under ``/admin/console/`` (admin login required)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from workflows.console import views

app_name = "console"

urlpatterns = [
    path("dashboard/", admin.site.admin_view(views.dashboard), name="dashboard"),
    path("dead-letters/", admin.site.admin_view(views.dead_letters), name="dead_letters"),
    path("workers/", admin.site.admin_view(views.workers), name="workers"),
    path("tenant/", admin.site.admin_view(views.switch_tenant), name="switch_tenant"),
]
