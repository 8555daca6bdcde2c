"""Celery tasks the Celery tests bind a service to (``celery:tests.integration.support.
celery_tasks``): each posts its request to the test's ledger (``CLEAT_TEST_LEDGER_URL``)
with the idempotency key cleat gave it, so the ledger's books show each key's effect once
however often a task ran. They only accept the key; nothing else knows about cleat."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from celery import shared_task

from engine.errors import PermanentError

# Long enough that a killed worker always has tasks in flight.
TASK_SECONDS = float(os.environ.get("CLEAT_TEST_TASK_SECONDS", "0.1"))


def _post(operation: str, request: Any, idempotency_key: str) -> Any:
    time.sleep(TASK_SECONDS)
    req = urllib.request.Request(
        os.environ["CLEAT_TEST_LEDGER_URL"] + operation,
        data=json.dumps(request).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@shared_task(acks_late=True)
def reserve(request: Any, idempotency_key: str = "") -> Any:
    return _post("reserve", request, idempotency_key)


@shared_task(acks_late=True)
def charge(request: Any, idempotency_key: str = "") -> Any:
    return _post("charge", request, idempotency_key)


@shared_task(acks_late=True)
def capture(request: Any, idempotency_key: str = "") -> Any:
    return _post("capture", request, idempotency_key)


@shared_task(acks_late=True)
def ship(request: Any, idempotency_key: str = "") -> Any:
    return _post("ship", request, idempotency_key)


@shared_task(acks_late=True)
def notify(request: Any, idempotency_key: str = "") -> Any:
    return _post("notify", request, idempotency_key)


@shared_task
def decline(request: Any, idempotency_key: str = "") -> Any:
    raise PermanentError(f"card declined for {request}")


@shared_task(bind=True, max_retries=2, default_retry_delay=0)
def flaky(self: Any, request: Any, idempotency_key: str = "") -> Any:
    raise self.retry(exc=RuntimeError("still down"))


@shared_task
def slow(request: Any, idempotency_key: str = "") -> Any:
    time.sleep(float(request.get("seconds", 1)))
    return {"slept": request.get("seconds", 1)}


@shared_task
def broken(request: Any, idempotency_key: str = "") -> Any:
    raise ValueError("the ledger is closed")
