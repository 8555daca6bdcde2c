"""The host operations that reach outside the run: durable calls (plain, with retry, with
heartbeat, write-ahead), sends and scheduled invocations, ``fetch`` and plugin calls.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import Any

from engine.determinism import derived_uuid
from engine.errors import FenceLost, Refused, StorageError
from engine.events import (
    CallEvent,
    DurableSendEvent,
    Event,
    FetchEvent,
    HeartbeatEvent,
    PluginCallEvent,
    ScheduleInvokeEvent,
    StreamChunkEvent,
    record_maker,
)
from engine.services import CallContext, CallResult, PluginCaller
from engine.session.replay import (
    OK_EMPTY,
    ReplayCore,
    Reply,
    event_fields,
    json_value,
    parse_string_list,
)
from engine.status import AbiStatus
from engine.storage import EnqueueInvocation

log = logging.getLogger("cleat.engine")

MAX_RETRY_ATTEMPTS = 100
# A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the same instance.
_new_tuple = tuple.__new__
# Built without the frozen dataclasses' per-field ``object.__setattr__`` (see record_maker):
# a durable call makes one of each.
_new_call_event = record_maker(CallEvent)
_new_context = record_maker(CallContext)


class CallOps(ReplayCore):
    """Calls and fetch: each answer comes from a service, is recorded, and is appended to
    storage at once (an external effect must not be repeated after a crash)."""

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
        ok = result.status == AbiStatus.OK
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
        if event.status == AbiStatus.OK:
            return _new_tuple(Reply, (AbiStatus.OK, event.response))
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
            result = CallResult(AbiStatus.OK, response)
        else:
            result = CallResult(
                AbiStatus.AMBIGUOUS,
                f"{intent.service}.{intent.operation} at step {intent.step} was dispatched but "
                "its outcome was never recorded (the worker stopped); check the service "
                f"with idempotency key {key}",
            )
        event = self._call_event(
            intent.step, intent.service, intent.operation, intent.request, result
        )
        event = CallEvent(**{**event_fields(event), "ts": max(intent.ts, self._vnow)})
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
        substrings = parse_string_list(non_retryable_errors) if non_retryable_errors else ()
        if substrings is None:
            return Reply(
                AbiStatus.PERMANENT, "non_retryable_errors must be a JSON array of strings"
            )
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
            if event.status == AbiStatus.OK:
                return Reply(AbiStatus.OK, event.response)
            if event.status == AbiStatus.PERMANENT or any(s in event.error for s in substrings):
                return Reply(AbiStatus.PERMANENT, event.error)
            if attempt >= attempts:
                return Reply(AbiStatus.RETRIES_EXHAUSTED, event.error)
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
        ok = result.status == AbiStatus.OK
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
        return Reply(AbiStatus.OK, event.invocation_id)

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
            ok = result.status == AbiStatus.OK
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
        if event.status == AbiStatus.OK:
            return Reply(AbiStatus.OK, event.response)
        return Reply(event.status, event.error)

    def plugin_call(self, plugin: str, function: str, input: str) -> Reply:
        event = self._match(PluginCallEvent, (plugin, function, input, False))
        if event is None:
            step = self.step
            caller = self._plugin_caller(plugin)
            result = self._io(lambda: self.services.plugins.call(plugin, function, input, caller))
            event = self._record_now(
                self._plugin_event(step, plugin, function, input, False, result)
            )
        return Reply(event.status, event.output if event.status == AbiStatus.OK else event.error)

    def _plugin_caller(self, plugin: str) -> PluginCaller:
        """Who calls (for the plugin guard) and the version deploy pinned."""
        return PluginCaller(
            tenant=self.ref.tenant_id,
            workflow=self.run.definition,
            version=self.run.plugin_versions.get(plugin),
        )

    def _plugin_event(
        self, step: int, plugin: str, function: str, input: str, streaming: bool, result: CallResult
    ) -> PluginCallEvent:
        ok = result.status == AbiStatus.OK
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
                    event.status, event.output if event.status == AbiStatus.OK else event.error
                )
            break
        self._guard_history_limit()
        # Fresh: record each chunk as it arrives; the final event appends them all at once.
        chunks: list[Any] = []
        started = time.monotonic()
        stream = self.services.plugins.stream(plugin, function, input, self._plugin_caller(plugin))
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
                    chunks.append(json_value(chunk))
                result = CallResult(AbiStatus.OK, json.dumps(chunks, separators=(",", ":")))
            except Exception as exc:
                result = CallResult(AbiStatus.ERROR, f"{type(exc).__name__}: {exc}")
        spent = time.monotonic() - started
        self.io_seconds += spent
        self.backend.refresh_deadline(spent)
        event = self._record_now(
            self._plugin_event(self.step, plugin, function, input, True, result)
        )
        return Reply(event.status, event.output if event.status == AbiStatus.OK else event.error)

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
