from __future__ import annotations

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    verbose_name = "Schedules"
    default_auto_field = "django.db.models.BigAutoField"
