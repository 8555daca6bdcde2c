"""Run workflows in-process, against in-memory storage, with virtual time.

The helper cleat's own engine tests use, and the one workflow authors use for theirs::

    from engine.testing import WorkflowEnvironment

    def test_order_waits_for_shipping(order_wasm):
        env = WorkflowEnvironment(services={"payments": my_fake_payments})
        env.deploy("order", order_wasm)
        run = env.start("order", {"item": "book"})
        env.run_until_idle()
        assert env.describe(run)["waiting_on"].startswith("signals shipped")
        env.signal(run, "shipped", {"carrier": "ups"})
        env.advance(seconds=60)
        assert env.result(run) == {"ok": True}
        env.assert_replays(run)   # the history replays to the same outcome, no call repeated

Time only moves when the test says so (``advance``); timers fire as the virtual clock
passes them. A run's lifecycle is the worker's (:mod:`engine.lifecycle`): a retryable
failure is retried after the definition's backoff (``deploy(..., retry=RetryPolicy(...))``;
by default 3 attempts, 1 s then 2 s, as a deployed definition) and then dead-lettered, so
``advance`` makes a retry due; non-determinism dead-letters at once; a run's end releases
the locks its workflow holds. ``assert_replays`` re-runs a run from its full history with
storage and services that refuse every write and call, which is the determinism check a
worker relies on.

:func:`replay` is the other half, Temporal's replayer: a history exported from a real run
(``manage.py export_history RUN_ID``, :mod:`engine.recorded`) replayed against a new build
of the workflow, in a unit test::

    from engine.testing import replay

    def test_the_new_build_replays_production_runs(new_order_wasm):
        replay("tests/histories/order-1.json", new_order_wasm)   # NondeterminismError if not
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.errors import EngineError, ErrorCode, HistoryCorrupt, NondeterminismError
from engine.events import Event, decode
from engine.inmemory import InMemoryStorage, dumps
from engine.lifecycle import RetryPolicy, RunPolicy
from engine.outcomes import Suspend, WaitCondition, WaitKind
from engine.recorded import RecordedRun
from engine.runtime import LoadedModule, WasmRuntime
from engine.services import CallContext, CallResult, Fetcher, PluginRegistry, Services
from engine.session import Completed, ContinuedAsNew, Failed, Outcome, RunInfo, SegmentResult
from engine.status import RunStatus
from engine.storage import RunRef
from engine.versions import DeployedVersion, NoSuchVersion, binding_problem, resolve_plugins

DEFAULT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

_shared_runtime: WasmRuntime | None = None


def shared_runtime() -> WasmRuntime:
    """One runtime per process for tests (engines and compiled modules are expensive)."""
    global _shared_runtime
    if _shared_runtime is None:
        _shared_runtime = WasmRuntime(EngineConfig())
    return _shared_runtime


class VirtualClock:
    def __init__(self, start_ms: int = DEFAULT_START_MS) -> None:
        self.ms = start_ms

    def now(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


class ReplayMismatch(AssertionError):
    pass


@dataclass
class RecordingCaller:
    """Wraps a service caller and remembers each call (tests assert nothing repeats)."""

    inner: Any
    calls: list[tuple[str, str, str, str]] = field(default_factory=list)

    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        self.calls.append((service, operation, request, context.idempotency_key))
        result: CallResult = self.inner.call(service, operation, request, context)
        return result

    def task_service(self, name: str) -> Any:
        """The inner caller's task service ``name`` (calls that run as tasks, which report
        their outcome through :meth:`WorkflowEnvironment.report_task_outcome`)."""
        lookup = getattr(self.inner, "task_service", None)
        return lookup(name) if lookup is not None else None


class WorkflowEnvironment:
    def __init__(
        self,
        services: Mapping[str, Any] | None = None,
        *,
        config: EngineConfig | None = None,
        runtime: WasmRuntime | None = None,
        start_ms: int = DEFAULT_START_MS,
        plugins: Mapping[str, Any] | None = None,
        fetch_allow: tuple[str, ...] = (),
        resolvers: Mapping[str, Any] | None = None,
        require_signal_auth: bool = False,
        plugin_guard: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
        compact_after_events: int = 0,
    ) -> None:
        self.clock = VirtualClock(start_ms)
        self.storage = InMemoryStorage(self.clock.now)
        # History compaction, as CLEAT_COMPACT_AFTER_EVENTS (0: off) sets it for the database.
        self.storage.compact_after_events = compact_after_events
        self.storage.require_signal_auth = require_signal_auth
        self.runtime = runtime or (WasmRuntime(config) if config else shared_runtime())
        self.services = Services.from_settings(
            services,
            plugins=plugins,
            fetch_allow=fetch_allow,
            resolvers=resolvers,
            plugin_guard=plugin_guard,
        )
        self.caller = RecordingCaller(self.services.caller)
        self.services.caller = self.caller
        self._modules: dict[tuple[str, int], LoadedModule] = {}
        # (name, version) -> (min_version, max_history_length) the deploy declared
        self._declared: dict[tuple[str, int], tuple[int, int]] = {}
        # (name, version) -> plugin versions pinned at deploy
        self._plugin_versions: dict[tuple[str, int], dict[str, str]] = {}
        self.segments: list[tuple[str, SegmentResult]] = []
        self.worker_id = "test-worker"

    # --- definitions and runs ---

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
        """Deploy a module (bytes of a core module or a component) and return its version.

        As a deployed definition: ``min_version`` is what the guest's ``min_version()``
        answers, ``max_history_length`` the events after which a run continues as new (0:
        the engine's default), ``retry`` the policy a retryable failure is retried with
        before the run is dead-lettered (the database's defaults when not given),
        ``child_binding`` and ``child_versions`` how its children get their versions
        (:class:`engine.versions.ChildBinding`), ``allowed_signal_callers`` the workflows
        that may signal its runs when signal authorization is on, ``plugin_dependencies``
        semver constraints resolved now to the newest configured plugin versions."""
        if min_version < 0:
            raise EngineError("min_version must not be negative")
        pins = dict(child_versions or {})
        binding = binding_problem(child_binding, pins)
        if binding is not None:
            raise EngineError(binding[1])
        if max_history_length < 0:
            raise EngineError("max_history_length must not be negative")
        try:
            plugin_versions = resolve_plugins(
                dict(plugin_dependencies or {}), self.services.plugins.versions()
            )
        except NoSuchVersion as exc:
            raise EngineError(exc.message) from None
        policy = retry or RetryPolicy()
        problems = policy.problems()
        if problems:
            raise EngineError(f"retry policy: {'; '.join(problems)}")
        versions = self.storage.definitions.setdefault(name, {})
        version = version or (max(versions, default=0) + 1)
        module = self.runtime.load(wasm)
        self._modules[(name, version)] = module
        self._declared[(name, version)] = (min_version, max_history_length)
        self._plugin_versions[(name, version)] = plugin_versions
        self.storage.declared[(name, version)] = DeployedVersion(
            version,
            min_version=min_version,
            entry_points=tuple(module.info.entry_points),
            child_binding=child_binding,
            child_versions=pins,
            allowed_signal_callers=tuple(allowed_signal_callers),
        )
        self.storage.policies[(name, version)] = RunPolicy(retry=policy)
        versions[version] = False
        return version

    def start(
        self,
        name: str,
        input: Any = None,
        *,
        version: int | None = None,
        workflow_id: str | None = None,
        priority: int = 0,
    ) -> str:
        versions = self.storage.definitions.get(name)
        if not versions:
            raise EngineError(f"no workflow definition named {name!r}")
        chosen = version or max(v for v, deprecated in versions.items() if not deprecated)
        if chosen not in versions:
            raise EngineError(f"{name!r} has no version {chosen}")
        text = "null" if input is None else dumps(input)
        return self.storage.create_run(
            name, chosen, text, workflow_id=workflow_id, priority=priority
        ).run_id

    def deprecate(self, name: str, version: int, deprecated: bool = True) -> None:
        """Mark a version deprecated (new runs stop choosing it) or restore it."""
        versions = self.storage.definitions.get(name, {})
        if version not in versions:
            raise EngineError(f"{name!r} has no version {version}")
        versions[version] = deprecated

    def set_tag(self, name: str, tag: str, version: int) -> None:
        """Point ``tag`` (``stable``, ``canary``) at a deployed version."""
        if version not in self.storage.definitions.get(name, {}):
            raise EngineError(f"{name!r} has no version {version}")
        self.storage.tags[(name, tag)] = version

    def run(self, name: str, input: Any = None, **kwargs: Any) -> str:
        """Start a run and process everything due; returns the run id."""
        run_id = self.start(name, input, **kwargs)
        self.run_until_idle()
        return run_id

    # --- the worker loop ---

    def step(self) -> bool:
        """Run one due segment; False when nothing is due."""
        run = self.storage.claim(self.worker_id, self.clock.now())
        if run is None:
            return False
        ref = self.storage.ref(run)
        result = self.runtime.run_segment(
            self._module(run.definition, run.version),
            self._info(ref, run),
            list(run.history),
            self.storage,
            self.services,
            self.clock.now,
        )
        self.segments.append((run.run_id, result))
        self.storage.finalize(ref, result)
        return True

    def run_until_idle(self, max_segments: int = 10_000) -> int:
        count = 0
        while self.step():
            count += 1
            if count >= max_segments:
                raise EngineError(f"still busy after {max_segments} segments (a livelock?)")
        return count

    def advance(self, seconds: float = 0, *, ms: int = 0) -> int:
        """Move virtual time forward and run what became due."""
        self.clock.advance(int(seconds * 1000) + ms)
        return self.run_until_idle()

    def _module(self, name: str, version: int) -> LoadedModule:
        return self._modules[(name, version)]

    def _info(self, ref: RunRef, run: Any) -> RunInfo:
        min_version, max_history = self._declared.get((run.definition, run.version), (0, 0))
        return RunInfo(
            ref=ref,
            definition=run.definition,
            version=run.version,
            input=run.input,
            start_ms=run.created_ms,
            min_version=min_version,
            max_history_events=max_history or None,
            plugin_versions=self._plugin_versions.get((run.definition, run.version), {}),
        )

    # --- talking to runs ---

    def signal(
        self, run_id: str, name: str, payload: Any = None, *, permitted: bool = True
    ) -> None:
        """A signal from outside, by a caller with (``permitted``) or without the permission
        signal authorization asks for (refused: ``Refused`` with ``DENIED``)."""
        text = "null" if payload is None else dumps(payload)
        self.storage.deliver_external_signal(run_id, name, text, permitted=permitted)

    def cancel(self, run_id: str, reason: str = "cancelled by test") -> None:
        self.storage.cancel(run_id, reason)

    # An operator's closes: refused (Refused) for a run whose status does not allow them,
    # kept in its history as an admin_action annotation, as under the database store.

    def terminate(self, run_id: str, reason: str = "terminated by test") -> None:
        self.storage.terminate(run_id, reason, operator="test")

    def force_complete(self, run_id: str, result: Any = None) -> None:
        """An operator's answer for a run: it ends ``done`` with ``result``."""
        text = "null" if result is None else dumps(result)
        self.storage.force_complete(run_id, text, operator="test")

    def force_fail(self, run_id: str, message: str, code: str = "error") -> None:
        self.storage.force_fail(run_id, message, code, operator="test")

    def report_task_outcome(self, task_id: str, token: str, status: int, payload: str = "") -> str:
        """What the hook in a task's worker does with a task's outcome (``OK`` with the
        result's JSON, or an error status and message); returns what became of it
        (``engine.task_calls.Disposition``)."""
        return self.storage.report_task_outcome(task_id, token, status, payload).value

    def move_to_version(self, run_id: str, version: int) -> None:
        """An operator's move of a waiting, paused or dead-lettered run to another version
        (refused, with the first incompatibility, as under the database store)."""
        self.storage.move_to_version(run_id, version, operator="test")

    def resolve_promise(self, promise_id: str, value: Any) -> None:
        self.storage.settle_promise(promise_id, value=dumps(value))

    def reject_promise(self, promise_id: str, message: str) -> None:
        self.storage.settle_promise(promise_id, error=message, rejected=True)

    def update(self, run_id: str, name: str, payload: Any = None) -> str:
        return self.storage.request_update(run_id, name, dumps(payload))

    def update_result(self, update_id: str) -> tuple[str, str]:
        update = self.storage.updates[update_id]
        return update.status, update.result

    # --- inspecting runs ---

    def describe(self, run_id: str) -> dict[str, Any]:
        return self.storage.describe(run_id)

    def status(self, run_id: str) -> RunStatus:
        return self.storage.runs[run_id].status

    def result(self, run_id: str) -> Any:
        """The parsed result of a finished run (follows continue-as-new)."""
        run = self.storage.chain_end(self.storage.runs[run_id])
        if run.status != RunStatus.DONE:
            detail = f"{run.error_code or ''} {run.error or ''}".strip()
            raise AssertionError(f"run {run.run_id} is {run.status}: {detail}")
        return json.loads(run.result) if run.result else None

    def history(self, run_id: str) -> list[Event]:
        return [decode(e) for e in self.storage.runs[run_id].history]

    def export(self, run_id: str) -> RecordedRun:
        """The run as an exported history (what ``manage.py export_history`` writes for a
        run in the database), for :func:`replay`."""
        run = self.storage.runs[run_id]
        min_version, _ = self._declared.get((run.definition, run.version), (0, 0))
        return RecordedRun(
            definition=run.definition,
            version=run.version,
            workflow_id=run.workflow_id,
            run_id=run.run_id,
            input=run.input,
            start_ms=run.created_ms,
            history=tuple(run.history),
            min_version=min_version,
            status=RunStatus(run.status).value,
            result=run.result,
            error=run.error,
            error_code=run.error_code,
        )

    def latest_run(self, run_id: str) -> str:
        return self.storage.chain_end(self.storage.runs[run_id]).run_id

    def replay(self, run_id: str) -> SegmentResult:
        """Re-run ``run_id`` from its full history, refusing every write and service call."""
        run = self.storage.runs[run_id]
        ref = RunRef(self.storage.tenant_id, run.workflow_id, run.run_id, "replayer", 0)
        guard = _ReplayGuard(self.storage)
        services = Services(
            caller=_RefusingCaller(),
            fetcher=self.services.fetcher,
            plugins=self.services.plugins,
            resolvers={},
        )
        return self.runtime.run_segment(
            self._module(run.definition, run.version),
            self._info(ref, run),
            list(run.history),
            guard,
            services,
            self.clock.now,
        )

    def assert_replays(self, run_id: str) -> SegmentResult:
        """Replay a finished run and check it reaches the same outcome with no new events."""
        run = self.storage.runs[run_id]
        result = self.replay(run_id)
        if result.new_events or result.recorded:
            raise ReplayMismatch(
                f"replay of {run_id} recorded new events: {[e.describe() for e in result.recorded]}"
            )
        expected = _outcome_of(run)
        if not _same_outcome(result.outcome, expected):
            raise ReplayMismatch(
                f"replay of {run_id} ended in {result.outcome}, the run in {expected}"
            )
        return result


def _outcome_of(run: Any) -> tuple[str, str | None]:
    if run.continued_as:
        return ("continued", None)
    if run.status == RunStatus.DEAD_LETTERED:  # a failure the retry policy gave up on
        return (RunStatus.FAILED.value, run.error_code)
    # The plain value, so a mismatch message reads "('done', ...)".
    status = RunStatus(run.status).value
    return (status, run.result if status == RunStatus.DONE else run.error_code)


def _same_outcome(outcome: Outcome, expected: tuple[str, str | None]) -> bool:
    if isinstance(outcome, Completed):
        return expected == (RunStatus.DONE, outcome.result)
    if isinstance(outcome, Failed):
        return expected == (RunStatus.FAILED, outcome.code.value)
    if isinstance(outcome, ContinuedAsNew):
        return expected[0] == "continued"
    return False


class _RefusingCaller:
    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        raise ReplayMismatch(f"replay called {service}.{operation} again at step {context.step}")


class _ReplayGuard:
    """Storage for replay checks: reads pass through, every write is a mismatch."""

    def __init__(self, inner: InMemoryStorage) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in ("append_events", "complete_intent", "apply"):

            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise ReplayMismatch(f"replay tried to write ({name})")

            return refuse
        attr: Callable[..., Any] = getattr(self._inner, name)
        return attr

    def heartbeat(self, run: RunRef) -> bool:
        return True


# --- replaying exported histories -----------------------------------------------------------


def replay(
    history: RecordedRun | Mapping[str, Any] | str | Path,
    module: bytes | LoadedModule,
    *,
    runtime: WasmRuntime | None = None,
    min_version: int | None = None,
) -> SegmentResult:
    """Replay a recorded run (an exported history: a :class:`~engine.recorded.RecordedRun`,
    its JSON document or text, or a file's path) against ``module`` (the bytes of a new
    build, or a loaded module) and check that the new code still makes the recorded run.

    Raises :class:`~engine.errors.NondeterminismError` naming the step, the recorded event
    and the new call where the code diverges (or the recorded step it no longer reaches),
    :class:`~engine.errors.HistoryCorrupt` for an event whose checksum fails, and
    :class:`ReplayMismatch` when a finished run (``done`` or failed) replays to a different
    end. Nothing is called and nothing is written: the replay stops where the history stops
    (a run still waiting replays up to its wait). ``min_version`` is what the guest's
    ``min_version()`` answers (default: the recorded definition's). Returns the segment's
    result (``replayed_steps`` is how many recorded events were matched).
    """
    recorded = RecordedRun.load(history)
    runtime = runtime or shared_runtime()
    loaded = module if isinstance(module, LoadedModule) else runtime.load(bytes(module))
    last_ts = max((e.ts for e in recorded.history), default=recorded.start_ms)
    clock = VirtualClock(max(last_ts, recorded.start_ms))
    storage = InMemoryStorage(clock.now)
    record = storage.create_run(
        recorded.definition,
        recorded.version,
        recorded.input,
        run_id=recorded.run_id,
        workflow_id=recorded.workflow_id,
    )
    for event in recorded.history:
        record.history.append(event)
    ref = RunRef(storage.tenant_id, recorded.workflow_id, recorded.run_id, "replayer", 0)
    info = RunInfo(
        ref=ref,
        definition=recorded.definition,
        version=recorded.version,
        input=recorded.input,
        start_ms=recorded.start_ms,
        entry_point=recorded.entry_point,
        min_version=recorded.min_version if min_version is None else min_version,
    )
    result = runtime.run_segment(
        loaded,
        info,
        list(recorded.history),
        _HistoryEndStorage(storage),
        # Past the end of the history nothing is reached: calls stop the replay, fetch is
        # refused by an empty allow-list and no plugin is registered.
        Services(
            caller=_HistoryEndCaller(),
            fetcher=Fetcher(()),
            plugins=PluginRegistry({}),
            resolvers={},
        ),
        clock.now,
    )
    outcome = result.outcome
    if isinstance(outcome, Failed) and outcome.code is ErrorCode.NONDETERMINISM:
        raise NondeterminismError.from_message(outcome.message) or NondeterminismError(
            -1, "?", outcome.message
        )
    if isinstance(outcome, Failed) and outcome.code is ErrorCode.HISTORY_CORRUPT:
        raise HistoryCorrupt(outcome.message)
    _check_end(recorded, result)
    return result


def _check_end(recorded: RecordedRun, result: SegmentResult) -> None:
    """A finished run must end the same way when its whole history replays."""
    if result.recorded:  # it went past the history: the run had not ended there
        return
    outcome = result.outcome
    if recorded.status == RunStatus.DONE:
        if outcome != Completed(recorded.result or "null"):
            raise ReplayMismatch(
                f"run {recorded.run_id} completed with {recorded.result}; "
                f"the new code ends in {_describe(outcome)}"
            )
    elif (
        recorded.status in (RunStatus.FAILED, RunStatus.DEAD_LETTERED)
        and recorded.error_code
        and not (isinstance(outcome, Failed) and outcome.code.value == recorded.error_code)
    ):
        raise ReplayMismatch(
            f"run {recorded.run_id} failed with {recorded.error_code}; "
            f"the new code ends in {_describe(outcome)}"
        )


def _describe(outcome: Outcome) -> str:
    if isinstance(outcome, Completed):
        return f"a result of {outcome.result}"
    if isinstance(outcome, Failed):
        return f"a failure ({outcome.code.value}: {outcome.message})"
    if isinstance(outcome, ContinuedAsNew):
        return "continue-as-new"
    return f"a wait ({outcome.wait.describe()})"


def _history_end() -> Suspend:
    """What stops a replay at the end of the recorded history: the next step would have an
    effect (a call, a write), so the segment ends there as at a wait."""
    return Suspend(WaitCondition(WaitKind.TIMER, wake_at_ms=None))


class _HistoryEndCaller:
    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        raise _history_end()


class _HistoryEndStorage:
    """Storage for :func:`replay`: reads answer from the recorded run alone; a write can
    only come past the end of the history, and stops the replay there."""

    def __init__(self, inner: InMemoryStorage) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in ("append_events", "complete_intent", "apply"):

            def stop(*args: Any, **kwargs: Any) -> Any:
                raise _history_end()

            return stop
        attr: Callable[..., Any] = getattr(self._inner, name)
        return attr

    def heartbeat(self, run: RunRef) -> bool:
        return True
