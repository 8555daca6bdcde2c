"""Event history: typed records, their compact codec and per-event checksums.

Every host call that has an effect or brings information into the workflow records one
event at its step. An event is a frozen dataclass; on disk it is ``(step, type code,
timestamp_ms, payload, checksum)`` where the payload is compact JSON with short keys and
the type code is a small integer (the reference's codes 0-29, ours from 30 on).

Identity: each class names the fields that identify the *question* a call asked
(``IDENTITY``). On replay the new call's identity must equal the recorded one, otherwise the
workflow diverged (``NondeterminismError``). Answer fields (responses, statuses, ids the host
chose) are never compared: they are what replay feeds back.

``ts`` is the virtual time (ms since the epoch) that ``now()`` returns after the event. For a
sleep it is the wake-up time (start + duration), so replays see the same clock.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import inspect
import json
import json.decoder
import json.encoder
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, TypeVar

R = TypeVar("R")


class EventType(enum.StrEnum):
    CALL = "call"
    SLEEP = "sleep"
    AWAIT_SIGNALS = "await_signals"
    SIGNAL_RECEIVED = "signal_received"
    DEFER = "defer"
    CHILD_WORKFLOW = "child_workflow"
    AWAIT_CHILD = "await_child"
    CONTINUE_AS_NEW = "continue_as_new"
    HEARTBEAT = "heartbeat"
    AWAIT_ALL_CHILDREN = "await_all_children"
    PLUGIN_CALL = "plugin_call"
    CREATE_PROMISE = "create_promise"
    AWAIT_PROMISE = "await_promise"
    PROMISE_RESOLVED = "promise_resolved"
    PROMISE_REJECTED = "promise_rejected"
    UPDATE_HANDLER = "update_handler"
    STATE_MUTATION = "state_mutation"
    RUN_DETACHED = "run_detached"
    ACQUIRE_LOCK = "acquire_lock"
    RELEASE_LOCK = "release_lock"
    PLUGIN_CALL_STREAM_CHUNK = "plugin_call_stream_chunk"
    SIDE_EFFECT = "side_effect"
    SCOPE_ACQUIRED = "scope_acquired"
    FETCH = "fetch"
    DURABLE_LOG = "durable_log"
    DURABLE_SEND = "durable_send"
    DURABLE_SCHEDULE_INVOKE = "durable_schedule_invoke"
    SCHEDULE_CRON = "schedule_cron"
    DELETE_CRON = "delete_cron"
    LIST_CRONS = "list_crons"
    POLL_CHILD = "poll_child"
    AWAIT_ANY_CHILD = "await_any_child"
    ADMIN_ACTION = "admin_action"
    CANCELLATION_CHECK = "cancellation_check"
    SIGNAL_SENT = "signal_sent"
    SIGNAL_REPLY = "signal_reply"
    UPDATE_APPLIED = "update_applied"

    @property
    def code(self) -> int:
        return _CODES[self]


# Wire codes. 0-29 are the reference's and must never change; new types take new numbers.
_CODES: dict[EventType, int] = {
    EventType.CALL: 0,
    EventType.SLEEP: 1,
    EventType.AWAIT_SIGNALS: 2,
    EventType.SIGNAL_RECEIVED: 3,
    EventType.DEFER: 4,
    EventType.CHILD_WORKFLOW: 5,
    EventType.AWAIT_CHILD: 6,
    EventType.CONTINUE_AS_NEW: 7,
    EventType.HEARTBEAT: 8,
    EventType.AWAIT_ALL_CHILDREN: 9,
    EventType.PLUGIN_CALL: 10,
    EventType.CREATE_PROMISE: 11,
    EventType.AWAIT_PROMISE: 12,
    EventType.PROMISE_RESOLVED: 13,
    EventType.PROMISE_REJECTED: 14,
    EventType.UPDATE_HANDLER: 15,
    EventType.STATE_MUTATION: 16,
    EventType.RUN_DETACHED: 17,
    EventType.ACQUIRE_LOCK: 18,
    EventType.RELEASE_LOCK: 19,
    EventType.PLUGIN_CALL_STREAM_CHUNK: 20,
    EventType.SIDE_EFFECT: 21,
    EventType.SCOPE_ACQUIRED: 22,
    EventType.FETCH: 23,
    EventType.DURABLE_LOG: 24,
    EventType.DURABLE_SEND: 25,
    EventType.DURABLE_SCHEDULE_INVOKE: 26,
    EventType.SCHEDULE_CRON: 27,
    EventType.DELETE_CRON: 28,
    EventType.LIST_CRONS: 29,
    EventType.POLL_CHILD: 30,
    EventType.AWAIT_ANY_CHILD: 31,
    EventType.ADMIN_ACTION: 32,
    EventType.CANCELLATION_CHECK: 33,
    EventType.SIGNAL_SENT: 34,
    EventType.SIGNAL_REPLY: 35,
    EventType.UPDATE_APPLIED: 36,
}
assert len(set(_CODES.values())) == len(_CODES) == len(EventType)
TYPE_BY_CODE: dict[int, EventType] = {c: t for t, c in _CODES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One recorded step. Subclasses declare ``TYPE``, ``KEYS`` (field -> short key) and
    ``IDENTITY`` (the fields replay compares)."""

    TYPE: ClassVar[EventType]
    KEYS: ClassVar[dict[str, str]] = {}
    IDENTITY: ClassVar[tuple[str, ...]] = ()
    # Annotations (admin actions) are not guest steps: replay steps over them.
    ANNOTATION: ClassVar[bool] = False

    step: int = -1
    ts: int = 0

    def identity(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.IDENTITY)

    def describe(self) -> str:
        """Short human form, e.g. ``call(payments.charge, {"amount":5})``."""
        args = ", ".join(_short(getattr(self, name)) for name in self.IDENTITY)
        return f"{self.TYPE.value}({args})"


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_call(event_type: EventType, identity: Mapping[str, Any]) -> str:
    """Describe a call that has not been recorded, in the same form as ``Event.describe``."""
    args = ", ".join(_short(v) for v in identity.values())
    return f"{event_type.value}({args})"


_REGISTRY: dict[EventType, type[Event]] = {}


def _event(cls: type[Event]) -> type[Event]:
    _REGISTRY[cls.TYPE] = cls
    return cls


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class CallEvent(Event):
    """A durable service call (one attempt of it, for calls with retry)."""

    TYPE = EventType.CALL
    KEYS = {
        "service": "svc",
        "operation": "op",
        "request": "req",
        "response": "resp",
        "error": "err",
        "status": "st",
        "attempt": "att",
        "pending": "p",
    }
    IDENTITY = ("service", "operation", "request")
    service: str = ""
    operation: str = ""
    request: str = ""
    response: str = ""
    error: str = ""
    status: int = 0
    attempt: int = 1
    # A write-ahead intent: recorded before dispatch, completed in place after it.
    pending: bool = False


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class SleepEvent(Event):
    """A durable timer: a sleep, or the backoff between attempts of a retried call."""

    TYPE = EventType.SLEEP
    KEYS = {"duration_ms": "d", "wake_at_ms": "w", "reason": "r", "status": "st"}
    IDENTITY = ("duration_ms", "reason")
    duration_ms: int = 0
    wake_at_ms: int = 0
    reason: str = "sleep"  # "sleep" or "retry"
    status: int = 0  # CANCELLED if cancellation cut it short


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitSignalsEvent(Event):
    """The outcome of ``durable_await_signals``: a signal, a timeout or a cancellation."""

    TYPE = EventType.AWAIT_SIGNALS
    KEYS = {
        "names": "n",
        "timeout_ms": "to",
        "status": "st",
        "name": "sn",
        "payload": "sp",
        "signal_id": "sid",
        "correlation_id": "cid",
    }
    IDENTITY = ("names", "timeout_ms")
    names: tuple[str, ...] = ()
    timeout_ms: int = -1
    status: int = 0
    name: str = ""
    payload: str = ""
    signal_id: str = ""
    correlation_id: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalReceivedEvent(Event):
    """The outcome of ``poll_signal``: the payload, or ``NOT_FOUND``."""

    TYPE = EventType.SIGNAL_RECEIVED
    KEYS = {"name": "sn", "payload": "sp", "signal_id": "sid", "status": "st"}
    IDENTITY = ("name",)
    name: str = ""
    payload: str = ""
    signal_id: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class DeferEvent(Event):
    TYPE = EventType.DEFER
    KEYS = {"export_name": "fn", "defer_id": "id"}
    IDENTITY = ("export_name",)
    export_name: str = ""
    defer_id: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ChildWorkflowEvent(Event):
    TYPE = EventType.CHILD_WORKFLOW
    KEYS = {
        "name": "n",
        "input": "in",
        "version": "v",
        "priority": "pr",
        "parent_close_policy": "pcp",
        "run_id": "rid",
        "status": "st",
        "error": "err",
    }
    IDENTITY = ("name", "input", "version", "parent_close_policy")
    name: str = ""
    input: str = ""
    version: int = 0
    priority: int = 0
    parent_close_policy: str = "terminate"
    run_id: str = ""
    status: int = 0
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitChildEvent(Event):
    TYPE = EventType.AWAIT_CHILD
    KEYS = {"run_id": "rid", "status": "st", "result": "res", "error": "err"}
    IDENTITY = ("run_id",)
    run_id: str = ""
    status: int = 0
    result: str = ""
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ContinueAsNewEvent(Event):
    TYPE = EventType.CONTINUE_AS_NEW
    KEYS = {"new_input": "ni", "new_version": "nv", "reason": "r"}
    IDENTITY = ("new_input", "new_version")
    new_input: str = ""
    new_version: int = 0  # 0: same version
    reason: str = ""  # "" (the guest asked) or "history_limit"


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatEvent(Event):
    """A long call made with ``durable_call_with_heartbeat`` (the lease kept alive during it)."""

    TYPE = EventType.HEARTBEAT
    KEYS = {
        "service": "svc",
        "operation": "op",
        "request": "req",
        "interval_ms": "hb",
        "response": "resp",
        "error": "err",
        "status": "st",
        "beats": "n",
    }
    IDENTITY = ("service", "operation", "request", "interval_ms")
    service: str = ""
    operation: str = ""
    request: str = ""
    interval_ms: int = 0
    response: str = ""
    error: str = ""
    status: int = 0
    beats: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitAllChildrenEvent(Event):
    TYPE = EventType.AWAIT_ALL_CHILDREN
    KEYS = {"run_ids": "rids", "outcomes": "out", "status": "st"}
    IDENTITY = ("run_ids",)
    run_ids: tuple[str, ...] = ()
    outcomes: str = ""  # JSON array, the value returned to the guest
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class PluginCallEvent(Event):
    TYPE = EventType.PLUGIN_CALL
    KEYS = {
        "plugin": "pn",
        "function": "pf",
        "input": "pi",
        "streaming": "s",
        "output": "po",
        "error": "pe",
        "status": "st",
    }
    IDENTITY = ("plugin", "function", "input", "streaming")
    plugin: str = ""
    function: str = ""
    input: str = ""
    streaming: bool = False
    output: str = ""
    error: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class CreatePromiseEvent(Event):
    TYPE = EventType.CREATE_PROMISE
    KEYS = {"name": "n", "promise_id": "id"}
    IDENTITY = ("name",)
    name: str = ""
    promise_id: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitPromiseEvent(Event):
    TYPE = EventType.AWAIT_PROMISE
    KEYS = {"promise_id": "id", "timeout_ms": "to", "status": "st", "value": "v", "error": "err"}
    IDENTITY = ("promise_id", "timeout_ms")
    promise_id: str = ""
    timeout_ms: int = -1
    status: int = 0
    value: str = ""
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class PromiseResolvedEvent(Event):
    TYPE = EventType.PROMISE_RESOLVED
    KEYS = {"promise_id": "id", "value": "v", "status": "st"}
    IDENTITY = ("promise_id", "value")
    promise_id: str = ""
    value: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class PromiseRejectedEvent(Event):
    TYPE = EventType.PROMISE_REJECTED
    KEYS = {"promise_id": "id", "message": "m", "status": "st"}
    IDENTITY = ("promise_id", "message")
    promise_id: str = ""
    message: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateHandlerEvent(Event):
    """``register_update_handler``: the export that answers updates of that name."""

    TYPE = EventType.UPDATE_HANDLER
    KEYS = {"export_name": "fn"}
    IDENTITY = ("export_name",)
    export_name: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class StateMutationEvent(Event):
    """Every state operation (set, get, delete, incr, has, list), with its answer."""

    TYPE = EventType.STATE_MUTATION
    KEYS = {
        "op": "o",
        "key": "k",
        "value": "v",
        "delta": "dl",
        "result": "res",
        "found": "f",
        "scope": "sc",
    }
    IDENTITY = ("op", "key", "value", "delta")
    op: str = ""
    key: str = ""
    value: str = ""
    delta: int = 0
    result: str = ""
    found: bool = True
    scope: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class RunDetachedEvent(Event):
    TYPE = EventType.RUN_DETACHED
    KEYS = {"name": "n", "input": "in", "run_id": "rid", "status": "st", "error": "err"}
    IDENTITY = ("name", "input")
    name: str = ""
    input: str = ""
    run_id: str = ""
    status: int = 0
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AcquireLockEvent(Event):
    TYPE = EventType.ACQUIRE_LOCK
    KEYS = {"key": "k", "ttl_ms": "ttl", "acquired": "a"}
    IDENTITY = ("key", "ttl_ms")
    key: str = ""
    ttl_ms: int = 0
    acquired: bool = False


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseLockEvent(Event):
    TYPE = EventType.RELEASE_LOCK
    KEYS = {"key": "k"}
    IDENTITY = ("key",)
    key: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class StreamChunkEvent(Event):
    TYPE = EventType.PLUGIN_CALL_STREAM_CHUNK
    KEYS = {"plugin": "pn", "function": "pf", "index": "i", "chunk": "c"}
    IDENTITY = ("plugin", "function", "index")
    plugin: str = ""
    function: str = ""
    index: int = 0
    chunk: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class SideEffectEvent(Event):
    """The value of the first execution; never compared (it is non-deterministic by nature)."""

    TYPE = EventType.SIDE_EFFECT
    KEYS = {"value": "v"}
    value: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ScopeAcquiredEvent(Event):
    TYPE = EventType.SCOPE_ACQUIRED
    KEYS = {"object_type": "ot", "instance_key": "ik", "previous": "prev"}
    IDENTITY = ("object_type", "instance_key")
    object_type: str = ""
    instance_key: str = ""
    previous: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class FetchEvent(Event):
    TYPE = EventType.FETCH
    KEYS = {
        "method": "m",
        "url": "u",
        "headers": "h",
        "body": "b",
        "response": "resp",
        "error": "err",
        "status": "st",
    }
    IDENTITY = ("method", "url", "headers", "body")
    method: str = ""
    url: str = ""
    headers: str = ""
    body: str = ""
    response: str = ""
    error: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class DurableLogEvent(Event):
    TYPE = EventType.DURABLE_LOG
    KEYS = {"level": "l", "message": "m"}
    IDENTITY = ("level", "message")
    level: int = 1
    message: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class DurableSendEvent(Event):
    TYPE = EventType.DURABLE_SEND
    KEYS = {"service": "svc", "operation": "op", "request": "req", "invocation_id": "id"}
    IDENTITY = ("service", "operation", "request")
    service: str = ""
    operation: str = ""
    request: str = ""
    invocation_id: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInvokeEvent(Event):
    TYPE = EventType.DURABLE_SCHEDULE_INVOKE
    KEYS = {
        "service": "svc",
        "operation": "op",
        "request": "req",
        "delay_ms": "d",
        "invocation_id": "id",
    }
    IDENTITY = ("service", "operation", "request", "delay_ms")
    service: str = ""
    operation: str = ""
    request: str = ""
    delay_ms: int = 0
    invocation_id: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleCronEvent(Event):
    TYPE = EventType.SCHEDULE_CRON
    KEYS = {
        "workflow_name": "wn",
        "cron": "c",
        "timezone": "tz",
        "input": "in",
        "schedule_id": "id",
        "status": "st",
        "error": "err",
    }
    IDENTITY = ("workflow_name", "cron", "timezone", "input")
    workflow_name: str = ""
    cron: str = ""
    timezone: str = ""
    input: str = ""
    schedule_id: str = ""
    status: int = 0
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteCronEvent(Event):
    TYPE = EventType.DELETE_CRON
    KEYS = {"schedule_id": "id", "status": "st"}
    IDENTITY = ("schedule_id",)
    schedule_id: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class ListCronsEvent(Event):
    TYPE = EventType.LIST_CRONS
    KEYS = {"result": "res"}
    result: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class PollChildEvent(Event):
    TYPE = EventType.POLL_CHILD
    KEYS = {"run_id": "rid", "status": "st", "result": "res", "error": "err"}
    IDENTITY = ("run_id",)
    run_id: str = ""
    status: int = 0
    result: str = ""
    error: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AwaitAnyChildEvent(Event):
    TYPE = EventType.AWAIT_ANY_CHILD
    KEYS = {"run_ids": "rids", "outcome": "out", "status": "st"}
    IDENTITY = ("run_ids",)
    run_ids: tuple[str, ...] = ()
    outcome: str = ""  # JSON object, the value returned to the guest
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class AdminActionEvent(Event):
    """An operator's action (force-complete, force-fail, re-replay, ...), kept in the history
    for the timeline. Not a guest step: replay steps over it."""

    TYPE = EventType.ADMIN_ACTION
    KEYS = {"action": "a", "operator": "by", "reason": "r"}
    ANNOTATION = True
    action: str = ""
    operator: str = ""
    reason: str = ""


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class CancellationCheckEvent(Event):
    TYPE = EventType.CANCELLATION_CHECK
    KEYS = {"reason": "r", "status": "st"}
    reason: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalSentEvent(Event):
    TYPE = EventType.SIGNAL_SENT
    KEYS = {
        "target_id": "to",
        "name": "sn",
        "payload": "sp",
        "correlation_id": "cid",
        "status": "st",
    }
    IDENTITY = ("target_id", "name", "payload")
    target_id: str = ""
    name: str = ""
    payload: str = ""
    correlation_id: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class SignalReplyEvent(Event):
    TYPE = EventType.SIGNAL_REPLY
    KEYS = {"correlation_id": "cid", "response": "resp", "status": "st"}
    IDENTITY = ("correlation_id", "response")
    correlation_id: str = ""
    response: str = ""
    status: int = 0


@_event
@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateAppliedEvent(Event):
    """An update request handed to the guest's handler at this point of the run."""

    TYPE = EventType.UPDATE_APPLIED
    KEYS = {"update_id": "id", "name": "n", "payload": "p"}
    IDENTITY = ("update_id",)
    update_id: str = ""
    name: str = ""
    payload: str = ""


assert set(_REGISTRY) == set(EventType), "every event type needs a record class"

# ---------------------------------------------------------------------------------------
# Codec


class EncodedEvent(NamedTuple):
    """An event as storage keeps it."""

    step: int
    type_code: int
    ts: int
    payload: str  # compact JSON object with short keys
    checksum: str  # sha256 hex of the fields above; "" for a pending write-ahead intent

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def _default_of(cls: type[Event], name: str) -> Any:
    return _DEFAULTS[cls][name]


_DEFAULTS: dict[type[Event], dict[str, Any]] = {
    cls: {f.name: f.default for f in dataclasses.fields(cls)} for cls in _REGISTRY.values()
}
_TUPLE_FIELDS: dict[type[Event], frozenset[str]] = {
    cls: frozenset(n for n, d in _DEFAULTS[cls].items() if isinstance(d, tuple))
    for cls in _REGISTRY.values()
}


# Built once: json.dumps with non-default options constructs an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# What that encoder makes of a string, alone or inside an object (C-backed).
_json_string: Callable[[str], str] = json.encoder.encode_basestring
_int_text = int.__repr__  # what json writes for an int (the C encoder calls int's repr)
_new_tuple = tuple.__new__


def _json_value(value: Any) -> str:
    """A field's value as it appears in the payload object (tuples become arrays)."""
    return _ENCODER.encode(list(value) if isinstance(value, tuple) else value)


def record_maker(cls: type[R]) -> Callable[..., R]:
    """A constructor of the frozen, slotted dataclass ``cls`` that takes the same arguments
    as its ``__init__`` (same defaults) and builds the same instance, several times faster.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` by
    name; this sets each slot through its descriptor directly. Only for dataclasses whose
    ``__init__`` does nothing else: no ``__post_init__``, no default factories, no
    ``InitVar``."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} is not a plain dataclass")
    fields = dataclasses.fields(cls)
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        descriptor = inspect.getattr_static(cls, f.name)
        if (
            type(descriptor).__name__ != "member_descriptor"
            or f.default_factory is not dataclasses.MISSING
            or not f.init
        ):
            raise TypeError(f"{cls.__name__}.{f.name} is not a plain slot")
        namespace[f"_set{i}"] = descriptor.__set__
        param = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_d{i}"] = f.default
            param += f"=_d{i}"
        # As in the dataclass's __init__: keyword-only fields after all the others.
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    _set{i}(obj, {f.name})")
    params = [*positional, *(["*", *keyword] if keyword else [])]
    source = f"def make({', '.join(params)}):\n    obj = _new(_cls)\n" + "\n".join(body)
    exec(source + "\n    return obj\n", namespace)
    make: Callable[..., R] = namespace["make"]
    make.__doc__ = f"Build a {cls.__name__} (see record_maker)."
    return make


def _payload_function(cls: type[Event]) -> Callable[[Event], str]:
    """``payload(event)`` for the class ``cls``, with its fields written out: the same text
    as ``json.dumps({short key: value, ...}, separators=(",", ":"), ensure_ascii=False)`` of
    the fields that differ from their defaults, in ``KEYS`` order. Strings and integers are
    written by the functions the JSON encoder itself uses for them; anything else (tuples,
    booleans, values of unexpected types) goes through the encoder."""
    defaults = _DEFAULTS[cls]
    namespace: dict[str, Any] = {
        "_str": _json_string,
        "_int": _int_text,
        "_value": _json_value,
    }
    lines = ["def payload(event):", "    parts = []"]
    for i, (name, key) in enumerate(cls.KEYS.items()):
        default = defaults[name]
        namespace[f"_d{i}"] = default
        namespace[f"_k{i}"] = _json_string(key) + ":"
        if type(default) is str:
            text = "(_str(v) if type(v) is str else _value(v))"
        elif type(default) is int:
            text = "(_int(v) if type(v) is int else _value(v))"
        else:
            text = "_value(v)"
        lines += [
            f"    v = event.{name}",
            f"    if v != _d{i}:",
            f"        parts.append(_k{i} + {text})",
        ]
    lines.append('    return "{" + ",".join(parts) + "}"')
    exec("\n".join(lines) + "\n", namespace)
    payload: Callable[[Event], str] = namespace["payload"]
    return payload


def _encode_function(cls: type[Event]) -> Callable[[Event], EncodedEvent]:
    """``encode(event)`` for the class ``cls``: its payload, and the checksum of
    ``step ‖ 0x00 ‖ code ‖ 0x00 ‖ ts ‖ 0x00 ‖ payload`` (none for a pending intent)."""
    namespace: dict[str, Any] = {
        "_payload": _PAYLOAD[cls],
        "_sha256": hashlib.sha256,
        "_new": _new_tuple,
        "_Encoded": EncodedEvent,
        "_code": cls.TYPE.code,
        "_code_text": f"\x00{cls.TYPE.code}\x00",
    }
    has_pending = "pending" in _DEFAULTS[cls]
    digest = '_sha256(f"{step}{_code_text}{ts}\\x00{payload}".encode()).hexdigest()'
    if has_pending:
        digest = f'"" if event.pending else {digest}'
    source = (
        "def encode(event):\n"
        "    payload = _payload(event)\n"
        "    step = event.step\n"
        "    ts = event.ts\n"
        f"    return _new(_Encoded, (step, _code, ts, payload, {digest}))\n"
    )
    exec(source, namespace)
    encode: Callable[[Event], EncodedEvent] = namespace["encode"]
    return encode


_PAYLOAD: dict[type[Event], Callable[[Event], str]] = {
    cls: _payload_function(cls) for cls in _REGISTRY.values()
}
_ENCODE: dict[type[Event], Callable[[Event], EncodedEvent]] = {
    cls: _encode_function(cls) for cls in _REGISTRY.values()
}


def payload_of(event: Event) -> str:
    return _PAYLOAD[type(event)](event)


def checksum(step: int, type_code: int, ts: int, payload: str) -> str:
    return hashlib.sha256(f"{step}\x00{type_code}\x00{ts}\x00{payload}".encode()).hexdigest()


def encode(event: Event) -> EncodedEvent:
    return _ENCODE[type(event)](event)


class CodecError(ValueError):
    """A stored event cannot be decoded: unknown type code or malformed payload."""


def _decode_function(cls: type[Event]) -> Callable[[int, int, dict[str, Any]], Event]:
    """``build(step, ts, data)`` for the class ``cls``: the event whose fields are the
    payload object's values under their short keys (arrays become tuples), and the
    defaults for the keys it leaves out; other keys are ignored."""
    defaults = _DEFAULTS[cls]
    namespace: dict[str, Any] = {"_make": record_maker(cls)}
    args = ["step=step", "ts=ts"]
    for i, (name, key) in enumerate(cls.KEYS.items()):
        namespace[f"_d{i}"] = defaults[name]
        if name in _TUPLE_FIELDS[cls]:
            args.append(f"{name}=tuple(data[{key!r}]) if {key!r} in data else _d{i}")
        else:
            args.append(f"{name}=get({key!r}, _d{i})")
    source = "def build(step, ts, data):\n    get = data.get\n"
    source += f"    return _make({', '.join(args)})\n"
    exec(source, namespace)
    build: Callable[[int, int, dict[str, Any]], Event] = namespace["build"]
    return build


_DECODE: dict[int, Callable[[int, int, dict[str, Any]], Event]] = {
    code: _decode_function(_REGISTRY[event_type]) for code, event_type in TYPE_BY_CODE.items()
}


def json_loads(text: str) -> Any:
    """``json.loads(text)`` for a ``str``, the same value or exception, with less overhead
    around the scanner for the common case: a document that starts with a value at index 0
    and ends with it. Anything else (leading or trailing whitespace, no value at all) goes
    through ``json.loads``."""
    if type(text) is str:
        try:
            value, end = _scan_once(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


# The scanner of a decoder with json.loads's default settings (the C scanner; its memo of
# keys is cleared after every call).
_DECODER = json.decoder.JSONDecoder()
_scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]


def decode(stored: EncodedEvent | tuple[int, int, int, str, str]) -> Event:
    step, code, ts, payload, _ = stored
    try:
        build = _DECODE[code]
    except KeyError:
        raise CodecError(f"step {step}: unknown event type code {code}") from None
    try:
        data = json_loads(payload) if payload else {}
    except json.JSONDecodeError as exc:
        raise CodecError(f"step {step}: payload is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CodecError(f"step {step}: payload is not a JSON object")
    return build(step, ts, data)


def verify(stored: EncodedEvent) -> bool:
    """True when the stored checksum matches the content (pending intents have none)."""
    if not stored.checksum:
        return True
    return stored.checksum == checksum(stored.step, stored.type_code, stored.ts, stored.payload)


def event_class(event_type: EventType) -> type[Event]:
    return _REGISTRY[event_type]


def encode_all(events: Iterable[Event]) -> list[EncodedEvent]:
    return [encode(e) for e in events]


def decode_all(stored: Iterable[EncodedEvent]) -> list[Event]:
    return [decode(s) for s in stored]


def history_to_json(events: Iterable[Event]) -> list[dict[str, Any]]:
    """A JSON-ready list (golden-history files, API): one object per encoded event."""
    return [e.as_dict() for e in encode_all(events)]


def history_from_json(rows: Iterable[Mapping[str, Any]]) -> list[EncodedEvent]:
    return [
        EncodedEvent(
            int(r["step"]), int(r["type_code"]), int(r["ts"]), str(r["payload"]), str(r["checksum"])
        )
        for r in rows
    ]
