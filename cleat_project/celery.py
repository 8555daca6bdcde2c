"""Celery application, for deployments that run cleat on an existing fleet (docs/celery.md).

The embedded default needs neither Celery nor a broker; ``CELERY_BROKER_URL`` (Redis or
RabbitMQ) turns this on. Tasks are discovered from the installed apps. A Celery worker of
this app records the outcome of the tasks cleat sent as durable calls (the outcome hook of
``workflows.celery_calls``): ``celery -A cleat_project worker``.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")

app = Celery("cleat")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _maintenance_on_beat(sender: Celery, **_: object) -> None:
    """CLEAT_MAINTENANCE_ON_BEAT: beat sends cleat's periodic duties (workflows/tasks.py)."""
    from django.conf import settings

    if getattr(settings, "CLEAT_MAINTENANCE_ON_BEAT", False):
        from workflows.tasks import beat_schedule

        sender.conf.beat_schedule = {**(sender.conf.beat_schedule or {}), **beat_schedule()}


def _install_outcome_hook() -> None:
    import django

    django.setup()
    from workflows.celery_calls import install_outcome_hook

    install_outcome_hook(app)


# After Django is set up (the hook imports the models): Celery's Django fix-up sets it up
# when the worker starts.
from celery.signals import worker_init  # noqa: E402

worker_init.connect(lambda **_: _install_outcome_hook(), weak=False)
