"""Periodic duties: work the worker loop runs besides its own (claims, heartbeats, invocation
delivery): the reaper (``workflows.maintenance``), and what the apps built on workflows add.

When Celery runs the maintenance (``CLEAT_MAINTENANCE_ON_BEAT``), the worker loops run no
duty and the Celery beat task ``cleat.maintenance`` (``workflows/tasks.py``) runs the same
duties, started with ``on_beat=True``.

``workflows`` is the lower layer: it must not know the apps above it (the schedules app
imports workflows, never the reverse). An app that wants its work done from every worker
loop registers a factory here in its ``AppConfig.ready``; each worker asks every factory for
a duty when it starts (None: not in this worker, e.g. a setting turned it off), runs each
duty's :meth:`Duty.run_due` once per pass of the loop, before the claim (so a run a duty
starts is claimed by the same pass), and sleeps no longer than the shortest
:meth:`Duty.seconds_until_due`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


class Duty(Protocol):
    """One worker's instance of a periodic duty."""

    def run_due(self, now: datetime) -> object:
        """Do what is due at ``now`` (or nothing yet). Should not raise: the loop logs and
        goes on if it does."""

    def seconds_until_due(self, now: datetime) -> float:
        """How long the loop may sleep before :meth:`run_due` wants to run again (0: now)."""


@dataclass(frozen=True)
class WorkerContext:
    """What a duty factory is told about the worker starting it."""

    worker_id: str
    tenant: uuid.UUID | None  # the one tenant the worker serves, None for all
    poll_interval_s: float
    lease_s: float = 60.0  # the worker's lease (the reaper returns runs older than that)
    # Started by the Celery beat task (workflows/tasks.py), not by a worker loop: a duty a
    # setting keeps out of the worker loop (CLEAT_SCHEDULER_IN_WORKER) runs there anyway.
    on_beat: bool = False


DutyFactory = Callable[[WorkerContext], Duty | None]

_factories: dict[str, DutyFactory] = {}


def register(name: str, factory: DutyFactory) -> None:
    """Run ``factory``'s duty in every worker started from now on. Registering a name again
    replaces its factory (``ready()`` may run more than once, e.g. in tests)."""
    _factories[name] = factory


def unregister(name: str) -> None:
    _factories.pop(name, None)


def registered() -> tuple[str, ...]:
    return tuple(_factories)


def start(context: WorkerContext) -> list[tuple[str, Duty]]:
    """Each registered duty for one worker, by name, in registration order."""
    started = []
    for name, factory in _factories.items():
        duty = factory(context)
        if duty is not None:
            started.append((name, duty))
    return started
