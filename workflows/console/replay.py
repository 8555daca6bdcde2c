"""A run's query state as it was after its first N events ("state at step N").

The run's module is replayed against its stored history cut after N events, in memory, with
nothing that could act on the world: the segment stops at the first call that the cut history
cannot answer. Two fences make sure of it:

* ``max_history_events = N``: the engine's own history-limit guard ends the segment (as a
  continue-as-new it only *returns*, nothing is written) at the first host call past step N;
* storage, services and the clock refuse every use by ending the segment. A replayed call is
  answered from the history and never reaches any of them, so the first use can only come
  from fresh execution past the cut (and catches N = 0, where the guard cannot be set).

Replaying also re-checks the prefix: a module that no longer matches the history shows the
non-determinism here, as a worker would meet it.

The replay runs in the web process, on the request's thread, so it gets a deadline of its own,
``CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS`` (default 2 s), far below a worker's segment deadline
(``CLEAT_SEGMENT_TIMEOUT_SECONDS``, 30 s): a module that spins, or a long history, must not
hold a web thread for half a minute per click. The deadline belongs to the runtime (its epoch
deadline is set per store from the configuration), so the console has a runtime of its own,
made on first use; the worker's is untouched.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from engine.compaction import CompactionCorrupt
from engine.errors import ErrorCode, InvalidModule
from engine.runtime import WasmRuntime
from engine.services import CallResult, Services
from engine.session import (
    Completed,
    ContinuedAsNew,
    Failed,
    RunInfo,
    Suspend,
    Suspended,
    WaitCondition,
    WaitKind,
)
from engine.storage import RunRef
from workflows.models import WorkflowDefinition, WorkflowEvent, WorkflowInstance
from workflows.store.lifecycle import load_wasm
from workflows.tenancy import of_tenant

# Failures that say the replay itself could not follow the history (not the run's own end).
_REPLAY_PROBLEMS = frozenset(
    {
        ErrorCode.NONDETERMINISM,
        ErrorCode.HISTORY_CORRUPT,
        ErrorCode.INVALID_MODULE,
        ErrorCode.INTERNAL,
        ErrorCode.GUEST_FAULT,
    }
)


DEFAULT_REPLAY_TIMEOUT_S = 2.0
TIMEOUT_SETTING = "CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS"

_runtime: WasmRuntime | None = None
_runtime_lock = threading.Lock()


class ReplaySettingError(ValueError):
    """``CLEAT_CONSOLE_REPLAY_TIMEOUT_SECONDS`` is not a usable number of seconds."""


def replay_timeout_s() -> float:
    raw = getattr(settings, TIMEOUT_SETTING, DEFAULT_REPLAY_TIMEOUT_S)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if not value > 0:
        raise ReplaySettingError(f"{TIMEOUT_SETTING} must be a positive number of seconds")
    return value


def console_runtime() -> WasmRuntime:
    """The console's runtime: the worker's configuration with the console's deadline (made
    again when the setting changes, as tests do)."""
    from workflows.conf import cleat_settings

    global _runtime
    timeout = replay_timeout_s()
    with _runtime_lock:
        if _runtime is None or _runtime.config.segment_timeout_s != timeout:
            engine = cleat_settings().engine
            tick = min(engine.epoch_tick_s, timeout / 10)
            try:
                config = dataclasses.replace(engine, segment_timeout_s=timeout, epoch_tick_s=tick)
            except ValueError as exc:
                raise ReplaySettingError(f"{TIMEOUT_SETTING}: {exc}") from None
            previous, _runtime = _runtime, WasmRuntime(config)
            if previous is not None:
                previous.close()
        return _runtime


class _PastTheCut(Suspend):
    """The replay reached the end of the cut history (ends the segment quietly)."""

    def __init__(self, what: str) -> None:
        super().__init__(WaitCondition(WaitKind.TIMER))
        self.what = what


def _stop(what: str) -> Any:
    raise _PastTheCut(what)


class _SealedStorage:
    """Storage for a replay that must not go past its history: every use ends it."""

    def append_events(self, run: RunRef, events: Sequence[Any]) -> None:
        _stop("append_events")

    def complete_intent(self, run: RunRef, event: Any) -> None:
        _stop("complete_intent")

    def apply(self, run: RunRef, mutation: Any, pending: Sequence[Any], record: Any) -> Any:
        return _stop("apply")

    def next_signal(self, run: RunRef, names: Sequence[str], exclude: Collection[str]) -> Any:
        return _stop("next_signal")

    def cancellation(self, run: RunRef) -> str | None:
        return _stop("cancellation")  # type: ignore[no-any-return]

    def child_outcomes(self, run: RunRef, child_run_ids: Sequence[str]) -> Any:
        return _stop("child_outcomes")

    def promise_state(self, run: RunRef, promise_id: str) -> Any:
        return _stop("promise_state")

    def get_state(self, run: RunRef, scope: str, key: str) -> str | None:
        return _stop("get_state")  # type: ignore[no-any-return]

    def list_state(self, run: RunRef, scope: str, prefix: str) -> list[str]:
        return _stop("list_state")  # type: ignore[no-any-return]

    def list_schedules(self, run: RunRef) -> list[dict[str, Any]]:
        return _stop("list_schedules")  # type: ignore[no-any-return]

    def pending_updates(self, run: RunRef, exclude: Collection[str]) -> list[Any]:
        return _stop("pending_updates")  # type: ignore[no-any-return]

    def interrupts(self, run: RunRef, exclude: Collection[str]) -> Any:
        return _stop("interrupts")

    def heartbeat(self, run: RunRef) -> bool:
        return _stop("heartbeat")  # type: ignore[no-any-return]


class _SealedCaller:
    def call(self, service: str, operation: str, request: str, context: Any) -> CallResult:
        return _stop(f"{service}.{operation}")  # type: ignore[no-any-return]


class _SealedFetcher:
    def fetch(self, method: str, url: str, headers: str, body: str) -> CallResult:
        return _stop("fetch")  # type: ignore[no-any-return]


class _SealedPlugins:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: _stop(f"plugin {name}")


def _sealed_clock() -> int:
    return _stop("clock")  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StateAtStep:
    step: int  # events replayed (the cut)
    total: int  # events the run has
    query_state: dict[str, Any]
    note: str  # how the replay ended, for the operator
    error: bool = False


def _parsed(state: dict[str, str]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for key, value in state.items():
        try:
            parsed[key] = json.loads(value)
        except (TypeError, ValueError):
            parsed[key] = value
    return parsed


def state_at_step(instance: WorkflowInstance, step: int) -> StateAtStep:
    """Replay ``instance`` (read in the caller's tenant context) to its first ``step`` events."""
    try:
        stored = WorkflowEvent.history(instance.tenant_id, instance.id)
    except CompactionCorrupt as exc:
        return StateAtStep(step, 0, {}, f"the history cannot be read: {exc}", error=True)
    total = len(stored)
    step = max(0, min(step, total))
    history = stored[:step]
    definition = (
        of_tenant(WorkflowDefinition, instance.tenant_id)
        .filter(id=instance.definition_id)
        .values("sha256")
        .first()
    )
    if definition is None:
        return StateAtStep(step, total, {}, "the run's definition is gone", error=True)
    try:
        runtime = console_runtime()
    except ReplaySettingError as exc:
        return StateAtStep(step, total, {}, f"the replay is not configured: {exc}", error=True)
    try:
        module = runtime.load_once(
            definition["sha256"], lambda: load_wasm(instance.tenant_id, instance.definition_id)
        )
    except InvalidModule as exc:
        return StateAtStep(step, total, {}, f"the module does not load: {exc}", error=True)
    run = RunInfo(
        ref=RunRef(str(instance.tenant_id), instance.workflow_id, str(instance.id), "console", 0),
        definition=instance.definition_name,
        version=instance.definition_version,
        input=instance.input,
        start_ms=int(instance.created_at.timestamp() * 1000),
        entry_point=instance.entry_point,
        max_history_events=step or None,
    )
    services = Services(
        caller=_SealedCaller(),  # type: ignore[arg-type]
        fetcher=_SealedFetcher(),  # type: ignore[arg-type]
        plugins=_SealedPlugins(),  # type: ignore[arg-type]
        resolvers={},
    )
    result = runtime.run_segment(module, run, history, _SealedStorage(), services, _sealed_clock)  # type: ignore[arg-type]
    outcome = result.outcome
    state = _parsed(result.query_state)
    if isinstance(outcome, Suspended | ContinuedAsNew):
        return StateAtStep(step, total, state, f"replayed {result.replayed_steps} event(s)")
    if isinstance(outcome, Completed):
        return StateAtStep(step, total, state, "the run completes within these events")
    if isinstance(outcome, Failed) and outcome.code == ErrorCode.TIMEOUT:
        return StateAtStep(
            step,
            total,
            {},
            f"the replay was stopped after {runtime.config.segment_timeout_s:g} s, the "
            f"console's limit ({TIMEOUT_SETTING}): replaying these events takes the module "
            "longer than that, so their state cannot be shown here",
            error=True,
        )
    if isinstance(outcome, Failed) and outcome.code in _REPLAY_PROBLEMS:
        return StateAtStep(
            step, total, state, f"replay failed: {outcome.code.value}: {outcome.message}", True
        )
    if isinstance(outcome, Failed):
        return StateAtStep(
            step, total, state, f"the run fails within these events ({outcome.code.value})"
        )
    raise RuntimeError(f"unrecognised outcome {outcome!r}")
