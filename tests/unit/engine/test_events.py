"""Event types, their wire codes, the codec and per-event checksums."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from engine.events import (
    TYPE_BY_CODE,
    CallEvent,
    CodecError,
    EncodedEvent,
    Event,
    EventType,
    SleepEvent,
    checksum,
    decode,
    encode,
    event_class,
    history_from_json,
    history_to_json,
    verify,
)
from engine.testing import WorkflowEnvironment

REPO = Path(__file__).resolve().parents[3]

# The reference implementation's wire codes (reference/engine-package-doc.txt), written out
# here on purpose: stored histories depend on them, so they may never change.
REFERENCE_CODES = {
    "call": 0,
    "sleep": 1,
    "await_signals": 2,
    "signal_received": 3,
    "defer": 4,
    "child_workflow": 5,
    "await_child": 6,
    "continue_as_new": 7,
    "heartbeat": 8,
    "await_all_children": 9,
    "plugin_call": 10,
    "create_promise": 11,
    "await_promise": 12,
    "promise_resolved": 13,
    "promise_rejected": 14,
    "update_handler": 15,
    "state_mutation": 16,
    "run_detached": 17,
    "acquire_lock": 18,
    "release_lock": 19,
    "plugin_call_stream_chunk": 20,
    "side_effect": 21,
    "scope_acquired": 22,
    "fetch": 23,
    "durable_log": 24,
    "durable_send": 25,
    "durable_schedule_invoke": 26,
    "schedule_cron": 27,
    "delete_cron": 28,
    "list_crons": 29,
}


# --- types and codes -----------------------------------------------------------------------


def test_every_event_type_has_a_record_class_and_a_unique_code() -> None:
    """Each type maps to its own class, and codes identify types one-to-one."""
    classes = [event_class(t) for t in EventType]
    assert all(
        issubclass(cls, Event) and cls.TYPE is t for cls, t in zip(classes, EventType, strict=True)
    )
    assert len(set(classes)) == len(EventType)
    codes = [t.code for t in EventType]
    assert len(set(codes)) == len(codes)
    assert all(TYPE_BY_CODE[t.code] is t for t in EventType)


@pytest.mark.parametrize(("name", "code"), sorted(REFERENCE_CODES.items(), key=lambda kv: kv[1]))
def test_reference_codes_are_pinned(name: str, code: int) -> None:
    """Codes 0-29 are the reference's and must never change."""
    assert EventType(name).code == code
    assert TYPE_BY_CODE[code] == EventType(name)


def test_types_of_our_own_take_codes_from_30() -> None:
    """Every type the reference does not have is numbered 30 or above."""
    ours = [t for t in EventType if t.value not in REFERENCE_CODES]
    assert ours, "cleat adds event types of its own"
    assert all(t.code >= 30 for t in ours)


# --- codec ---------------------------------------------------------------------------------


def sample_value(cls: type[Event], name: str, default: Any) -> Any:
    """A value of the field's type that differs from its default (unicode for strings)."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1 + len(name)
    if isinstance(default, tuple):
        return ("日本語", "€ü", f"{cls.__name__}.{name}")
    if isinstance(default, str):
        return f'{name} «ünïcødé» ✓ "quoted" \\ {cls.__name__}'
    raise AssertionError(f"{cls.__name__}.{name}: no sample for {type(default).__name__}")


def sample_event(event_type: EventType) -> Event:
    """An instance of the type's class with every field set to a non-default value."""
    cls = event_class(event_type)
    values = {
        f.name: sample_value(cls, f.name, f.default)
        for f in dataclasses.fields(cls)
        if f.name not in ("step", "ts")
    }
    return cls(step=41, ts=1_767_225_600_123, **values)


@pytest.mark.parametrize("event_type", list(EventType), ids=[t.value for t in EventType])
def test_round_trip_of_every_event_class(event_type: EventType) -> None:
    """Encoding then decoding gives back an equal event, every field included."""
    event = sample_event(event_type)
    stored = encode(event)
    assert stored.type_code == event_type.code
    assert stored.step == 41
    assert stored.ts == 1_767_225_600_123
    decoded = decode(stored)
    assert type(decoded) is type(event)
    assert decoded == event
    for f in dataclasses.fields(event):
        assert getattr(decoded, f.name) == getattr(event, f.name), f.name


@pytest.mark.parametrize("event_type", list(EventType), ids=[t.value for t in EventType])
def test_every_field_has_a_unique_short_key(event_type: EventType) -> None:
    """A field without a key would be silently dropped by the codec."""
    cls = event_class(event_type)
    fields = {f.name for f in dataclasses.fields(cls)} - {"step", "ts"}
    assert set(cls.KEYS) == fields
    assert len(set(cls.KEYS.values())) == len(cls.KEYS)
    assert set(cls.IDENTITY) <= fields


def test_round_trip_survives_json_storage() -> None:
    """history_to_json / history_from_json (golden files, the API) keep events intact."""
    events = [sample_event(t) for t in EventType]
    assert [decode(e) for e in history_from_json(history_to_json(events))] == events


def test_payload_is_compact_json_with_short_keys_and_no_defaults() -> None:
    """The stored form: defaults are left out, tuples become arrays, text stays unescaped."""
    stored = encode(CallEvent(step=3, ts=9, service="pay", operation="charge", request="{}"))
    assert stored.payload == '{"svc":"pay","op":"charge","req":"{}"}'
    sleep = encode(SleepEvent(step=0, ts=0))
    assert sleep.payload == "{}"
    names = encode(event_class(EventType.AWAIT_SIGNALS)(names=("é", "b")))
    assert names.payload == '{"n":["é","b"]}'


def test_pending_intent_has_no_checksum() -> None:
    """A write-ahead intent is completed in place later, so it carries no checksum yet."""
    assert encode(CallEvent(service="s", pending=True)).checksum == ""
    assert encode(CallEvent(service="s")).checksum != ""


def test_unknown_type_code_raises_codec_error() -> None:
    """A code no type has (a newer writer, a corrupt row) is refused with the step named."""
    unused = max(TYPE_BY_CODE) + 1
    with pytest.raises(CodecError, match=rf"step 5: unknown event type code {unused}"):
        decode(EncodedEvent(5, unused, 0, "{}", ""))


@pytest.mark.parametrize("payload", ["{not json", "[1, 2]", '"text"'])
def test_malformed_payload_raises_codec_error(payload: str) -> None:
    """A payload that is not a JSON object cannot be decoded."""
    with pytest.raises(CodecError):
        decode(EncodedEvent(0, EventType.CALL.code, 0, payload, ""))


# --- checksums -----------------------------------------------------------------------------


def test_checksum_is_sha256_of_the_stored_fields() -> None:
    """The checksum covers step, type code, timestamp and payload, NUL-separated."""
    stored = encode(CallEvent(step=2, ts=1000, service="svc", request='{"a":1}'))
    expected = hashlib.sha256(
        b"2\x00" + b"0\x00" + b"1000\x00" + stored.payload.encode()
    ).hexdigest()
    assert stored.checksum == expected == checksum(2, 0, 1000, stored.payload)
    assert verify(stored)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda e: e._replace(payload=e.payload.replace('"svc":"svc"', '"svc":"evil"')),
        lambda e: e._replace(ts=e.ts + 1),
        lambda e: e._replace(step=e.step + 1),
        lambda e: e._replace(type_code=EventType.FETCH.code),
    ],
    ids=["payload", "timestamp", "step", "type"],
)
def test_checksum_detects_tampering(tamper: Any) -> None:
    """Changing any stored field without recomputing the checksum is detected."""
    stored = encode(CallEvent(step=2, ts=1000, service="svc", request='{"a":1}'))
    tampered = tamper(stored)
    assert tampered != stored
    assert not verify(tampered)


# --- a tampered history in a run -----------------------------------------------------------


class DemoService:
    """The ``demo`` service order.wat calls."""

    def reserve(self, request: Any, **_: Any) -> dict[str, bool]:
        return {"reserved": True}

    def charge(self, request: Any, **_: Any) -> dict[str, int]:
        return {"charged": request["amount"]}


def suspended_order(env: WorkflowEnvironment) -> str:
    """Start the demo order workflow and leave it waiting for its "paid" signal."""
    env.deploy("order", wasmtime.wat2wasm((REPO / "workflows/demo/order.wat").read_text()))
    run = env.run("order", {})
    assert env.status(run) == "ready"
    assert len(env.storage.runs[run].history) == 1  # the reserve call
    return run


def test_untampered_history_replays_to_completion() -> None:
    """The control: the same steps as below without tampering complete the run."""
    env = WorkflowEnvironment(services={"demo": DemoService()})
    run = suspended_order(env)
    env.signal(run, "paid")
    env.run_until_idle()
    env.advance(seconds=60)
    assert env.result(run) == {"charged": 12}


def test_tampered_history_fails_the_run_as_history_corrupt() -> None:
    """A stored event whose payload was edited fails the next segment with history_corrupt
    instead of feeding the edited answer to the workflow."""
    env = WorkflowEnvironment(services={"demo": DemoService()})
    run = suspended_order(env)
    record = env.storage.runs[run]
    first = record.history[0]
    forged = first.payload.replace('{\\"reserved\\":true}', '{\\"reserved\\":false}')
    assert forged != first.payload
    record.history[0] = first._replace(payload=forged)
    env.signal(run, "paid")
    env.run_until_idle()
    env.advance(seconds=60)
    described = env.describe(run)
    assert described["status"] == "failed"
    assert described["error_code"] == "history_corrupt"
    assert "step 0" in str(described["error"])
