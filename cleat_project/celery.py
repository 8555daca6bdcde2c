"""Celery application, for deployments that run cleat's maintenance on an existing fleet.

The embedded default needs neither Celery nor a broker; ``CELERY_BROKER_URL`` (Redis or
RabbitMQ) turns this on. Tasks are discovered from the installed apps.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")

app = Celery("cleat")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
