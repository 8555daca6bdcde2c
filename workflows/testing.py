"""Run workflows through the real Django store and executor, in-process, with virtual time.

The database twin of ``engine.testing.WorkflowEnvironment`` (same method names), so a
scenario written for one runs on the other: the engine's scenarios end to end through the
store, the claim, the fenced finalize and the wake-ups, on SQLite, PostgreSQL or MariaDB.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django import db
from django.utils import timezone

from engine.events import EncodedEvent, Event, decode
from engine.lifecycle import RetryPolicy
from engine.services import Services
from engine.testing import RecordingCaller
from workflows import services as svc
from workflows import tracing
from workflows.definitions import (
    deploy_definition,
    deprecate_definition,
    restore_definition,
    set_tag,
)
from workflows.executor import execute_claim, set_services
from workflows.models import (
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowEvent,
    WorkflowInstance,
    continue_chain,
    instance_summary,
)
from workflows.store import task_calls
from workflows.store.lifecycle import claim_ready_instances
from workflows.tenancy import tenant_context


class VirtualClock:
    """Real time plus an offset the test advances: never behind the database's own
    ``now()`` (rows the services create are due at real time), ahead of it on demand.

    ``controlled``: time moves only when the test says so, as in ``engine.testing``. It
    starts a day ahead of the wall clock, so it is still never behind the rows the services
    write with the database's ``now()`` (a signal delivered is due at once) while the test
    lasts, and a backoff or a timer falls due exactly when the test has advanced past it,
    not a little earlier because the test itself took time. Whatever reads the wall clock
    instead (a worker started by the test, a claim at ``timezone.now()``) is then a day
    behind the runs."""

    LEAD = timedelta(days=1)

    def __init__(self, controlled: bool = False) -> None:
        self.controlled = controlled
        self.start = timezone.now() + self.LEAD if controlled else None
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return (self.start or timezone.now()) + self.offset

    def advance(self, delta: timedelta) -> None:
        self.offset += delta


class DatabaseWorkflowEnvironment:
    def __init__(
        self,
        tenant: Tenant,
        services: Mapping[str, Any] | None = None,
        *,
        worker_id: str = "test-db-worker",
        plugins: Mapping[str, Any] | None = None,
        controlled_clock: bool = False,
        plugin_guard: Mapping[str, Any] | None = None,
    ) -> None:
        self.tenant = tenant
        self.clock = VirtualClock(controlled_clock)
        self.services = Services.from_settings(
            services, plugins=plugins, plugin_guard=plugin_guard, tracer=tracing.tracer()
        )
        self.services.after_batch_call = db.connections.close_all
        self.caller = RecordingCaller(self.services.caller)
        self.services.caller = self.caller
        set_services(self.services)
        self.worker_id = worker_id
        self.segments = 0

    def close(self) -> None:
        set_services(None)

    # --- definitions and runs ----------------------------------------------------------------

    def deploy(
        self,
        name: str,
        wasm: bytes,
        version: int | None = None,
        *,
        min_version: int = 0,
        max_history_length: int = 0,
        retry: RetryPolicy | None = None,
        child_binding: str = "",
        child_versions: Mapping[str, int] | None = None,
        allowed_signal_callers: Sequence[str] = (),
        plugin_dependencies: Mapping[str, str] | None = None,
    ) -> int:
        """As :meth:`engine.testing.WorkflowEnvironment.deploy`: the declared minimum
        version, the history cap, the retry policy and the child binding are the
        definition's."""
        definition = deploy_definition(
            self.tenant,
            name,
            wasm,
            version=version,
            min_version=min_version,
            max_history_length=max_history_length,
            child_binding=child_binding,
            child_versions=dict(child_versions or {}),
            allowed_signal_callers=list(allowed_signal_callers),
            plugin_dependencies=dict(plugin_dependencies or {}),
        )
        if retry is not None:
            with tenant_context(self.tenant.id):
                WorkflowDefinition.objects.filter(id=definition.id).update(
                    retry_max_attempts=retry.max_attempts,
                    retry_initial_interval_s=retry.initial_interval_s,
                    retry_backoff_coefficient=retry.backoff_coefficient,
                    retry_max_interval_s=retry.max_interval_s,
                )
        return definition.version

    def deprecate(self, name: str, version: int, deprecated: bool = True) -> None:
        if deprecated:
            deprecate_definition(self.tenant, name, version, "test")
        else:
            restore_definition(self.tenant, name, version, "test")

    def set_tag(self, name: str, tag: str, version: int) -> None:
        set_tag(self.tenant, name, tag, version, "test")

    def start(self, name: str, input: Any = None, *, version: int | None = None, **kw: Any) -> str:
        text = input if isinstance(input, str) else json.dumps(input)
        instance, _ = svc.start_workflow(self.tenant, name, text, version=version, **kw)
        if self.clock.controlled:
            # Started at the virtual time: the run's own clock begins at its creation.
            with tenant_context(self.tenant.id):
                WorkflowInstance.objects.filter(id=instance.id).update(
                    created_at=self.clock.now(), next_wake_at=self.clock.now()
                )
        return str(instance.id)

    def run(self, name: str, input: Any = None, **kw: Any) -> str:
        run_id = self.start(name, input, **kw)
        self.run_until_idle()
        return run_id

    def step(self) -> bool:
        # As the worker claims: with the run's load in the claim's message where the
        # database offers it.
        claims = claim_ready_instances(
            self.worker_id, ["default"], 1, self.clock.now(), self.tenant.id, load=True
        )
        if not claims:
            return False
        execute_claim(claims[0], self.worker_id, self.clock.now)
        self.segments += 1
        return True

    def run_until_idle(self, max_segments: int = 2_000) -> int:
        count = 0
        while self.step():
            count += 1
            if count >= max_segments:
                raise AssertionError(f"still busy after {max_segments} segments")
        return count

    def advance(self, seconds: float = 0, *, ms: int = 0) -> int:
        self.clock.advance(timedelta(seconds=seconds, milliseconds=ms))
        return self.run_until_idle()

    # --- talking to runs ----------------------------------------------------------------------

    def signal(
        self, run_id: str, name: str, payload: Any = None, *, permitted: bool = True
    ) -> None:
        """A signal from outside, by a caller with (``permitted``) or without the permission
        signal authorization asks for."""
        try:
            svc.signal_workflow(
                self.tenant, run_id, name, payload, permitted=permitted, caller="test"
            )
        except svc.Forbidden as exc:
            svc.keep_refusal_audit(self.tenant, exc)
            raise

    def cancel(self, run_id: str, reason: str = "cancelled by test") -> None:
        svc.cancel_workflow(self.tenant, run_id, reason)

    def terminate(self, run_id: str, reason: str = "terminated by test") -> None:
        svc.terminate_workflow(self.tenant, run_id, reason, operator="test")

    def force_complete(self, run_id: str, result: Any = None) -> None:
        svc.force_complete(self.tenant, run_id, None, result, operator="test")

    def force_fail(self, run_id: str, message: str, code: str = "error") -> None:
        svc.force_fail(self.tenant, run_id, None, message, code, operator="test")

    def report_task_outcome(self, task_id: str, token: str, status: int, payload: str = "") -> str:
        """What the hook in a Celery worker does with a task's outcome; returns what became
        of it (``engine.task_calls.Disposition``)."""
        return task_calls.report_outcome(
            self.tenant.id, task_id, token, status, payload, now=self.clock.now()
        ).value

    def move_to_version(self, run_id: str, version: int) -> None:
        svc.move_to_version(self.tenant, run_id, version, "test")

    def resolve_promise(self, promise_id: str, value: Any) -> None:
        svc.settle_promise(self.tenant, promise_id, value=value)

    def reject_promise(self, promise_id: str, message: str) -> None:
        svc.settle_promise(self.tenant, promise_id, error=message, reject=True)

    def update(self, run_id: str, name: str, payload: Any = None) -> str:
        return str(svc.send_update(self.tenant, run_id, name, payload).id)

    def update_result(self, update_id: str) -> tuple[str, str]:
        with tenant_context(self.tenant.id):
            update = UpdateRequest.objects.get(id=update_id)
        return update.status, update.result

    # --- inspecting -----------------------------------------------------------------------------

    def _instance(self, run_id: str) -> WorkflowInstance:
        with tenant_context(self.tenant.id):
            return WorkflowInstance.objects.get(id=run_id, tenant_id=self.tenant.id)

    def describe(self, run_id: str) -> dict[str, Any]:
        with tenant_context(self.tenant.id):
            return instance_summary(self._instance(run_id))

    def status(self, run_id: str) -> str:
        return self._instance(run_id).status

    def latest_run(self, run_id: str) -> str:
        """The last run of ``run_id``'s continue-as-new chain (``run_id`` itself if none)."""
        with tenant_context(self.tenant.id):
            chain = continue_chain(self._instance(run_id), limit=10_000)
        return str(chain[-1].id) if chain else run_id

    def result(self, run_id: str) -> Any:
        info = self.describe(self.latest_run(run_id))
        if info["status"] != "done":
            raise AssertionError(
                f"run {info['id']} is {info['status']}: {info['error_code']} {info['error']}"
            )
        return json.loads(info["result"]) if info["result"] else None

    def stored_history(self, run_id: str) -> list[EncodedEvent]:
        with tenant_context(self.tenant.id):
            return WorkflowEvent.history(self.tenant.id, run_id)

    def history(self, run_id: str) -> list[Event]:
        return [decode(e) for e in self.stored_history(run_id)]
