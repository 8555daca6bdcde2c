"""The execution session: record on first execution, replay from history afterwards.

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

Persistence: events of calls with external effects are appended to storage right after the
call (with everything before them, so the stored history stays a prefix); state changes in
our own database go through ``WorkflowStorage.apply`` together with their event; everything
else is returned in :class:`SegmentResult` for the fenced finalize at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from engine.config import EngineConfig
from engine.determinism import IdempotencyKeys, derived_uuid, random_i64, run_seed
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
    AcquireLockEvent,
    AwaitAllChildrenEvent,
    AwaitAnyChildEvent,
    AwaitChildEvent,
    AwaitPromiseEvent,
    AwaitSignalsEvent,
    CallEvent,
    CancellationCheckEvent,
    ChildWorkflowEvent,
    CodecError,
    ContinueAsNewEvent,
    CreatePromiseEvent,
    DeferEvent,
    DeleteCronEvent,
    DurableLogEvent,
    DurableSendEvent,
    EncodedEvent,
    Event,
    FetchEvent,
    HeartbeatEvent,
    ListCronsEvent,
    PluginCallEvent,
    PollChildEvent,
    PromiseRejectedEvent,
    PromiseResolvedEvent,
    ReleaseLockEvent,
    RunDetachedEvent,
    ScheduleCronEvent,
    ScheduleInvokeEvent,
    ScopeAcquiredEvent,
    SideEffectEvent,
    SignalReceivedEvent,
    SignalReplyEvent,
    SignalSentEvent,
    SleepEvent,
    StateMutationEvent,
    StreamChunkEvent,
    UpdateAppliedEvent,
    UpdateHandlerEvent,
    decode,
    describe_call,
    record_maker,
    verify,
)
from engine.outcomes import (
    AppliedUpdate,
    Completed,
    ContinueAsNew,
    ContinuedAsNew,
    Failed,
    Outcome,
    SegmentResult,
    Suspend,
    Suspended,
    WaitCondition,
    WaitKind,
    failed,
)
from engine.services import CallContext, CallResult, Services
from engine.status import Status, status_from_byte
from engine.storage import (
    AcquireLock,
    ChildOutcome,
    CreatePromise,
    CreateSchedule,
    DeleteSchedule,
    DeleteState,
    EnqueueInvocation,
    IncrState,
    Mutation,
    ReleaseLock,
    RunRef,
    SendSignal,
    SetState,
    SettlePromise,
    StartChild,
    StartDetached,
    WorkflowStorage,
)

log = logging.getLogger("cleat.engine")

MAX_RETRY_ATTEMPTS = 100
PARENT_CLOSE_POLICIES = ("terminate", "abandon", "request_cancel")
REPLY_SIGNAL_PREFIX = "__reply__/"


class Reply(NamedTuple):
    """The contents of a packed buffer: a status byte and a UTF-8 payload."""

    status: int
    payload: str = ""


OK_EMPTY = Reply(Status.OK, "")
# A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the same instance.
_new_tuple = tuple.__new__
# Built without the frozen dataclasses' per-field ``object.__setattr__`` (see record_maker):
# a durable call makes one of each.
_new_call_event = record_maker(CallEvent)
_new_context = record_maker(CallContext)


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


class GuestBackend(Protocol):
    """What the session needs from the module instance (core module or component)."""

    supports_reentry: bool

    def call_export(self, name: str, payload: str) -> Reply: ...

    def has_export(self, name: str) -> bool: ...

    def refresh_deadline(self, io_seconds: float) -> None:
        """Give back to the segment's deadline the time a host call spent waiting on I/O."""


E = TypeVar("E", bound=Event)


def _json_value(text: str) -> Any:
    """Embed a JSON document as a value, or the raw text when it is not JSON."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


def _parse_string_list(text: str) -> tuple[str, ...] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _child_json(run_id: str, outcome: ChildOutcome) -> dict[str, Any]:
    status = status_from_byte(outcome.status)
    entry: dict[str, Any] = {
        "run_id": run_id,
        "status": status.label if status is not None else str(outcome.status),
    }
    if outcome.status == Status.OK:
        entry["result"] = _json_value(outcome.result)
    else:
        entry["error"] = outcome.error
    return entry


class ExecutionSession:
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
        self.storage = storage
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

    def _record_now(self, event: E) -> E:
        """Record ``event`` and append it, with everything before it, to storage now."""
        pending: list[Event] = [*self._unflushed, event]
        self.storage.append_events(self.ref, pending)
        self._recorded.append(event)
        self._unflushed.clear()
        self.step = event.step + 1
        if event.ts > self._vnow:
            self._vnow = event.ts
        return event

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

    def _io(self, fn: Callable[[], CallResult]) -> CallResult:
        started = time.monotonic()
        try:
            return fn()
        except (FenceLost, WorkflowExit):
            raise
        except Exception as exc:  # a caller must not take the segment down
            log.exception("service call failed inside the host")
            return CallResult(Status.ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            spent = time.monotonic() - started
            self.io_seconds += spent
            if self._backend is not None:
                self._backend.refresh_deadline(spent)

    def _context(self, service: str, operation: str, step: int, attempt: int = 1) -> CallContext:
        ref = self.ref
        return _new_context(
            tenant_id=ref.tenant_id,
            workflow_id=ref.workflow_id,
            run_id=ref.run_id,
            step=step,
            service=service,
            operation=operation,
            idempotency_key=self._keys(step),
            attempt=attempt,
        )

    def _suspend(self, wait: WaitCondition) -> Suspend:
        return Suspend(wait)

    def _blocking_preamble(self) -> str | None:
        """At a fresh blocking call: hand pending updates to their handlers, then report a
        cancellation request (the call then returns CANCELLED)."""
        self._offer_updates()
        return self.storage.cancellation(self.ref)

    def _deadline(self, base: int, timeout_ms: int) -> int | None:
        return base + timeout_ms if timeout_ms >= 0 else None

    def _due(self, deadline: int | None) -> bool:
        return deadline is not None and self.clock() >= deadline

    # --- updates ---

    def _offer_updates(self) -> None:
        backend = self._backend
        if self._update_depth or backend is None or not backend.supports_reentry:
            return
        for request in self.storage.pending_updates(self.ref, self._applied_update_ids):
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
            reply = Reply(Status.NOT_FOUND, f"no update handler named {event.name!r} is registered")
        else:
            self._update_depth += 1
            try:
                reply = self.backend.call_export(event.name, event.payload)
            finally:
                self._update_depth -= 1
        self._applied_updates.append(AppliedUpdate(event.update_id, reply.status, reply.payload))

    # --- the end of the entry point ---

    def finish(self, reply: Reply) -> Outcome:
        """The entry point returned ``reply``: run defers (LIFO), then map it to an outcome."""
        status = status_from_byte(reply.status)
        if self._defers:
            label = status.label if status is not None else "error"
            for defer_id, export in reversed(self._defers):
                body: dict[str, Any] = {"defer_id": defer_id, "status": label}
                if reply.status == Status.OK:
                    body["result"] = _json_value(reply.payload)
                else:
                    body["error"] = reply.payload
                outcome = self.backend.call_export(export, json.dumps(body))
                if outcome.status != Status.OK:
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
        if reply.status == Status.OK:
            return Completed(reply.payload)
        if status is None:
            return failed(ErrorCode.ERROR, f"unknown status {reply.status}: {reply.payload}")
        return failed(ErrorCode(status.label), reply.payload)

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

    # =========================================================================================
    # Host operations. Strings arrive decoded; ``Reply`` is a packed buffer, ``int`` a scalar.
    # =========================================================================================

    # --- calls ---

    def durable_call(self, service: str, operation: str, request: str) -> Reply:
        event = self._match(CallEvent, (service, operation, request))
        if event is not None:
            if event.pending:
                return self._resolve_intent(event)
            return self._call_reply(event)
        step = self.step
        context = self._context(service, operation, step)
        write_ahead_ops = self.config.write_ahead_ops
        write_ahead = bool(write_ahead_ops) and f"{service}.{operation}" in write_ahead_ops
        if write_ahead:
            intent = CallEvent(
                step=step,
                ts=self._stamp(),
                service=service,
                operation=operation,
                request=request,
                pending=True,
            )
            self._record_now(intent)
        result = self._io(lambda: self.services.caller.call(service, operation, request, context))
        event = self._call_event(step, service, operation, request, result)
        if write_ahead:
            self.storage.complete_intent(self.ref, event)
            self._recorded[-1] = event
            if event.ts > self._vnow:
                self._vnow = event.ts
        else:
            self._record_now(event)
        return self._call_reply(event)

    def _call_event(
        self,
        step: int,
        service: str,
        operation: str,
        request: str,
        result: CallResult,
        attempt: int = 1,
    ) -> CallEvent:
        ok = result.status == Status.OK
        return _new_call_event(
            step=step,
            ts=self._stamp(),
            service=service,
            operation=operation,
            request=request,
            response=result.payload if ok else "",
            error="" if ok else result.payload,
            status=int(result.status),
            attempt=attempt,
        )

    @staticmethod
    def _call_reply(event: CallEvent | HeartbeatEvent) -> Reply:
        if event.status == Status.OK:
            return _new_tuple(Reply, (Status.OK, event.response))
        return Reply(event.status, event.error)

    def _resolve_intent(self, intent: CallEvent) -> Reply:
        """A write-ahead intent with no outcome: the worker died after dispatching the call.

        Ask the service's resolver what happened; when it cannot say, the outcome is
        AMBIGUOUS. Either way the outcome is written, so later replays agree."""
        key = self._keys(intent.step)
        response: str | None = None
        resolver = self.services.resolvers.get(intent.service)
        if resolver is not None:
            try:
                response = resolver(intent.service, intent.operation, key)
            except Exception:
                log.exception("ambiguity resolver for %s failed", intent.service)
        if response is not None:
            result = CallResult(Status.OK, response)
        else:
            result = CallResult(
                Status.AMBIGUOUS,
                f"{intent.service}.{intent.operation} at step {intent.step} was dispatched but "
                "its outcome was never recorded (the worker stopped); check the service "
                f"with idempotency key {key}",
            )
        event = self._call_event(
            intent.step, intent.service, intent.operation, intent.request, result
        )
        event = CallEvent(**{**_fields(event), "ts": max(intent.ts, self._vnow)})
        self.storage.complete_intent(self.ref, event)
        return self._call_reply(event)

    def durable_call_with_retry(
        self,
        service: str,
        operation: str,
        request: str,
        max_attempts: int,
        initial_interval_ms: int,
        backoff_coefficient_x100: int,
        max_interval_ms: int,
        non_retryable_errors: str,
    ) -> Reply:
        substrings = _parse_string_list(non_retryable_errors) if non_retryable_errors else ()
        if substrings is None:
            return Reply(Status.PERMANENT, "non_retryable_errors must be a JSON array of strings")
        attempts = max(1, min(int(max_attempts), MAX_RETRY_ATTEMPTS))
        interval = max(0, int(initial_interval_ms))
        coefficient = max(100, int(backoff_coefficient_x100)) / 100
        first_step: int | None = None
        attempt = 1
        while True:
            event = self._match(CallEvent, (service, operation, request))
            if event is None:
                step = self.step
                if first_step is None:
                    first_step = step
                context = self._context(service, operation, first_step, attempt)
                result = self._io(
                    functools.partial(
                        self.services.caller.call, service, operation, request, context
                    )
                )
                event = self._record_now(
                    self._call_event(step, service, operation, request, result, attempt)
                )
            elif first_step is None:
                first_step = event.step
            if event.status == Status.OK:
                return Reply(Status.OK, event.response)
            if event.status == Status.PERMANENT or any(s in event.error for s in substrings):
                return Reply(Status.PERMANENT, event.error)
            if attempt >= attempts:
                return Reply(Status.RETRIES_EXHAUSTED, event.error)
            delay = interval * coefficient ** (attempt - 1)
            if max_interval_ms > 0:
                delay = min(delay, max_interval_ms)
            self._timer(int(delay), "retry")
            attempt += 1

    def durable_call_with_heartbeat(
        self, service: str, operation: str, request: str, heartbeat_interval_ms: int
    ) -> Reply:
        interval_ms = int(heartbeat_interval_ms)
        event = self._match(HeartbeatEvent, (service, operation, request, interval_ms))
        if event is not None:
            return self._call_reply(event)
        step = self.step
        context = self._context(service, operation, step)
        stop = threading.Event()
        beats = 0
        lost = False

        def keep_alive() -> None:
            nonlocal beats, lost
            period = max(interval_ms, 100) / 1000
            while not stop.wait(period):
                try:
                    if not self.storage.heartbeat(self.ref):
                        lost = True
                        return
                    beats += 1
                except Exception:
                    log.exception("heartbeat failed during a long call")

        ticker = threading.Thread(target=keep_alive, name="cleat-call-heartbeat", daemon=True)
        ticker.start()
        try:
            result = self._io(
                lambda: self.services.caller.call(service, operation, request, context)
            )
        finally:
            stop.set()
            ticker.join()
        if lost:
            raise FenceLost(f"run {self.ref.run_id} lost its lease during a heartbeat call")
        ok = result.status == Status.OK
        event = self._record_now(
            HeartbeatEvent(
                step=step,
                ts=self._stamp(),
                service=service,
                operation=operation,
                request=request,
                interval_ms=interval_ms,
                response=result.payload if ok else "",
                error="" if ok else result.payload,
                status=int(result.status),
                beats=beats,
            )
        )
        return self._call_reply(event)

    def durable_send(self, service: str, operation: str, request: str) -> Reply:
        event = self._match(DurableSendEvent, (service, operation, request))
        if event is None:
            self._enqueue(service, operation, request, 0)
        return OK_EMPTY

    def durable_schedule_invoke(
        self, service: str, operation: str, request: str, delay_ms: int
    ) -> Reply:
        event = self._match(ScheduleInvokeEvent, (service, operation, request, int(delay_ms)))
        if event is None:
            event = self._enqueue(service, operation, request, max(0, int(delay_ms)))
        return Reply(Status.OK, event.invocation_id)

    def _enqueue(self, service: str, operation: str, request: str, delay_ms: int) -> Any:
        step = self.step
        invocation_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "invocation")
        mutation = EnqueueInvocation(
            invocation_id=invocation_id,
            service=service,
            operation=operation,
            request=request,
            idempotency_key=self._keys(step),
            deliver_at_ms=self.clock() + delay_ms,
        )
        ts = self._stamp()
        if delay_ms:

            def make(_: Any) -> Event:
                return ScheduleInvokeEvent(
                    step=step,
                    ts=ts,
                    service=service,
                    operation=operation,
                    request=request,
                    delay_ms=delay_ms,
                    invocation_id=invocation_id,
                )
        else:

            def make(_: Any) -> Event:
                return DurableSendEvent(
                    step=step,
                    ts=ts,
                    service=service,
                    operation=operation,
                    request=request,
                    invocation_id=invocation_id,
                )

        def refused(exc: Refused) -> Event:
            raise StorageError(f"the invocation queue refused a call: {exc.message}")

        return self._apply(mutation, make, refused)

    def fetch(self, method: str, url: str, headers: str, body: str) -> Reply:
        event = self._match(FetchEvent, (method, url, headers, body))
        if event is None:
            step = self.step
            result = self._io(lambda: self.services.fetcher.fetch(method, url, headers, body))
            ok = result.status == Status.OK
            event = self._record_now(
                FetchEvent(
                    step=step,
                    ts=self._stamp(),
                    method=method,
                    url=url,
                    headers=headers,
                    body=body,
                    response=result.payload if ok else "",
                    error="" if ok else result.payload,
                    status=int(result.status),
                )
            )
        if event.status == Status.OK:
            return Reply(Status.OK, event.response)
        return Reply(event.status, event.error)

    def plugin_call(self, plugin: str, function: str, input: str) -> Reply:
        event = self._match(PluginCallEvent, (plugin, function, input, False))
        if event is None:
            step = self.step
            result = self._io(lambda: self.services.plugins.call(plugin, function, input))
            event = self._record_now(
                self._plugin_event(step, plugin, function, input, False, result)
            )
        return Reply(event.status, event.output if event.status == Status.OK else event.error)

    def _plugin_event(
        self, step: int, plugin: str, function: str, input: str, streaming: bool, result: CallResult
    ) -> PluginCallEvent:
        ok = result.status == Status.OK
        return PluginCallEvent(
            step=step,
            ts=self._stamp(),
            plugin=plugin,
            function=function,
            input=input,
            streaming=streaming,
            output=result.payload if ok else "",
            error="" if ok else result.payload,
            status=int(result.status),
        )

    def plugin_call_streaming(self, plugin: str, function: str, input: str) -> Reply:
        # Replay: the recorded chunks, then the call's own event.
        index = 0
        while self.replaying:
            recorded = self._peek_recorded()
            if type(recorded) is StreamChunkEvent:
                self._match(StreamChunkEvent, (plugin, function, index))
                index += 1
                continue
            event = self._match(PluginCallEvent, (plugin, function, input, True))
            if event is not None:
                return Reply(
                    event.status, event.output if event.status == Status.OK else event.error
                )
            break
        self._guard_history_limit()
        # Fresh: record each chunk as it arrives; the final event appends them all at once.
        chunks: list[Any] = []
        started = time.monotonic()
        stream = self.services.plugins.stream(plugin, function, input)
        if isinstance(stream, CallResult):
            result = stream
        else:
            try:
                for chunk in stream:
                    self._record(
                        StreamChunkEvent(
                            step=self.step,
                            ts=self._stamp(),
                            plugin=plugin,
                            function=function,
                            index=len(chunks),
                            chunk=chunk,
                        )
                    )
                    chunks.append(_json_value(chunk))
                result = CallResult(Status.OK, json.dumps(chunks, separators=(",", ":")))
            except Exception as exc:
                result = CallResult(Status.ERROR, f"{type(exc).__name__}: {exc}")
        spent = time.monotonic() - started
        self.io_seconds += spent
        self.backend.refresh_deadline(spent)
        event = self._record_now(
            self._plugin_event(self.step, plugin, function, input, True, result)
        )
        return Reply(event.status, event.output if event.status == Status.OK else event.error)

    # --- time, randomness, identity, logging ---

    def now(self) -> int:
        return self._vnow

    def random(self) -> int:
        value = random_i64(self._seed, self._random_counter)
        self._random_counter += 1
        return value

    def random_bytes(self, length: int) -> bytes:
        """For wasi:random: consumes one position of the same stream as ``random``."""
        from engine.determinism import random_bytes

        value = random_bytes(self._seed, self._random_counter, length)
        self._random_counter += 1
        return value

    def uuid(self, seed: str) -> Reply:
        return Reply(
            Status.OK, derived_uuid(self.ref.workflow_id, self.ref.run_id, self.step, seed)
        )

    def side_effect(self, value: str) -> Reply:
        event = self._match(SideEffectEvent, ())
        if event is None:
            event = self._record(SideEffectEvent(step=self.step, ts=self._stamp(), value=value))
        return Reply(Status.OK, event.value)

    def workflow_id(self) -> Reply:
        return Reply(Status.OK, self.ref.workflow_id)

    def run_id(self) -> Reply:
        return Reply(Status.OK, self.ref.run_id)

    def version(self) -> int:
        return self.run.version

    def min_version(self) -> int:
        return self.run.min_version

    def durable_log(self, level: int, message: str) -> int:
        level = min(max(int(level), 0), 3)
        if self._match(DurableLogEvent, (level, message)) is None:
            self._record(
                DurableLogEvent(step=self.step, ts=self._stamp(), level=level, message=message)
            )
            log.log(
                (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)[level],
                "workflow %s run %s: %s",
                self.ref.workflow_id,
                self.ref.run_id,
                message,
            )
        return 0

    def json_parse(self, text: str) -> Reply:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return Reply(Status.PERMANENT, f"invalid JSON: {exc}")
        return Reply(
            Status.OK, json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        )

    def json_stringify(self, text: str) -> Reply:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return Reply(Status.PERMANENT, f"invalid JSON: {exc}")
        return Reply(Status.OK, json.dumps(value, separators=(",", ":"), ensure_ascii=False))

    # --- timers ---

    def durable_sleep(self, duration_ms: int) -> int:
        return self._timer(max(0, int(duration_ms)), "sleep")

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
                        status=Status.CANCELLED,
                    )
                )
                return int(Status.CANCELLED)
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

    # --- signals ---

    def durable_await_signals(self, names_json: str, timeout_ms: int) -> Reply:
        names = _parse_string_list(names_json)
        if not names:
            return Reply(Status.PERMANENT, "signal names must be a non-empty JSON array of strings")
        return self._await_signals(names, int(timeout_ms), WaitKind.SIGNALS)

    def _await_signals(self, names: tuple[str, ...], timeout_ms: int, kind: WaitKind) -> Reply:
        base = self._vnow
        event = self._match(AwaitSignalsEvent, (names, timeout_ms))
        if event is None:
            event = self._await_signals_fresh(base, names, timeout_ms, kind)
        else:
            if event.signal_id:
                self._consumed_signals.add(event.signal_id)
        if event.status != Status.OK:
            return Reply(event.status, "")
        if kind is WaitKind.SIGNAL_REPLY:
            return Reply(Status.OK, event.payload)
        body: dict[str, Any] = {"name": event.name, "payload": _json_value(event.payload)}
        if event.correlation_id:
            body["correlation_id"] = event.correlation_id
        return Reply(Status.OK, json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    def _await_signals_fresh(
        self, base: int, names: tuple[str, ...], timeout_ms: int, kind: WaitKind
    ) -> AwaitSignalsEvent:
        def outcome(status: Status, **found: Any) -> AwaitSignalsEvent:
            return self._record(
                AwaitSignalsEvent(
                    step=self.step,
                    ts=self._stamp(),
                    names=names,
                    timeout_ms=timeout_ms,
                    status=int(status),
                    **found,
                )
            )

        if self._blocking_preamble() is not None:
            return outcome(Status.CANCELLED)
        signal = self.storage.next_signal(self.ref, names, self._consumed_signals)
        if signal is not None:
            self._consumed_signals.add(signal.signal_id)
            return outcome(
                Status.OK,
                name=signal.name,
                payload=signal.payload,
                signal_id=signal.signal_id,
                correlation_id=signal.correlation_id,
            )
        deadline = self._deadline(base, timeout_ms)
        if self._due(deadline):
            return outcome(Status.TIMEOUT)
        raise self._suspend(WaitCondition(kind, wake_at_ms=deadline, signals=names))

    def poll_signal(self, name: str) -> Reply:
        event = self._match(SignalReceivedEvent, (name,))
        if event is None:
            signal = self.storage.next_signal(self.ref, (name,), self._consumed_signals)
            if signal is None:
                event = self._record(
                    SignalReceivedEvent(
                        step=self.step, ts=self._stamp(), name=name, status=Status.NOT_FOUND
                    )
                )
            else:
                event = self._record(
                    SignalReceivedEvent(
                        step=self.step,
                        ts=self._stamp(),
                        name=name,
                        payload=signal.payload,
                        signal_id=signal.signal_id,
                    )
                )
        if event.signal_id:
            self._consumed_signals.add(event.signal_id)
        if event.status != Status.OK:
            return Reply(event.status, "")
        return Reply(Status.OK, event.payload)

    def poll_cancellation(self) -> Reply:
        event = self._match(CancellationCheckEvent, ())
        if event is None:
            reason = self.storage.cancellation(self.ref)
            event = self._record(
                CancellationCheckEvent(
                    step=self.step,
                    ts=self._stamp(),
                    reason=reason or "",
                    status=Status.OK if reason is not None else Status.NOT_FOUND,
                )
            )
        if event.status == Status.OK:
            return Reply(Status.OK, event.reason)
        return Reply(event.status, "")

    def signal_workflow(self, target_id: str, name: str, payload: str) -> Reply:
        event = self._send_signal(target_id, name, payload, "")
        return Reply(event.status, "")

    def _send_signal(
        self, target_id: str, name: str, payload: str, correlation_id: str
    ) -> SignalSentEvent:
        event = self._match(SignalSentEvent, (target_id, name, payload))
        if event is not None:
            return event
        step, ts = self.step, self._stamp()

        def make(_: Any) -> SignalSentEvent:
            return SignalSentEvent(
                step=step,
                ts=ts,
                target_id=target_id,
                name=name,
                payload=payload,
                correlation_id=correlation_id,
            )

        def refused(exc: Refused) -> SignalSentEvent:
            return SignalSentEvent(
                step=step,
                ts=ts,
                target_id=target_id,
                name=name,
                payload=payload,
                correlation_id=correlation_id,
                status=exc.status,
            )

        return self._apply(SendSignal(target_id, name, payload, correlation_id), make, refused)

    def send_signal_and_wait(
        self, target_id: str, name: str, payload: str, timeout_ms: int
    ) -> Reply:
        correlation_id = f"{self.ref.run_id}/{self.step}"
        sent = self._send_signal(target_id, name, payload, correlation_id)
        if sent.status != Status.OK:
            return Reply(sent.status, f"signal {name!r} could not be delivered to {target_id}")
        reply_name = REPLY_SIGNAL_PREFIX + sent.correlation_id
        return self._await_signals((reply_name,), int(timeout_ms), WaitKind.SIGNAL_REPLY)

    def reply_to_signal(self, correlation_id: str, response: str) -> Reply:
        event = self._match(SignalReplyEvent, (correlation_id, response))
        if event is None:
            sender, _, step_text = correlation_id.rpartition("/")
            step, ts = self.step, self._stamp()
            if not sender or not step_text.isdigit():
                event = self._record(
                    SignalReplyEvent(
                        step=step,
                        ts=ts,
                        correlation_id=correlation_id,
                        response=response,
                        status=Status.NOT_FOUND,
                    )
                )
            else:
                event = self._apply(
                    SendSignal(sender, REPLY_SIGNAL_PREFIX + correlation_id, response),
                    lambda _: SignalReplyEvent(
                        step=step, ts=ts, correlation_id=correlation_id, response=response
                    ),
                    lambda exc: SignalReplyEvent(
                        step=step,
                        ts=ts,
                        correlation_id=correlation_id,
                        response=response,
                        status=exc.status,
                    ),
                )
        return Reply(event.status, "")

    # --- promises ---

    def create_promise(self, name: str) -> Reply:
        event = self._match(CreatePromiseEvent, (name,))
        if event is None:
            step, ts = self.step, self._stamp()
            promise_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "promise")

            def refused(exc: Refused) -> CreatePromiseEvent:
                raise StorageError(f"cannot create promise {name!r}: {exc.message}")

            event = self._apply(
                CreatePromise(promise_id, name),
                lambda _: CreatePromiseEvent(step=step, ts=ts, name=name, promise_id=promise_id),
                refused,
            )
        return Reply(Status.OK, event.promise_id)

    def await_promise(self, promise_id: str, timeout_ms: int) -> Reply:
        base = self._vnow
        timeout_ms = int(timeout_ms)
        event = self._match(AwaitPromiseEvent, (promise_id, timeout_ms))
        if event is None:

            def outcome(status: Status, value: str = "", error: str = "") -> AwaitPromiseEvent:
                return self._record(
                    AwaitPromiseEvent(
                        step=self.step,
                        ts=self._stamp(),
                        promise_id=promise_id,
                        timeout_ms=timeout_ms,
                        status=int(status),
                        value=value,
                        error=error,
                    )
                )

            if self._blocking_preamble() is not None:
                event = outcome(Status.CANCELLED)
            else:
                state = self.storage.promise_state(self.ref, promise_id)
                deadline = self._deadline(base, timeout_ms)
                if state is None:
                    event = outcome(Status.NOT_FOUND, error=f"no promise {promise_id}")
                elif state.status == "resolved":
                    event = outcome(Status.OK, value=state.value)
                elif state.status == "rejected":
                    event = outcome(Status.ERROR, error=state.error)
                elif self._due(deadline):
                    event = outcome(Status.TIMEOUT)
                else:
                    raise self._suspend(
                        WaitCondition(WaitKind.PROMISE, wake_at_ms=deadline, promise_id=promise_id)
                    )
        if event.status == Status.OK:
            return Reply(Status.OK, event.value)
        return Reply(event.status, event.error)

    def resolve_promise(self, promise_id: str, value: str) -> Reply:
        event = self._match(PromiseResolvedEvent, (promise_id, value))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                SettlePromise(promise_id, value=value),
                lambda _: PromiseResolvedEvent(
                    step=step, ts=ts, promise_id=promise_id, value=value
                ),
                lambda exc: PromiseResolvedEvent(
                    step=step, ts=ts, promise_id=promise_id, value=value, status=exc.status
                ),
            )
        return Reply(event.status, "")

    def reject_promise(self, promise_id: str, message: str) -> Reply:
        event = self._match(PromiseRejectedEvent, (promise_id, message))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                SettlePromise(promise_id, error=message, rejected=True),
                lambda _: PromiseRejectedEvent(
                    step=step, ts=ts, promise_id=promise_id, message=message
                ),
                lambda exc: PromiseRejectedEvent(
                    step=step, ts=ts, promise_id=promise_id, message=message, status=exc.status
                ),
            )
        return Reply(event.status, "")

    # --- updates, queries, defers ---

    def register_update_handler(self, export_name: str) -> int:
        if not self.backend.has_export(export_name):
            raise GuestFault("register_update_handler", f"the module has no export {export_name!r}")
        if self._match(UpdateHandlerEvent, (export_name,)) is None:
            self._record(
                UpdateHandlerEvent(step=self.step, ts=self._stamp(), export_name=export_name)
            )
        self._update_handlers.add(export_name)
        return 0

    def set_query_state(self, key: str, value: str) -> int:
        self.query_state[key] = value
        return 0

    def durable_defer(self, export_name: str) -> Reply:
        if not self.backend.has_export(export_name):
            raise GuestFault("durable_defer", f"the module has no export {export_name!r}")
        event = self._match(DeferEvent, (export_name,))
        if event is None:
            defer_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, self.step, "defer")
            event = self._record(
                DeferEvent(
                    step=self.step, ts=self._stamp(), export_name=export_name, defer_id=defer_id
                )
            )
        self._defers.append((event.defer_id, export_name))
        return Reply(Status.OK, event.defer_id)

    # --- children, continue-as-new, detached runs ---

    def child_workflow(self, name: str, input: str) -> Reply:
        return self.child_workflow_with_options(name, input, 0, 0, "")

    def child_workflow_with_options(
        self, name: str, input: str, version: int, priority: int, parent_close_policy: str
    ) -> Reply:
        policy = parent_close_policy or "terminate"
        if policy not in PARENT_CLOSE_POLICIES:
            return Reply(
                Status.PERMANENT,
                f"parent_close_policy must be one of {', '.join(PARENT_CLOSE_POLICIES)}, "
                f"not {policy!r}",
            )
        version = max(0, int(version))
        event = self._match(ChildWorkflowEvent, (name, input, version, policy))
        if event is None:
            step, ts = self.step, self._stamp()
            run_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "child")

            def make(child_id: Any) -> ChildWorkflowEvent:
                return ChildWorkflowEvent(
                    step=step,
                    ts=ts,
                    name=name,
                    input=input,
                    version=version,
                    priority=int(priority),
                    parent_close_policy=policy,
                    run_id=str(child_id),
                )

            def refused(exc: Refused) -> ChildWorkflowEvent:
                return ChildWorkflowEvent(
                    step=step,
                    ts=ts,
                    name=name,
                    input=input,
                    version=version,
                    priority=int(priority),
                    parent_close_policy=policy,
                    status=exc.status,
                    error=exc.message,
                )

            mutation = StartChild(
                run_id, name, input, version, int(priority), policy, self.run.version
            )
            event = self._apply(mutation, make, refused)
        if event.status != Status.OK:
            return Reply(event.status, event.error)
        return Reply(Status.OK, event.run_id)

    def await_child(self, run_id: str) -> Reply:
        event = self._match(AwaitChildEvent, (run_id,))
        if event is None:
            if self._blocking_preamble() is not None:
                outcome = ChildOutcome(Status.CANCELLED, error="cancelled while awaiting a child")
            else:
                found = self.storage.child_outcome(self.ref, run_id)
                if found is None:
                    raise self._suspend(WaitCondition(WaitKind.CHILD, run_ids=(run_id,)))
                outcome = found
            event = self._record(
                AwaitChildEvent(
                    step=self.step,
                    ts=self._stamp(),
                    run_id=run_id,
                    status=outcome.status,
                    result=outcome.result,
                    error=outcome.error,
                )
            )
        if event.status == Status.OK:
            return Reply(Status.OK, event.result)
        return Reply(event.status, event.error)

    def poll_child(self, run_id: str) -> Reply:
        event = self._match(PollChildEvent, (run_id,))
        if event is None:
            found = self.storage.child_outcome(self.ref, run_id)
            outcome = found or ChildOutcome(Status.NOT_FOUND)
            event = self._record(
                PollChildEvent(
                    step=self.step,
                    ts=self._stamp(),
                    run_id=run_id,
                    status=outcome.status,
                    result=outcome.result,
                    error=outcome.error,
                )
            )
        if event.status == Status.OK:
            return Reply(Status.OK, event.result)
        return Reply(event.status, event.error)

    def await_all_children(self, run_ids_json: str) -> Reply:
        run_ids = _parse_string_list(run_ids_json)
        if run_ids is None:
            return Reply(Status.PERMANENT, "run_ids must be a JSON array of strings")
        event = self._match(AwaitAllChildrenEvent, (run_ids,))
        if event is None:
            if self._blocking_preamble() is not None:
                event = self._record(
                    AwaitAllChildrenEvent(
                        step=self.step, ts=self._stamp(), run_ids=run_ids, status=Status.CANCELLED
                    )
                )
            else:
                outcomes = [(rid, self.storage.child_outcome(self.ref, rid)) for rid in run_ids]
                waiting = tuple(rid for rid, o in outcomes if o is None)
                if waiting:
                    raise self._suspend(WaitCondition(WaitKind.CHILDREN, run_ids=waiting))
                body = [_child_json(rid, o) for rid, o in outcomes if o is not None]
                event = self._record(
                    AwaitAllChildrenEvent(
                        step=self.step,
                        ts=self._stamp(),
                        run_ids=run_ids,
                        outcomes=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
                    )
                )
        return Reply(event.status, event.outcomes)

    def await_any_child(self, run_ids_json: str) -> Reply:
        run_ids = _parse_string_list(run_ids_json)
        if not run_ids:
            return Reply(Status.PERMANENT, "run_ids must be a non-empty JSON array of strings")
        event = self._match(AwaitAnyChildEvent, (run_ids,))
        if event is None:
            if self._blocking_preamble() is not None:
                event = self._record(
                    AwaitAnyChildEvent(
                        step=self.step, ts=self._stamp(), run_ids=run_ids, status=Status.CANCELLED
                    )
                )
            else:
                for rid in run_ids:
                    found = self.storage.child_outcome(self.ref, rid)
                    if found is not None:
                        body = _child_json(rid, found)
                        event = self._record(
                            AwaitAnyChildEvent(
                                step=self.step,
                                ts=self._stamp(),
                                run_ids=run_ids,
                                outcome=json.dumps(body, separators=(",", ":"), ensure_ascii=False),
                            )
                        )
                        break
                else:
                    raise self._suspend(WaitCondition(WaitKind.ANY_CHILD, run_ids=run_ids))
        return Reply(event.status, event.outcome)

    def continue_as_new(self, new_input: str) -> int:
        return self.continue_as_new_with_version(new_input, 0)

    def continue_as_new_with_version(self, new_input: str, version: int) -> int:
        version = max(0, int(version))
        if self._match(ContinueAsNewEvent, (new_input, version)) is None:
            self._record(
                ContinueAsNewEvent(
                    step=self.step, ts=self._stamp(), new_input=new_input, new_version=version
                )
            )
        raise ContinueAsNew(new_input, version)

    def run_detached(self, name: str, input: str) -> Reply:
        event = self._match(RunDetachedEvent, (name, input))
        if event is None:
            step, ts = self.step, self._stamp()
            run_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "detached")
            event = self._apply(
                StartDetached(run_id, name, input),
                lambda rid: RunDetachedEvent(
                    step=step, ts=ts, name=name, input=input, run_id=str(rid)
                ),
                lambda exc: RunDetachedEvent(
                    step=step, ts=ts, name=name, input=input, status=exc.status, error=exc.message
                ),
            )
        if event.status != Status.OK:
            return Reply(event.status, event.error)
        return Reply(Status.OK, event.run_id)

    # --- state, scopes, locks ---

    def _state_event(
        self, op: str, key: str, value: str = "", delta: int = 0, **answer: Any
    ) -> Any:
        return StateMutationEvent(
            step=self.step,
            ts=self._stamp(),
            op=op,
            key=key,
            value=value,
            delta=delta,
            scope=self.scope,
            **answer,
        )

    def set_state(self, key: str, value: str) -> int:
        if self._match(StateMutationEvent, ("set", key, value, 0)) is None:
            event = self._state_event("set", key, value)
            self._apply(SetState(self.scope, key, value), lambda _: event, _never_refused)
        return 0

    def get_state(self, key: str) -> Reply:
        event = self._match(StateMutationEvent, ("get", key, "", 0))
        if event is None:
            value = self.storage.get_state(self.ref, self.scope, key)
            event = self._record(
                self._state_event("get", key, result=value or "", found=value is not None)
            )
        if not event.found:
            return Reply(Status.NOT_FOUND, "")
        return Reply(Status.OK, event.result)

    def delete_state(self, key: str) -> int:
        event = self._match(StateMutationEvent, ("delete", key, "", 0))
        if event is None:
            step_event = self._state_event("delete", key)
            event = self._apply(
                DeleteState(self.scope, key),
                lambda existed: StateMutationEvent(
                    **{**_fields(step_event), "found": bool(existed)}
                ),
                _never_refused,
            )
        return 1 if event.found else 0

    def incr_state(self, key: str, delta: int) -> int:
        delta = int(delta)
        event = self._match(StateMutationEvent, ("incr", key, "", delta))
        if event is None:
            step_event = self._state_event("incr", key, delta=delta)

            def refused(exc: Refused) -> StateMutationEvent:
                raise GuestFault("incr_state", exc.message)

            event = self._apply(
                IncrState(self.scope, key, delta),
                lambda new: StateMutationEvent(**{**_fields(step_event), "result": str(new)}),
                refused,
            )
        return int(event.result)

    def has_state(self, key: str) -> int:
        event = self._match(StateMutationEvent, ("has", key, "", 0))
        if event is None:
            found = self.storage.get_state(self.ref, self.scope, key) is not None
            event = self._record(self._state_event("has", key, found=found))
        return 1 if event.found else 0

    def list_state(self, prefix: str) -> Reply:
        event = self._match(StateMutationEvent, ("list", prefix, "", 0))
        if event is None:
            keys = sorted(self.storage.list_state(self.ref, self.scope, prefix))
            event = self._record(self._state_event("list", prefix, result=_compact(keys)))
        return Reply(Status.OK, event.result)

    def set_scope(self, object_type: str, instance_key: str) -> Reply:
        previous = self._scope_json()
        if self._match(ScopeAcquiredEvent, (object_type, instance_key)) is None:
            self._record(
                ScopeAcquiredEvent(
                    step=self.step,
                    ts=self._stamp(),
                    object_type=object_type,
                    instance_key=instance_key,
                    previous=previous,
                )
            )
        if object_type:
            self._scope = f"obj:{object_type}:{instance_key}"
            self._scope_object = (object_type, instance_key)
        else:
            self._scope = ""
            self._scope_object = ("", "")
        return Reply(Status.OK, previous)

    def get_scope(self) -> Reply:
        return Reply(Status.OK, self._scope_json())

    def _scope_json(self) -> str:
        return _compact(
            {"object_type": self._scope_object[0], "instance_key": self._scope_object[1]}
        )

    def acquire_lock(self, key: str, ttl_ms: int) -> int:
        ttl_ms = max(0, int(ttl_ms))
        event = self._match(AcquireLockEvent, (key, ttl_ms))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                AcquireLock(key, self.ref.workflow_id, ttl_ms, self.clock()),
                lambda acquired: AcquireLockEvent(
                    step=step, ts=ts, key=key, ttl_ms=ttl_ms, acquired=bool(acquired)
                ),
                _never_refused,
            )
        return 1 if event.acquired else 0

    def release_lock(self, key: str) -> int:
        if self._match(ReleaseLockEvent, (key,)) is None:
            step, ts = self.step, self._stamp()
            self._apply(
                ReleaseLock(key, self.ref.workflow_id),
                lambda _: ReleaseLockEvent(step=step, ts=ts, key=key),
                _never_refused,
            )
        return 0

    # --- schedules ---

    def schedule_cron(self, workflow_name: str, cron: str, timezone: str, input: str) -> Reply:
        event = self._match(ScheduleCronEvent, (workflow_name, cron, timezone, input))
        if event is None:
            step, ts = self.step, self._stamp()
            schedule_id = derived_uuid(self.ref.workflow_id, self.ref.run_id, step, "schedule")
            base = ScheduleCronEvent(
                step=step,
                ts=ts,
                workflow_name=workflow_name,
                cron=cron,
                timezone=timezone,
                input=input,
            )
            event = self._apply(
                CreateSchedule(schedule_id, workflow_name, cron, timezone or "UTC", input),
                lambda sid: dataclasses.replace(base, schedule_id=str(sid)),
                lambda exc: dataclasses.replace(base, status=exc.status, error=exc.message),
            )
        if event.status != Status.OK:
            return Reply(event.status, event.error)
        return Reply(Status.OK, event.schedule_id)

    def delete_cron(self, schedule_id: str) -> Reply:
        event = self._match(DeleteCronEvent, (schedule_id,))
        if event is None:
            step, ts = self.step, self._stamp()
            event = self._apply(
                DeleteSchedule(schedule_id),
                lambda _: DeleteCronEvent(step=step, ts=ts, schedule_id=schedule_id),
                lambda exc: DeleteCronEvent(
                    step=step, ts=ts, schedule_id=schedule_id, status=exc.status
                ),
            )
        return Reply(event.status, "")

    def list_crons(self) -> Reply:
        event = self._match(ListCronsEvent, ())
        if event is None:
            schedules = self.storage.list_schedules(self.ref)
            event = self._record(
                ListCronsEvent(
                    step=self.step,
                    ts=self._stamp(),
                    result=json.dumps(schedules, separators=(",", ":"), ensure_ascii=False),
                )
            )
        return Reply(Status.OK, event.result)


def _compact(value: Any) -> str:
    """Every JSON answer the host builds is compact, keys in insertion order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _fields(event: Event) -> dict[str, Any]:
    return {name: getattr(event, name) for name in ("step", "ts", *type(event).KEYS)}


def _never_refused(exc: Refused) -> Any:
    raise StorageError(f"storage refused an operation it should accept: {exc.message}")


# The outcome types live in engine.outcomes; they are re-exported here for the stores and
# the testing environment, which import them from the session.
__all__ = [
    "OK_EMPTY",
    "AppliedUpdate",
    "Completed",
    "ContinueAsNew",
    "ContinuedAsNew",
    "ExecutionSession",
    "Failed",
    "GuestBackend",
    "Outcome",
    "Reply",
    "RunInfo",
    "SegmentResult",
    "Suspend",
    "Suspended",
    "WaitCondition",
    "WaitKind",
    "failed",
]
