"""Crons created by workflows (the ``schedule_cron`` host call): the store hands the
``CreateSchedule`` / ``DeleteSchedule`` mutations and the ``list_schedules`` read to the
handler an app above registers (the schedules app, in its ``AppConfig.ready``).

The store knows nothing of the schedules' model: ``workflows`` is the lower layer. The
handler is called inside the store's fenced transaction, in the run's tenant context and in
a savepoint, so a refusal (:class:`~engine.errors.Refused`) leaves nothing behind and an
accepted change commits together with the event that records it. With no handler installed
a workflow's crons are refused, and its list of schedules is empty.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Protocol

from engine.errors import Refused
from engine.status import AbiStatus
from engine.storage import CreateSchedule, DeleteSchedule, RunRef


class CronHandler(Protocol):
    def create(self, tenant: uuid.UUID, run: RunRef, request: CreateSchedule, now: datetime) -> str:
        """Create the schedule (idempotent by ``request.schedule_id``); returns its id.
        Raises Refused for anything the workflow is to be told."""

    def delete(self, tenant: uuid.UUID, request: DeleteSchedule) -> None:
        """Delete the tenant's schedule; Refused(NOT_FOUND) when there is none."""

    def list(self, tenant: uuid.UUID) -> list[dict[str, Any]]:
        """The tenant's schedules, as ``list_schedules`` answers them."""


_handler: CronHandler | None = None


def register(handler: CronHandler) -> None:
    global _handler
    _handler = handler


def handler() -> CronHandler | None:
    return _handler


def _required() -> CronHandler:
    if _handler is None:
        raise Refused(AbiStatus.PERMANENT, "cron schedules are not available on this server")
    return _handler


def create(tenant: uuid.UUID, run: RunRef, request: CreateSchedule, now: datetime) -> str:
    return _required().create(tenant, run, request, now)


def delete(tenant: uuid.UUID, request: DeleteSchedule) -> None:
    _required().delete(tenant, request)


def list_schedules(tenant: uuid.UUID) -> list[dict[str, Any]]:
    return _handler.list(tenant) if _handler is not None else []
