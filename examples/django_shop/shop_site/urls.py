from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    # cleat's operator console sits beside the admin it extends.
    path("admin/console/", include("workflows.console.urls")),
    path("admin/", admin.site.urls),
    path("", include("shop.urls")),
]
