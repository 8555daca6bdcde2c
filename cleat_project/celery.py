"""Celery application, for deployments that run cleat on an existing fleet (docs/celery.md).

The embedded default needs neither Celery nor a broker; ``CELERY_BROKER_URL`` (Redis or
RabbitMQ) turns this on. Tasks are discovered from the installed apps. A Celery worker of
this app records the outcome of the tasks cleat sent as durable calls (the outcome hook of
``workflows.celery_calls``): ``celery -A cleat_project worker``.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.app.amqp import Queues

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleat_project.settings")

# Broker dispatch's queues (docs/celery.md). Must match workflows.dispatch: this module is
# imported before Django is set up, so it cannot import it.
DISPATCH_QUEUE_PREFIX = "cleat."
DISPATCH_MAX_PRIORITY = 9


class CleatQueues(Queues):  # type: ignore[misc]
    """Celery's routing table, declaring the dispatch queues (``cleat.<task queue>``) with
    broker priorities on RabbitMQ (``x-max-priority``); every other queue as Celery would.
    A queue declared once keeps its arguments: priorities are set on the dispatch queues
    only, so the deployment's existing queues are declared as they always were."""

    def new_missing(self, name: str) -> Any:
        queue = super().new_missing(name)
        if name.startswith(DISPATCH_QUEUE_PREFIX):
            queue.queue_arguments = {
                **(queue.queue_arguments or {}),
                "x-max-priority": DISPATCH_MAX_PRIORITY,
            }
        return queue


app = Celery("cleat")
app.amqp.queues_cls = CleatQueues
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
    from django.core.exceptions import ImproperlyConfigured

    from workflows.celery_calls import install_outcome_hook
    from workflows.dispatch import mode

    try:
        mode()
    except ImproperlyConfigured as exc:  # a clear line and a non-zero exit, no traceback
        raise SystemExit(f"cleat: {exc}") from None
    # A worker thread reuses its connection from task to task, as runworker's threads do.
    from workflows.management.commands._common import use_worker_connection_age

    use_worker_connection_age()
    install_outcome_hook(app)


# After Django is set up (the hook imports the models): Celery's Django fix-up sets it up
# when the worker starts.
from celery.signals import worker_init  # noqa: E402

worker_init.connect(lambda **_: _install_outcome_hook(), weak=False)
