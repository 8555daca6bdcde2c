"""The session's replay core: record on first execution, replay from history afterwards.

Design note
-----------
A segment instantiates the module afresh and runs the entry point from the beginning. Each
host call that has an effect, or brings information in, takes the next **step**:

* while the step is inside the recorded history, the call is *replayed*: its question
  (``Event.IDENTITY``) must equal the recorded one, and the recorded answer is returned;
  no service is called again, nothing is written;
* past the end of the history it is *executed*: the effect happens and an event records it.

Pure calls (``now``, ``random``, ``uuid``, ids, versions, JSON helpers, ``get_scope``,
``set_query_state``) take no step: their values are functions of recorded data (virtual
time is the timestamp of the last event; randomness is a stream seeded by the run), so
replays see the same values without storing them.

A blocking call whose answer is not there yet (timer not due, no signal, child running)
records nothing and ends the segment by raising :class:`Suspend` out of the host function;
wasmtime unwinds the guest as a trap. The next segment replays to the same call and asks
again. Timeouts are measured from the virtual time at which the call was first made, which
replay reproduces, so every attempt agrees on the deadline.

Two alternatives were considered and dropped. Recording a "wait started" event for every
blocking call doubles the history of wait-heavy workflows and buys nothing that the
deterministic start time does not already give. Keeping instances alive across waits
(coroutines, snapshots) ties a run to one process, which is what durable execution exists
to avoid.

Persistence: one rule, the history is written before anything leaves the process. Every
event is recorded in memory; before a call goes out (a service, an HTTP fetch, a plugin, a
batch of calls) the events recorded since the last write are appended to storage
(:meth:`ReplayCore._flush`), so the stored history stays a prefix; state changes in our own
database go through ``WorkflowStorage.apply`` together with the events before them; what is
left is returned in :class:`SegmentResult` for the fenced finalize at the end, in its one
transaction. So a call's event is committed before the run's next effect and before anyone
outside the run can see what it led to (the next call, the run's result, an update's answer),
but not before the guest computes with the reply: the last call of a segment costs no
transaction of its own. A crash before that commit repeats the call on replay with the same
idempotency key, as a crash between the call and its commit always did (at least once); a
write-ahead call's intent is recorded before the call and so committed before it goes out.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar

from engine.config import EngineConfig
from engine.determinism import IdempotencyKeys, run_seed
from engine.errors import (
    EngineError,
    ErrorCode,
    FenceLost,
    GuestFault,
    HistoryCorrupt,
    NondeterminismError,
    Refused,
    StorageError,
    WorkflowExit,
)
from engine.events import (
    CodecError,
    ContinueAsNewEvent,
    EncodedEvent,
    Event,
    SleepEvent,
    UpdateAppliedEvent,
    decode,
    describe_call,
    verify,
)
from engine.outcomes import (
    AppliedUpdate,
    Completed,
    ContinueAsNew,
    Outcome,
    SegmentResult,
    Suspend,
    WaitCondition,
    WaitKind,
    failed,
)
from engine.services import CallResult, Services
from engine.status import AbiStatus, status_from_byte
from engine.storable import json_text_fault, readable_text, text_fault
from engine.storage import Mutation, RunRef, UpdateRequest, WorkflowStorage
from engine.tracing import traced_call

log = logging.getLogger("cleat.engine")


class _GivenBack:
    """A segment's storage: each call's time is given back to the segment's deadline
    (``give_back``), as a service call's is, so that a slow database does not use up the
    guest's budget (a commit's wait before each call, a state change's transaction). Each
    method is wrapped at its first use in the segment."""

    def __init__(self, storage: WorkflowStorage, give_back: Callable[[float], None]) -> None:
        self._storage = storage
        self._give_back = give_back

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._storage, name)
        if not callable(found):
            return found
        give_back = self._give_back

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return found(*args, **kwargs)
            finally:
                give_back(time.monotonic() - started)

        self.__dict__[name] = timed  # later uses find it without __getattr__
        return timed


class Reply(NamedTuple):
    """The contents of a packed buffer: a status byte and a UTF-8 payload."""

    status: int
    payload: str = ""


OK_EMPTY = Reply(AbiStatus.OK, "")


@dataclass(frozen=True, slots=True)
class RunInfo:
    """Everything a segment needs to know about the run, in one frozen value."""

    ref: RunRef
    definition: str
    version: int
    input: str
    start_ms: int  # virtual time before the first event
    entry_point: str = "run"
    min_version: int = 0
    # Events after which the run continues as new; None: the engine configuration's.
    max_history_events: int | None = None
    # plugin -> the version the definition's plugin_dependencies resolved to at deploy.
    plugin_versions: Mapping[str, str] = field(default_factory=dict)


class GuestBackend(Protocol):
    """What the session needs from the module instance (core module or component)."""

    supports_reentry: bool

    def call_export(self, name: str, payload: str) -> Reply: ...

    def has_export(self, name: str) -> bool: ...

    def refresh_deadline(self, io_seconds: float) -> None:
        """Give back to the segment's deadline the time a host call spent waiting on I/O."""


E = TypeVar("E", bound=Event)


def require_storable(function: str, what: str, text: str, *, is_json: bool = True) -> None:
    """Refuse guest text the host stores (and reads back as JSON, unless ``is_json`` is
    false) when no database could store it or no page render it (``engine.storable``): the
    guest's fault."""
    fault = json_text_fault(text) if is_json else text_fault(text)
    if fault is not None:
        raise GuestFault(function, f"{what} {fault}")


def json_value(text: str) -> Any:
    """Embed a JSON document as a value, or the raw text when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def parse_string_list(text: str) -> tuple[str, ...] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def compact_json(value: Any) -> str:
    """Every JSON answer the host builds is compact, keys in insertion order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def event_fields(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in ("step", "ts", *type(event).KEYS)}


def service_result(fn: Callable[[], CallResult]) -> CallResult:
    """``fn()``, with any exception but the segment's own ends as an ERROR result: a caller
    must not take the segment down."""
    try:
        return fn()
    except (FenceLost, WorkflowExit):
        raise
    except Exception as exc:
        log.exception("service call failed inside the host")
        return CallResult(AbiStatus.ERROR, f"{type(exc).__name__}: {exc}")


def never_refused(exc: Refused) -> Any:
    raise StorageError(f"storage refused an operation it should accept: {exc.message}")


class ReplayCore:
    """The replay core of one execution segment: the history, the step counter, virtual
    time, and the primitives every host operation is built from (match the recorded
    event or record a new one, apply a state change with its event, suspend), then the end
    of the entry point (defers, leftover history) and the segment's result. The host
    operations are mixins over it (``engine.session.ops_*``), combined in
    :class:`~engine.session.ExecutionSession`."""

    """One execution segment of one run. Not thread-safe: a segment runs on one thread."""

    def __init__(
        self,
        run: RunInfo,
        history: Sequence[EncodedEvent],
        storage: WorkflowStorage,
        services: Services,
        config: EngineConfig,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.run = run
        self.ref = run.ref
        # Every storage call's wait is given back to the deadline, as a service call's is.
        self.storage: WorkflowStorage = _GivenBack(storage, self._give_back)
        self.services = services
        self.config = config
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._history = self._load(history)
        self._pos = 0
        self.step = self._history[0].step if self._history else 0
        self._vnow = run.start_ms
        self._seed = run_seed(self.ref.workflow_id, self.ref.run_id)
        self._keys = IdempotencyKeys(self.ref.workflow_id, self.ref.run_id)
        self._random_counter = 0
        self._recorded: list[Event] = []
        self._unflushed: list[Event] = []
        self.query_state: dict[str, str] = {}
        self._defers: list[tuple[str, str]] = []
        self._update_handlers: set[str] = set()
        self._applied_update_ids: set[str] = set()
        self._applied_updates: list[AppliedUpdate] = []
        self._update_depth = 0
        self._consumed_signals: set[str] = set()
        self._scope = ""
        self._scope_object = ("", "")
        self._backend: GuestBackend | None = None
        self.exit: BaseException | None = None
        self.io_seconds = 0.0

    # --- loading ---

    def _load(self, history: Sequence[EncodedEvent]) -> list[Event]:
        events: list[Event] = []
        expected = history[0].step if history else 0
        for stored in history:
            if stored.step != expected:
                raise HistoryCorrupt(
                    f"history has a gap: expected step {expected}, got {stored.step}"
                )
            if self.config.verify_checksums and not verify(stored):
                raise HistoryCorrupt(f"checksum mismatch at step {stored.step}")
            try:
                events.append(decode(stored))
            except CodecError as exc:
                raise HistoryCorrupt(str(exc)) from None
            expected += 1
        return events

    def bind(self, backend: GuestBackend) -> None:
        self._backend = backend

    @property
    def backend(self) -> GuestBackend:
        if self._backend is None:
            raise EngineError("session is not bound to a module instance")
        return self._backend

    @property
    def replaying(self) -> bool:
        return self._pos < len(self._history)

    @property
    def scope(self) -> str:
        return self._scope or f"wf:{self.ref.workflow_id}"

    # --- the record / replay primitives ---

    def _peek_recorded(self) -> Event | None:
        """The next recorded guest step, after stepping over annotations and re-applying
        updates recorded at this point."""
        history = self._history
        while self._pos < len(history):
            event = history[self._pos]
            if event.ANNOTATION:
                self._consume(event)
                continue
            if type(event) is UpdateAppliedEvent:
                self._consume(event)
                self._run_update(event)
                continue
            return event
        return None

    def _consume(self, event: Event) -> None:
        self._pos += 1
        self.step = event.step + 1
        if event.ts > self._vnow:
            self._vnow = event.ts

    def _match(self, cls: type[E], identity: tuple[Any, ...]) -> E | None:
        """The recorded event for this call when replaying; None when executing fresh."""
        # Past the end of the history (every fresh call) there is nothing to peek at.
        event = self._peek_recorded() if self._pos < len(self._history) else None
        if event is None:
            self._guard_history_limit()
            return None
        if type(event) is ContinueAsNewEvent and event.reason == "history_limit":
            # The run reached the event limit at this call and continued as new: replay
            # ends here the same way, whatever the call is.
            self._consume(event)
            raise ContinueAsNew(event.new_input, 0)
        if type(event) is not cls or event.identity() != identity:
            names = cls.IDENTITY
            attempted = describe_call(cls.TYPE, dict(zip(names, identity, strict=True)))
            raise NondeterminismError(event.step, event.describe(), attempted)
        self._consume(event)
        return event

    def _guard_history_limit(self) -> None:
        limit = self.run.max_history_events or self.config.max_history_events
        if self.step >= limit:
            self._record(
                ContinueAsNewEvent(
                    step=self.step,
                    ts=self._stamp(),
                    new_input=self.run.input,
                    reason="history_limit",
                )
            )
            raise ContinueAsNew(self.run.input, 0)

    def _stamp(self) -> int:
        now = self.clock()
        return now if now > self._vnow else self._vnow

    def _record(self, event: E) -> E:
        """Keep ``event`` (built with ``step=self.step``) for the finalize."""
        self._recorded.append(event)
        self._unflushed.append(event)
        self.step = event.step + 1
        if event.ts > self._vnow:
            self._vnow = event.ts
        return event

    def _flush(self) -> None:
        """Append the events recorded since the last write to storage, before anything
        leaves the process (see the module's docstring: the history is written before the
        run's next effect)."""
        if self._unflushed:
            self.storage.append_events(self.ref, tuple(self._unflushed))
            self._unflushed.clear()

    def _apply(
        self, mutation: Mutation, make: Callable[[Any], E], refused: Callable[[Refused], E]
    ) -> E:
        """Perform a state change in storage atomically with its event."""
        made: list[E] = []

        def record(result: Any) -> Event:
            made.append(make(result))
            return made[0]

        try:
            self.storage.apply(self.ref, mutation, tuple(self._unflushed), record)
        except Refused as exc:
            return self._record(refused(exc))
        event = made[0]
        self._recorded.append(event)
        self._unflushed.clear()
        self.step = event.step + 1
        if event.ts > self._vnow:
            self._vnow = event.ts
        return event

    def _io(
        self, fn: Callable[[], CallResult], span: str = "", a: str = "", b: str = ""
    ) -> CallResult:
        """Run a call that leaves the process; with tracing on, in a current span named
        ``span`` (engine.tracing: ``a``, ``b`` are its service and operation, or method and
        URL). Only a fresh call comes here: a replayed one makes no span. What the run
        recorded before it is written first (:meth:`_flush`)."""
        self._flush()
        tracer = self.services.tracer
        if tracer is not None and span:
            return traced_call(tracer, span, a, b, self.step, lambda: self._io(fn))
        started = time.monotonic()
        try:
            return service_result(fn)
        finally:
            self._give_back(time.monotonic() - started)

    def _give_back(self, spent: float) -> None:
        """Give ``spent`` seconds a host call waited (on a service, on storage) back to the
        segment's deadline: the budget bounds the guest's own work."""
        self.io_seconds += spent
        if self._backend is not None:
            self._backend.refresh_deadline(spent)

    def _suspend(self, wait: WaitCondition) -> Suspend:
        return Suspend(wait)

    def _blocking_preamble(self) -> str | None:
        """At a fresh blocking call: hand pending updates to their handlers, then report a
        cancellation request (the call then returns CANCELLED). Both come from one storage
        read; when handlers ran, the cancellation is read again after them (they took time,
        and a request that came meanwhile must be seen before the run blocks)."""
        if not self._may_offer_updates():
            return self.storage.cancellation(self.ref)
        found = self.storage.interrupts(self.ref, self._applied_update_ids)
        if not found.updates:
            return found.cancellation
        self._apply_pending_updates(found.updates)
        return self.storage.cancellation(self.ref)

    def _deadline(self, base: int, timeout_ms: int) -> int | None:
        return base + timeout_ms if timeout_ms >= 0 else None

    def _due(self, deadline: int | None) -> bool:
        return deadline is not None and self.clock() >= deadline

    def _timer(self, duration_ms: int, reason: str) -> int:
        base = self._vnow  # before any update recorded at this point moves the clock
        event = self._match(SleepEvent, (duration_ms, reason))
        if event is not None:
            return event.status
        wake_at = base + duration_ms
        if reason == "sleep" and duration_ms > 0:
            cancelled = self._blocking_preamble()
            if cancelled is not None:
                self._record(
                    SleepEvent(
                        step=self.step,
                        ts=self._stamp(),
                        duration_ms=duration_ms,
                        wake_at_ms=wake_at,
                        reason=reason,
                        status=AbiStatus.CANCELLED,
                    )
                )
                return int(AbiStatus.CANCELLED)
        if duration_ms == 0 or self.clock() >= wake_at:
            self._record(
                SleepEvent(
                    step=self.step,
                    ts=max(wake_at, self._vnow),
                    duration_ms=duration_ms,
                    wake_at_ms=wake_at,
                    reason=reason,
                )
            )
            return 0
        kind = WaitKind.TIMER if reason == "sleep" else WaitKind.RETRY_BACKOFF
        raise self._suspend(WaitCondition(kind, wake_at_ms=wake_at))

    # --- updates ---

    def _may_offer_updates(self) -> bool:
        """Updates are handed over at blocking calls when the backend can call into the
        guest meanwhile, and not from inside a handler."""
        backend = self._backend
        return not self._update_depth and backend is not None and backend.supports_reentry

    def _apply_pending_updates(self, requests: Sequence[UpdateRequest] | None = None) -> None:
        """Record each update waiting in storage (``requests`` when they were just read; one
        event each, at the end of the history) and run it (both backends)."""
        if requests is None:
            requests = self.storage.pending_updates(self.ref, self._applied_update_ids)
        for request in requests:
            event = self._record(
                UpdateAppliedEvent(
                    step=self.step,
                    ts=self._stamp(),
                    update_id=request.update_id,
                    name=request.name,
                    payload=request.payload,
                )
            )
            self._run_update(event)

    def _run_update(self, event: UpdateAppliedEvent) -> None:
        self._applied_update_ids.add(event.update_id)
        if event.name not in self._update_handlers:
            reply = Reply(
                AbiStatus.NOT_FOUND, f"no update handler named {event.name!r} is registered"
            )
        else:
            self._update_depth += 1
            try:
                reply = self.backend.call_export(event.name, event.payload)
            finally:
                self._update_depth -= 1
            if reply.status == AbiStatus.OK:
                require_storable(event.name, "the update's answer", reply.payload)
        self._applied_updates.append(AppliedUpdate(event.update_id, reply.status, reply.payload))

    # --- the end of the entry point ---

    def finish(self, reply: Reply) -> Outcome:
        """The entry point returned ``reply``: run defers (LIFO), then map it to an outcome."""
        status = status_from_byte(reply.status)
        if self._defers:
            label = status.label if status is not None else "error"
            for defer_id, export in reversed(self._defers):
                body: dict[str, Any] = {"defer_id": defer_id, "status": label}
                if reply.status == AbiStatus.OK:
                    body["result"] = json_value(reply.payload)
                else:
                    body["error"] = reply.payload
                outcome = self.backend.call_export(export, json.dumps(body))
                if outcome.status != AbiStatus.OK:
                    log.warning(
                        "defer %s of run %s returned status %s: %s",
                        export,
                        self.ref.run_id,
                        outcome.status,
                        outcome.payload[:200],
                    )
        leftover = self._peek_recorded()
        if leftover is not None:
            # The code ended where the history records more steps: it no longer does what
            # the recorded run did (the recorded calls' effects would be silently lost).
            ended = NondeterminismError(
                leftover.step, leftover.describe(), "no host function: the entry point returned"
            )
            return failed(ErrorCode.NONDETERMINISM, str(ended))
        if reply.status == AbiStatus.OK:
            fault = json_text_fault(reply.payload)
            if fault is not None:
                return failed(ErrorCode.GUEST_FAULT, f"the entry point's result {fault}")
            return Completed(reply.payload)
        # The run fails either way: an error message no database stores is kept readable.
        message = readable_text(reply.payload)
        if status is None:
            return failed(ErrorCode.ERROR, f"unknown status {reply.status}: {message}")
        return failed(ErrorCode(status.label), message)

    def result(self, outcome: Outcome, elapsed_s: float = 0.0) -> SegmentResult:
        replayed = sum(1 for _ in self._history[: self._pos])
        return SegmentResult(
            outcome=outcome,
            new_events=tuple(self._unflushed),
            recorded=tuple(self._recorded),
            query_state=dict(self.query_state),
            replayed_steps=replayed,
            next_step=self.step,
            applied_updates=tuple(self._applied_updates),
            consumed_signals=tuple(sorted(self._consumed_signals)),
            elapsed_s=elapsed_s,
        )
