"""The host operations of time and waiting: virtual time, randomness, identity, logging and
the JSON helpers; timers; signals (await, poll, send, reply, cancellation); promises.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from engine.determinism import derived_uuid, random_i64
from engine.errors import Refused, StorageError
from engine.events import (
    AwaitPromiseEvent,
    AwaitSignalsEvent,
    CancellationCheckEvent,
    CreatePromiseEvent,
    DurableLogEvent,
    PromiseRejectedEvent,
    PromiseResolvedEvent,
    SideEffectEvent,
    SignalReceivedEvent,
    SignalReplyEvent,
    SignalSentEvent,
)
from engine.outcomes import WaitCondition, WaitKind
from engine.session.replay import (
    ReplayCore,
    Reply,
    json_value,
    parse_string_list,
    require_storable,
)
from engine.status import AbiStatus
from engine.storable import value_fault
from engine.storage import CreatePromise, SendSignal, SettlePromise

log = logging.getLogger("cleat.engine")

REPLY_SIGNAL_PREFIX = "__reply__/"


class TimeOps(ReplayCore):
    """Time, signals and promises."""

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
            AbiStatus.OK, derived_uuid(self.ref.workflow_id, self.ref.run_id, self.step, seed)
        )

    def side_effect(self, value: str) -> Reply:
        event = self._match(SideEffectEvent, ())
        if event is None:
            event = self._record(SideEffectEvent(step=self.step, ts=self._stamp(), value=value))
        return Reply(AbiStatus.OK, event.value)

    def workflow_id(self) -> Reply:
        return Reply(AbiStatus.OK, self.ref.workflow_id)

    def run_id(self) -> Reply:
        return Reply(AbiStatus.OK, self.ref.run_id)

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
            return Reply(AbiStatus.PERMANENT, f"invalid JSON: {exc}")
        if (fault := value_fault(value)) is not None:
            return Reply(AbiStatus.PERMANENT, f"invalid JSON: the text {fault}")
        return Reply(
            AbiStatus.OK,
            json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False),
        )

    def json_stringify(self, text: str) -> Reply:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return Reply(AbiStatus.PERMANENT, f"invalid JSON: {exc}")
        if (fault := value_fault(value)) is not None:
            return Reply(AbiStatus.PERMANENT, f"invalid JSON: the text {fault}")
        return Reply(AbiStatus.OK, json.dumps(value, separators=(",", ":"), ensure_ascii=False))

    # --- timers ---

    def durable_sleep(self, duration_ms: int) -> int:
        return self._timer(max(0, int(duration_ms)), "sleep")

    # --- signals ---

    def durable_await_signals(self, names_json: str, timeout_ms: int) -> Reply:
        names = parse_string_list(names_json)
        if not names:
            return Reply(
                AbiStatus.PERMANENT, "signal names must be a non-empty JSON array of strings"
            )
        return self._await_signals(names, int(timeout_ms), WaitKind.SIGNALS)

    def _await_signals(self, names: tuple[str, ...], timeout_ms: int, kind: WaitKind) -> Reply:
        base = self._vnow
        event = self._match(AwaitSignalsEvent, (names, timeout_ms))
        if event is None:
            event = self._await_signals_fresh(base, names, timeout_ms, kind)
        else:
            if event.signal_id:
                self._consumed_signals.add(event.signal_id)
        if event.status != AbiStatus.OK:
            return Reply(event.status, "")
        if kind is WaitKind.SIGNAL_REPLY:
            return Reply(AbiStatus.OK, event.payload)
        body: dict[str, Any] = {"name": event.name, "payload": json_value(event.payload)}
        if event.correlation_id:
            body["correlation_id"] = event.correlation_id
        return Reply(AbiStatus.OK, json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    def _await_signals_fresh(
        self, base: int, names: tuple[str, ...], timeout_ms: int, kind: WaitKind
    ) -> AwaitSignalsEvent:
        def outcome(status: AbiStatus, **found: Any) -> AwaitSignalsEvent:
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
            return outcome(AbiStatus.CANCELLED)
        signal = self.storage.next_signal(self.ref, names, self._consumed_signals)
        if signal is not None:
            self._consumed_signals.add(signal.signal_id)
            return outcome(
                AbiStatus.OK,
                name=signal.name,
                payload=signal.payload,
                signal_id=signal.signal_id,
                correlation_id=signal.correlation_id,
            )
        deadline = self._deadline(base, timeout_ms)
        if self._due(deadline):
            return outcome(AbiStatus.TIMEOUT)
        raise self._suspend(WaitCondition(kind, wake_at_ms=deadline, signals=names))

    def poll_signal(self, name: str) -> Reply:
        event = self._match(SignalReceivedEvent, (name,))
        if event is None:
            signal = self.storage.next_signal(self.ref, (name,), self._consumed_signals)
            if signal is None:
                event = self._record(
                    SignalReceivedEvent(
                        step=self.step, ts=self._stamp(), name=name, status=AbiStatus.NOT_FOUND
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
        if event.status != AbiStatus.OK:
            return Reply(event.status, "")
        return Reply(AbiStatus.OK, event.payload)

    def poll_cancellation(self) -> Reply:
        event = self._match(CancellationCheckEvent, ())
        if event is None:
            reason = self.storage.cancellation(self.ref)
            event = self._record(
                CancellationCheckEvent(
                    step=self.step,
                    ts=self._stamp(),
                    reason=reason or "",
                    status=AbiStatus.OK if reason is not None else AbiStatus.NOT_FOUND,
                )
            )
        if event.status == AbiStatus.OK:
            return Reply(AbiStatus.OK, event.reason)
        return Reply(event.status, "")

    def signal_workflow(self, target_id: str, name: str, payload: str) -> Reply:
        event = self._send_signal(target_id, name, payload, "")
        return Reply(event.status, "")

    def _send_signal(
        self, target_id: str, name: str, payload: str, correlation_id: str
    ) -> SignalSentEvent:
        require_storable("signal_workflow", "the name", name, is_json=False)
        require_storable("signal_workflow", "the payload", payload)
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
        if sent.status != AbiStatus.OK:
            return Reply(sent.status, f"signal {name!r} could not be delivered to {target_id}")
        reply_name = REPLY_SIGNAL_PREFIX + sent.correlation_id
        return self._await_signals((reply_name,), int(timeout_ms), WaitKind.SIGNAL_REPLY)

    def reply_to_signal(self, correlation_id: str, response: str) -> Reply:
        require_storable("reply_to_signal", "the response", response)
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
                        status=AbiStatus.NOT_FOUND,
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
        require_storable("create_promise", "the name", name, is_json=False)
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
        return Reply(AbiStatus.OK, event.promise_id)

    def await_promise(self, promise_id: str, timeout_ms: int) -> Reply:
        base = self._vnow
        timeout_ms = int(timeout_ms)
        event = self._match(AwaitPromiseEvent, (promise_id, timeout_ms))
        if event is None:

            def outcome(status: AbiStatus, value: str = "", error: str = "") -> AwaitPromiseEvent:
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
                event = outcome(AbiStatus.CANCELLED)
            else:
                state = self.storage.promise_state(self.ref, promise_id)
                deadline = self._deadline(base, timeout_ms)
                if state is None:
                    event = outcome(AbiStatus.NOT_FOUND, error=f"no promise {promise_id}")
                elif state.status == "resolved":
                    event = outcome(AbiStatus.OK, value=state.value)
                elif state.status == "rejected":
                    event = outcome(AbiStatus.ERROR, error=state.error)
                elif self._due(deadline):
                    event = outcome(AbiStatus.TIMEOUT)
                else:
                    raise self._suspend(
                        WaitCondition(WaitKind.PROMISE, wake_at_ms=deadline, promise_id=promise_id)
                    )
        if event.status == AbiStatus.OK:
            return Reply(AbiStatus.OK, event.value)
        return Reply(event.status, event.error)

    def resolve_promise(self, promise_id: str, value: str) -> Reply:
        require_storable("resolve_promise", "the value", value)
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
        require_storable("reject_promise", "the message", message, is_json=False)
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
