"""The host operations that reach outside the run: durable calls (plain, with retry, with
heartbeat, write-ahead, several at once), sends and scheduled invocations, ``fetch`` and
plugin calls.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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
from engine.faults import crash_point
from engine.outcomes import WaitCondition, WaitKind
from engine.services import CallContext, CallResult, PluginCaller, TaskCall, TaskService
from engine.session.replay import (
    OK_EMPTY,
    ReplayCore,
    Reply,
    event_fields,
    json_value,
    parse_string_list,
    service_result,
)
from engine.status import AbiStatus
from engine.storage import DispatchTask, EnqueueInvocation, TaskCallRecord
from engine.tracing import DURABLE_CALL, FETCH, traced_call

log = logging.getLogger("cleat.engine")

MAX_RETRY_ATTEMPTS = 100
# Calls one durable_call_many may carry (like max_attempts: a bound on one host call's work).
MAX_BATCH_CALLS = 100
# A task that could not be published (the broker away) is tried again this much later.
TASK_SEND_RETRY_MS = 2_000
# A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the same instance.
_new_tuple = tuple.__new__
# Built without the frozen dataclasses' per-field ``object.__setattr__`` (see record_maker):
# a durable call makes one of each.
_new_call_event = record_maker(CallEvent)
_new_context = record_maker(CallContext)

BatchItem = tuple[str, str, str]  # service, operation, request (JSON text)


def parse_call_batch(requests: str) -> list[BatchItem] | str:
    """The calls of a ``durable_call_many`` request: a JSON array of
    ``{"service", "operation", "request"}`` objects, every value a string (``request`` is
    the request JSON as ``durable_call`` takes it). A message saying what is wrong, else."""
    try:
        items = json.loads(requests)
    except ValueError:
        return "durable_call_many: the requests are not valid JSON"
    if not isinstance(items, list):
        return "durable_call_many: the requests must be a JSON array of calls"
    if len(items) > MAX_BATCH_CALLS:
        return f"durable_call_many: {len(items)} calls; at most {MAX_BATCH_CALLS} per batch"
    calls: list[BatchItem] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            return f"durable_call_many: call {index} must be an object"
        values = []
        for key in ("service", "operation", "request"):
            value = item.get(key)
            if not isinstance(value, str):
                return f"durable_call_many: call {index}: {key!r} must be a string"
            values.append(value)
        calls.append((values[0], values[1], values[2]))
    return calls


class CallOps(ReplayCore):
    """Calls and fetch: each answer comes from a service and is recorded; the events are
    written before the run's next call goes out, or with the finalize (engine.session.replay's
    docstring: "Persistence")."""

    # --- calls ---

    def durable_call(self, service: str, operation: str, request: str) -> Reply:
        tasks = self._task_service(service)
        event = self._match(CallEvent, (service, operation, request))
        if event is not None:
            if event.pending:
                if tasks is not None:
                    return self._call_reply(self._await_task(tasks, event))
                return self._resolve_intent(event)
            return self._call_reply(event)
        if tasks is not None:
            return self._call_reply(self._send_task(tasks, service, operation, request))
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
            self._record(intent)
        result = self._io(
            lambda: self.services.caller.call(service, operation, request, context),
            DURABLE_CALL,
            service,
            operation,
        )
        crash_point("after_call")  # the effect happened; its event is not committed yet
        event = self._call_event(step, service, operation, request, result)
        if write_ahead:
            self.storage.complete_intent(self.ref, event)
            self._recorded[-1] = event
            if event.ts > self._vnow:
                self._vnow = event.ts
        else:
            self._record(event)
        return self._call_reply(event)

    # --- several calls at once (ABI v1 extension: durable_call_many) ---
    #
    # A batch is a list of plain durable calls. Each takes one step, in the order given, and
    # records the very CallEvent that durable_call records, so a batch replays from the same
    # history that the same calls made one by one leave (and the other way round), and a
    # replayed or special call simply *is* a durable_call: the rules for write-ahead intents,
    # AMBIGUOUS and task calls live there only. What the batch adds is concurrency for
    # consecutive fresh calls that need none of those rules: they are made together on a
    # bounded pool of threads, and their events are recorded in the given order, each as soon
    # as it and every call before it have answered, and written together before the run's
    # next effect (or with the finalize). A crash before that write makes the batch's calls
    # again in the next segment, at the same steps and so with the same idempotency keys; a
    # crash after it leaves them in the history, answered from there.
    #
    # Made one at a time (through durable_call), in their place in the order:
    # - write-ahead calls: the intent must be in storage before the call is dispatched, and
    #   the history must stay a prefix, so an intent cannot be written ahead of the calls
    #   before it that are still running;
    # - task calls (a service bound to Celery): the run suspends on the task, and the calls
    #   after it are made when it has its outcome. Sending every task of a batch at once was
    #   dropped: it would leave pending intents in the middle of the history, where replaying
    #   one (which hands pending updates to the guest and may revoke the task) cannot happen.

    def durable_call_many(self, requests: str) -> Reply:
        calls = parse_call_batch(requests)
        if isinstance(calls, str):
            return Reply(AbiStatus.PERMANENT, calls)
        replies: list[Reply] = []
        index = 0
        while index < len(calls):
            end = index
            if not self._replaying_a_step():
                while end < len(calls) and self._plain_call(calls[end][0], calls[end][1]):
                    end += 1
                end = min(end, index + self._steps_left())
            if end - index > 1:
                replies += self._concurrent_calls(calls[index:end])
                index = end
            else:
                replies.append(self.durable_call(*calls[index]))
                index += 1
        answers = [{"status": int(r.status), "payload": r.payload} for r in replies]
        return Reply(AbiStatus.OK, json.dumps(answers, separators=(",", ":"), ensure_ascii=False))

    def _replaying_a_step(self) -> bool:
        return self._pos < len(self._history) and self._peek_recorded() is not None

    def _steps_left(self) -> int:
        """Steps before the event limit (where the run continues as new)."""
        return (self.run.max_history_events or self.config.max_history_events) - self.step

    def _plain_call(self, service: str, operation: str) -> bool:
        write_ahead = self.config.write_ahead_ops
        if write_ahead and f"{service}.{operation}" in write_ahead:
            return False
        return self._task_service(service) is None

    def _concurrent_calls(self, calls: Sequence[BatchItem]) -> list[Reply]:
        first = self.step
        contexts = [self._context(s, o, first + i) for i, (s, o, _) in enumerate(calls)]
        caller = self.services.caller
        after = self.services.after_batch_call
        tracer = self.services.tracer

        def make(index: int) -> CallResult:
            service, operation, request = calls[index]
            call = functools.partial(
                service_result,
                functools.partial(caller.call, service, operation, request, contexts[index]),
            )
            try:
                if tracer is None:
                    return call()
                # Each call in a span of its own under the segment's, as a single call is.
                return traced_call(tracer, DURABLE_CALL, service, operation, first + index, call)
            finally:
                if after is not None:
                    after()

        replies: list[Reply] = []
        self._flush()  # what the run recorded before the batch, before its calls go out
        started = time.monotonic()
        workers = min(len(calls), self.config.max_parallel_calls)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cleat-call") as pool:
            # Each thread runs in a copy of this one's context: the current span (its
            # traceparent for HTTP services) and whatever else the caller set.
            futures = [
                pool.submit(contextvars.copy_context().run, make, index)
                for index in range(len(calls))
            ]
            try:
                for index, future in enumerate(futures):
                    result = future.result()
                    crash_point("after_call")  # the effect happened; its event is not committed
                    service, operation, request = calls[index]
                    event = self._record(
                        self._call_event(first + index, service, operation, request, result)
                    )
                    replies.append(self._call_reply(event))
            finally:
                for future in futures:
                    future.cancel()
                self._give_back(time.monotonic() - started)
        return replies

    # --- calls that run as tasks (engine.services.TaskService) ---
    #
    # The call's write-ahead intent and the record its outcome goes to are written together
    # (``DispatchTask``), then the task is published and the run suspends: no thread waits
    # for the task. The worker that runs the task records its outcome on the record and wakes
    # the run; the next segment replays to the intent, finds the outcome and writes it over
    # the intent, so later replays answer from the history and nothing is sent again. A
    # segment that died between the write and the publish leaves a record not marked sent:
    # the next one publishes it (the same task id and idempotency key).

    def _task_service(self, service: str) -> TaskService | None:
        lookup = getattr(self.services.caller, "task_service", None)
        if lookup is None:
            return None
        found = lookup(service)
        return None if found is None or isinstance(found, str) else found

    def _send_task(
        self,
        tasks: TaskService,
        service: str,
        operation: str,
        request: str,
        attempt: int = 1,
        key_step: int | None = None,
    ) -> CallEvent:
        cancelled = self._blocking_preamble()
        step = self.step
        if cancelled is not None:  # like every blocking call: not even started
            result = CallResult(AbiStatus.CANCELLED, f"the run was cancelled: {cancelled}")
            return self._record(
                self._call_event(step, service, operation, request, result, attempt)
            )
        context = self._context(service, operation, step if key_step is None else key_step, attempt)
        task_id = str(uuid.uuid4())
        token = secrets.token_urlsafe(24)
        timeout_ms = int(tasks.timeout_ms)
        deadline = self._vnow + timeout_ms if timeout_ms > 0 else None
        intent = CallEvent(
            step=step,
            ts=self._stamp(),
            service=service,
            operation=operation,
            request=request,
            pending=True,
            attempt=attempt,
        )
        dispatch = DispatchTask(
            step=step,
            task_id=task_id,
            token=token,
            service=service,
            operation=operation,
            idempotency_key=context.idempotency_key,
            deadline_ms=deadline,
        )

        def refused(exc: Refused) -> CallEvent:
            raise StorageError(f"storage refused a task call: {exc.message}")

        self._apply(dispatch, lambda _: intent, refused)
        state = TaskCallRecord(task_id, token, False, deadline)
        raise self._publish(tasks, intent, state, context)

    def _await_task(
        self, tasks: TaskService, intent: CallEvent, key_step: int | None = None
    ) -> CallEvent:
        """Replaying a task call's intent: its outcome if reported (written over the
        intent), TIMEOUT or CANCELLED (the task revoked), else suspend again."""
        state = self.storage.task_call(self.ref, intent.step)
        if state is None:  # an intent of another kind of call: the worker died in it
            return self._completed_intent(intent, self._resolve_intent(intent))
        if state.status is not None:
            return self._settle_task(intent, CallResult(AbiStatus(state.status), state.payload))
        cancelled = self._blocking_preamble()
        if cancelled is not None:
            self._revoke(tasks, state.task_id)
            return self._settle_task(
                intent, CallResult(AbiStatus.CANCELLED, f"the run was cancelled: {cancelled}")
            )
        if self._due(state.deadline_ms):
            self._revoke(tasks, state.task_id)
            return self._settle_task(
                intent,
                CallResult(
                    AbiStatus.TIMEOUT,
                    f"task {intent.service}.{intent.operation} ({state.task_id}) reported no "
                    f"outcome within {tasks.timeout_ms} ms",
                ),
            )
        if not state.sent:
            context = self._context(
                intent.service,
                intent.operation,
                intent.step if key_step is None else key_step,
                intent.attempt,
            )
            raise self._publish(tasks, intent, state, context)
        raise self._suspend(self._task_wait(intent, state))

    def _publish(
        self, tasks: TaskService, intent: CallEvent, state: TaskCallRecord, context: CallContext
    ) -> Exception:
        """Publish the task, note it sent, and return the suspension to raise."""
        call = TaskCall(state.task_id, state.token, intent.request, context)
        wait = self._task_wait(intent, state)
        try:
            tasks.send_task_call(call)
        except Exception as exc:
            log.warning(
                "event=task_send_failed run=%s step=%d task=%s detail=%r",
                self.ref.run_id,
                intent.step,
                state.task_id,
                str(exc)[:300],
            )
            retry_at = self.clock() + TASK_SEND_RETRY_MS
            if wait.wake_at_ms is not None:
                retry_at = min(retry_at, wait.wake_at_ms)
            return self._suspend(
                WaitCondition(
                    WaitKind.TASK,
                    wake_at_ms=retry_at,
                    service=wait.service,
                    operation=wait.operation,
                    task_id=wait.task_id,
                )
            )
        self.storage.task_sent(self.ref, intent.step)
        return self._suspend(wait)

    @staticmethod
    def _task_wait(intent: CallEvent, state: TaskCallRecord) -> WaitCondition:
        return WaitCondition(
            WaitKind.TASK,
            wake_at_ms=state.deadline_ms,
            service=intent.service,
            operation=intent.operation,
            task_id=state.task_id,
        )

    def _revoke(self, tasks: TaskService, task_id: str) -> None:
        try:
            tasks.revoke_task_call(task_id)
        except Exception:
            log.exception("could not revoke task %s", task_id)

    def _settle_task(self, intent: CallEvent, result: CallResult) -> CallEvent:
        event = self._call_event(
            intent.step,
            intent.service,
            intent.operation,
            intent.request,
            result,
            intent.attempt,
        )
        event = CallEvent(**{**event_fields(event), "ts": max(event.ts, intent.ts, self._vnow)})
        self.storage.settle_task_call(self.ref, event)
        if event.ts > self._vnow:
            self._vnow = event.ts
        return event

    def _completed_intent(self, intent: CallEvent, reply: Reply) -> CallEvent:
        status = AbiStatus(reply.status)
        ok = status == AbiStatus.OK
        return _new_call_event(
            step=intent.step,
            ts=intent.ts,
            service=intent.service,
            operation=intent.operation,
            request=intent.request,
            response=reply.payload if ok else "",
            error="" if ok else reply.payload,
            status=int(status),
            attempt=intent.attempt,
        )

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
        tasks = self._task_service(service)
        while True:
            event = self._match(CallEvent, (service, operation, request))
            if event is not None and event.pending and tasks is not None:
                if first_step is None:
                    first_step = event.step
                event = self._await_task(tasks, event, key_step=first_step)
            elif event is None and tasks is not None:
                if first_step is None:
                    first_step = self.step
                event = self._send_task(
                    tasks, service, operation, request, attempt, key_step=first_step
                )
            elif event is None:
                step = self.step
                if first_step is None:
                    first_step = step
                context = self._context(service, operation, first_step, attempt)
                result = self._io(
                    functools.partial(
                        self.services.caller.call, service, operation, request, context
                    ),
                    DURABLE_CALL,
                    service,
                    operation,
                )
                event = self._record(
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
                lambda: self.services.caller.call(service, operation, request, context),
                DURABLE_CALL,
                service,
                operation,
            )
        finally:
            stop.set()
            ticker.join()
        if lost:
            raise FenceLost(f"run {self.ref.run_id} lost its lease during a heartbeat call")
        ok = result.status == AbiStatus.OK
        event = self._record(
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
            result = self._io(
                lambda: self.services.fetcher.fetch(method, url, headers, body), FETCH, method, url
            )
            ok = result.status == AbiStatus.OK
            event = self._record(
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
            event = self._record(self._plugin_event(step, plugin, function, input, False, result))
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
        self._flush()  # what the run recorded before the call, before it goes out
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
        self._give_back(time.monotonic() - started)
        event = self._record(self._plugin_event(self.step, plugin, function, input, True, result))
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
