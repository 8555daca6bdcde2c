"""Celery tasks as services: ``CLEAT_SERVICES = {"billing": "celery:billing.tasks"}``.

``durable_call("billing", "charge", req)`` sends the Celery task ``billing.tasks.charge``
once, as ``charge(req, idempotency_key=KEY)`` with the key also in the message's
``idempotency_key`` header, and the run suspends (``engine.session.ops_calls``: no worker
thread waits). Options after ``?``: ``queue=NAME`` (the Celery queue, else the task's
routing), ``timeout=SECONDS`` (no outcome by then: the call returns ``TIMEOUT``; default
``CLEAT_CELERY_TIMEOUT_SECONDS``).

The outcome comes back through :func:`install_outcome_hook`, connected in the Celery worker
(``cleat_project.celery`` does it for this project's app; another Celery app of the same
Django project calls it once, see ``docs/celery.md``): on the task's success or final
failure it writes the outcome to cleat's database (``workflows.store.task_calls``), which
wakes the run. A Celery worker outside the project posts the outcome to the callback
endpoint named in the ``cleat_call`` header instead (``workflows.api.task_calls``).

Status mapping (:func:`failure_status`): a return value is ``OK`` with its JSON; raising
``engine.errors.PermanentError`` (or a class named in ``CLEAT_CELERY_PERMANENT_ERRORS``) is
``PERMANENT``; another exception once Celery's own retries are spent is
``RETRIES_EXHAUSTED`` (the task retried up to its ``max_retries``) or ``ERROR``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Iterable
from functools import cache
from typing import Any

from django.conf import settings

from engine.errors import PermanentError
from engine.services import TaskCall, import_dotted, register_task_scheme
from engine.status import AbiStatus
from workflows.store import task_calls

log = logging.getLogger("cleat.tasks")

HEADER = "cleat_call"
KEY_HEADER = "idempotency_key"
# A database that does not answer at once is asked again before the outcome is given up
# (then the run's timeout decides the call).
REPORT_RETRY_S = (0.0, 0.5, 1.0, 2.0, 4.0)


def celery_app() -> Any:
    """The Celery app cleat publishes with (``CLEAT_CELERY_APP``, a dotted path)."""
    return import_dotted(getattr(settings, "CLEAT_CELERY_APP", "cleat_project.celery.app"))


def confirm_timeout() -> float:
    """How long a publish waits for RabbitMQ's confirm (``CLEAT_CELERY_CONFIRM_TIMEOUT_SECONDS``):
    a broker that blocks publishers (a memory or disk alarm) or a half-open connection then
    fails the publish, which is retried on a new connection and then by the run, instead of
    holding the thread for good."""
    return float(getattr(settings, "CLEAT_CELERY_CONFIRM_TIMEOUT_SECONDS", 10.0))


class CeleryTaskService:
    """The ``celery:`` scheme: operations are tasks of one module (``billing.tasks``)."""

    def __init__(self, target: str, service: str) -> None:
        module, _, query = target.partition("?")
        if not module or module.startswith(".") or module.endswith("."):
            raise ValueError("write celery:package.module (the module of the tasks)")
        options = urllib.parse.parse_qs(query, keep_blank_values=True)
        unknown = set(options) - {"queue", "timeout"}
        if unknown:
            raise ValueError(f"unknown option {sorted(unknown)[0]!r} (queue, timeout)")
        self.module = module
        self.service = service
        self.queue = options.get("queue", [""])[0] or None
        timeout = options.get(
            "timeout", [str(getattr(settings, "CLEAT_CELERY_TIMEOUT_SECONDS", 3600))]
        )[0]
        try:
            seconds = float(timeout)
        except ValueError:
            raise ValueError(f"timeout={timeout!r} is not a number of seconds") from None
        if seconds < 0:
            raise ValueError("timeout must not be negative (0: no timeout)")
        self.timeout_ms = int(seconds * 1000)

    def task_name(self, operation: str) -> str:
        return f"{self.module}.{operation}"

    def send_task_call(self, call: TaskCall) -> None:
        context = call.context
        meta = {
            "tenant": context.tenant_id,
            "run": context.run_id,
            "step": context.step,
            "service": context.service,
            "operation": context.operation,
            "token": call.token,
        }
        callback = getattr(settings, "CLEAT_TASK_CALLBACK_URL", "")
        if callback:
            meta["callback"] = callback_url(callback, context.tenant_id, call.task_id)
        celery_app().send_task(
            self.task_name(context.operation),
            args=[json.loads(call.request) if call.request else None],
            kwargs={"idempotency_key": context.idempotency_key},
            task_id=call.task_id,
            queue=self.queue,
            headers={HEADER: meta, KEY_HEADER: context.idempotency_key},
            # Not the default (minutes of retries): a broker that is away fails the send
            # quickly, and the run sends it again a moment later (TASK_SEND_RETRY_MS).
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2},
            confirm_timeout=confirm_timeout(),
        )

    def revoke_task_call(self, task_id: str) -> None:
        celery_app().control.revoke(task_id)


def callback_url(base: str, tenant: str, task_id: str) -> str:
    return f"{base.rstrip('/')}/api/v1/task-calls/{tenant}/{task_id}/outcome"


def revoke_abandoned(service: str, task_id: str) -> None:
    """``task_calls.abandon_hooks``: revoke the task of a run that ended from outside."""
    from workflows.executor import get_services

    found = getattr(get_services().caller, "task_service", lambda _: None)(service)
    if found is not None and not isinstance(found, str):
        found.revoke_task_call(task_id)


def register() -> None:
    """Make ``celery:`` a service scheme (the workflows app's ``ready``)."""
    register_task_scheme("celery", CeleryTaskService)
    if revoke_abandoned not in task_calls.abandon_hooks:
        task_calls.abandon_hooks.append(revoke_abandoned)


# --- the hook in the Celery worker ---------------------------------------------------------


@cache
def _permanent_classes() -> tuple[type[BaseException], ...]:
    names: Iterable[str] = getattr(settings, "CLEAT_CELERY_PERMANENT_ERRORS", ())
    found: list[type[BaseException]] = [PermanentError]
    for name in names:
        try:
            cls = import_dotted(name)
        except (ImportError, AttributeError):
            log.error("CLEAT_CELERY_PERMANENT_ERRORS: cannot import %r", name)
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def failure_status(task: Any, exc: BaseException) -> AbiStatus:
    """The ABI status of a task's final failure."""
    from celery.exceptions import MaxRetriesExceededError

    if isinstance(exc, _permanent_classes()):
        return AbiStatus.PERMANENT
    if isinstance(exc, MaxRetriesExceededError):
        return AbiStatus.RETRIES_EXHAUSTED
    max_retries = getattr(task, "max_retries", None)
    retries = int(getattr(task.request, "retries", 0) or 0)
    if max_retries and retries >= max_retries:
        return AbiStatus.RETRIES_EXHAUSTED
    return AbiStatus.ERROR


def success_outcome(result: Any) -> tuple[AbiStatus, str]:
    try:
        return AbiStatus.OK, json.dumps(result, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return AbiStatus.PERMANENT, f"the task's result is not JSON: {exc}"


def _meta(task: Any) -> dict[str, Any] | None:
    request = getattr(task, "request", None)
    meta = request.get(HEADER) if request is not None else None
    return meta if isinstance(meta, dict) else None


def _report(task: Any, meta: dict[str, Any], status: AbiStatus, payload: str) -> None:
    task_id = str(task.request.id)
    for pause in REPORT_RETRY_S:
        time.sleep(pause)
        try:
            task_calls.report_outcome(
                meta.get("tenant", ""), task_id, str(meta.get("token", "")), status, payload
            )
            return
        except Exception:
            log.exception("event=task_outcome_error task=%s (trying again)", task_id)
            from django.db import connection

            connection.close()
    log.error("event=task_outcome_lost task=%s (the run's timeout decides the call)", task_id)


def _on_success(sender: Any = None, result: Any = None, **_: Any) -> None:
    meta = _meta(sender)
    if meta is not None:
        _report(sender, meta, *success_outcome(result))


def _on_failure(sender: Any = None, exception: BaseException | None = None, **_: Any) -> None:
    meta = _meta(sender)
    if meta is None or exception is None:
        return
    if isinstance(exception, PermanentError):
        message = str(exception) or type(exception).__name__
    else:
        message = f"{type(exception).__name__}: {exception}"
    _report(sender, meta, failure_status(sender, exception), message)


def install_outcome_hook(app: Any = None) -> None:
    """Record the outcome of the tasks cleat sent, in this Celery worker. Call it once where
    the worker's app is made (``cleat_project/celery.py`` does); Celery's signals are
    process-wide, so it serves every app of the process. For ``kill -9`` safety, run the
    tasks with ``acks_late`` (a task whose worker died is delivered again, runs again with
    the same idempotency key, and its second report is recorded once); with an ``app`` it
    turns that on for the app (``task_acks_late``, ``task_reject_on_worker_lost``)."""
    from celery.signals import task_failure, task_success

    task_success.connect(_on_success, weak=False, dispatch_uid="cleat-task-success")
    task_failure.connect(_on_failure, weak=False, dispatch_uid="cleat-task-failure")
    if app is not None:
        app.conf.task_acks_late = True
        app.conf.task_reject_on_worker_lost = True
