from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The REST API. An app of its own so that its admin (API keys) and its migration (the
    key-lookup definer function on PostgreSQL) are found by Django; it has no models."""

    name = "workflows.api"
    label = "cleat_api"
    verbose_name = "REST API"
