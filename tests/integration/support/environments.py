"""The two environments a lifecycle scenario runs against, behind one interface.

:class:`MemoryEnvironment` is ``engine.testing.WorkflowEnvironment`` (in-memory storage,
virtual time) and :class:`DatabaseEnvironment` is ``workflows.testing``'s twin (the Django
store, the claim, the executor's segment and fenced finalize, a virtual clock ahead of the
database's). Both already share the methods a scenario drives (deploy, start, run_until_idle,
advance, signal, cancel, terminate, force_complete, force_fail, update, update_result,
resolve_promise, reject_promise, describe, status, result, history); the subclasses add the
few looks a scenario needs at what each store holds (locks, state, children) and the
careless redeploy the non-determinism scenario makes. The database one runs on a
controlled clock, so that time moves only when a scenario advances it, as in memory.
"""

from __future__ import annotations

from typing import Any, Protocol

from engine.events import Event
from engine.lifecycle import RetryPolicy
from engine.testing import WorkflowEnvironment


class ScenarioEnvironment(Protocol):
    kind: str

    def deploy(
        self,
        name: str,
        wasm: bytes,
        version: int | None = None,
        *,
        min_version: int = 0,
        max_history_length: int = 0,
        retry: RetryPolicy | None = None,
    ) -> int: ...

    def start(self, name: str, input: Any = None, *, version: int | None = None) -> str: ...
    def run(self, name: str, input: Any = None, **kw: Any) -> str: ...
    def run_until_idle(self, max_segments: int = ...) -> int: ...
    def advance(self, seconds: float = 0, *, ms: int = 0) -> int: ...
    def signal(self, run_id: str, name: str, payload: Any = None) -> None: ...
    def cancel(self, run_id: str, reason: str = ...) -> None: ...
    def terminate(self, run_id: str, reason: str = ...) -> None: ...
    def force_complete(self, run_id: str, result: Any = None) -> None: ...
    def force_fail(self, run_id: str, message: str, code: str = "error") -> None: ...
    def update(self, run_id: str, name: str, payload: Any = None) -> str: ...
    def update_result(self, update_id: str) -> tuple[str, str]: ...
    def resolve_promise(self, promise_id: str, value: Any) -> None: ...
    def reject_promise(self, promise_id: str, message: str) -> None: ...
    def report_task_outcome(
        self, task_id: str, token: str, status: int, payload: str = ""
    ) -> str: ...
    def describe(self, run_id: str) -> dict[str, Any]: ...
    def status(self, run_id: str) -> str: ...
    def result(self, run_id: str) -> Any: ...
    def history(self, run_id: str) -> list[Event]: ...
    def locks(self) -> dict[str, str]: ...
    def state(self, scope: str, key: str) -> str | None: ...
    def children(self, run_id: str) -> dict[str, tuple[str, str | None]]: ...
    def replace_module(self, name: str, version: int, wasm: bytes) -> None: ...


class MemoryEnvironment(WorkflowEnvironment):
    kind = "memory"

    def locks(self) -> dict[str, str]:
        """Every lock held: key -> holder (a workflow id)."""
        return {key: holder for key, (holder, _) in self.storage.locks.items()}

    def state(self, scope: str, key: str) -> str | None:
        return self.storage.state.get((scope, key))

    def children(self, run_id: str) -> dict[str, tuple[str, str | None]]:
        """The run's children: run id -> (status, error code)."""
        return {
            r.run_id: (r.status, r.error_code)
            for r in self.storage.runs.values()
            if r.parent_run_id == run_id
        }

    def replace_module(self, name: str, version: int, wasm: bytes) -> None:
        """Change the code of a deployed version behind its runs' back."""
        self._modules[(name, version)] = self.runtime.load(wasm)


def database_environment(tenant: Any, services: dict[str, Any] | None) -> Any:
    """A :class:`DatabaseEnvironment` (imported late: Django must be set up first)."""
    import hashlib

    from workflows.crypto import open_column
    from workflows.models import ConcurrencyKey, WorkflowDefinition, WorkflowInstance, WorkflowState
    from workflows.tenancy import tenant_context
    from workflows.testing import DatabaseWorkflowEnvironment

    class DatabaseEnvironment(DatabaseWorkflowEnvironment):
        kind = "database"

        def locks(self) -> dict[str, str]:
            with tenant_context(self.tenant.id):
                return dict(
                    ConcurrencyKey.objects.filter(tenant_id=self.tenant.id).values_list(
                        "key", "holder"
                    )
                )

        def state(self, scope: str, key: str) -> str | None:
            with tenant_context(self.tenant.id):
                value = (
                    WorkflowState.objects.filter(tenant_id=self.tenant.id, scope=scope, key=key)
                    .values_list("value", flat=True)
                    .first()
                )
            return open_column(WorkflowState, "value", self.tenant.id, (scope, key), value)

        def children(self, run_id: str) -> dict[str, tuple[str, str | None]]:
            with tenant_context(self.tenant.id):
                rows = WorkflowInstance.objects.filter(parent_id=run_id).values_list(
                    "id", "status", "error_code"
                )
                return {str(i): (status, code) for i, status, code in rows}

        def replace_module(self, name: str, version: int, wasm: bytes) -> None:
            with tenant_context(self.tenant.id):
                WorkflowDefinition.objects.filter(
                    tenant_id=self.tenant.id, name=name, version=version
                ).update(wasm=wasm, sha256=hashlib.sha256(wasm).hexdigest())

    return DatabaseEnvironment(tenant, services, controlled_clock=True)
