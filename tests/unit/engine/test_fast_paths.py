"""The hot path's faster equivalents, each checked against the plain form it replaces:
base32 keys, the generated event codec, frozen-record constructors, the JSON helpers of the
Python-service dispatch, and the host functions' argument reader."""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from engine.abi import IMPORTS
from engine.core_backend import _arg_reader, _guest_bytes, _not_utf8
from engine.determinism import IdempotencyKeys, b32_lower, idempotency_key
from engine.errors import GuestFault
from engine.events import (
    CallEvent,
    CodecError,
    EncodedEvent,
    Event,
    EventType,
    checksum,
    decode,
    encode,
    event_class,
    json_loads,
    record_maker,
)
from engine.services import CallContext, PythonService, _dumps
from engine.status import AbiStatus
from tests.unit.engine.test_determinism import VECTORS

# --- base32 and idempotency keys -----------------------------------------------------------


def reference_b32(data: bytes) -> str:
    return base64.b32encode(data).decode().rstrip("=").lower()


@pytest.mark.parametrize("size", range(0, 70))
def test_b32_lower_matches_base64_for_every_length(size: int) -> None:
    """Random inputs of each length (up to 40 bytes spread, longer ones through base64)."""
    rng = random.Random(size)
    samples = [rng.randbytes(size) for _ in range(300)]
    samples += [b"\x00" * size, b"\xff" * size, bytes(range(size))]
    for data in samples:
        assert b32_lower(data) == reference_b32(data), data.hex()


def test_b32_lower_of_known_text() -> None:
    """RFC 4648's test vectors, lower case and unpadded."""
    vectors = {
        b"": "",
        b"f": "my",
        b"fo": "mzxq",
        b"foo": "mzxw6",
        b"foob": "mzxw6yq",
        b"fooba": "mzxw6ytb",
        b"foobar": "mzxw6ytboi",
    }
    for data, expected in vectors.items():
        assert b32_lower(data) == expected


@pytest.mark.parametrize(("workflow_id", "run_id", "step", "expected"), VECTORS)
def test_per_run_keys_match_the_reference_vectors(
    workflow_id: str, run_id: str, step: int, expected: str
) -> None:
    assert IdempotencyKeys(workflow_id, run_id)(step) == expected


def test_per_run_keys_equal_the_plain_function() -> None:
    """Same keys for random ids (unicode, NULs, empty) and steps; the prefix state is
    copied, so asking for keys in any order gives the same answers."""
    rng = random.Random(7)
    alphabet = "abc-0123\x00é日\U0001f600"
    for _ in range(300):
        wf = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        run = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        keys = IdempotencyKeys(wf, run)
        steps = [rng.randint(0, 10**9) for _ in range(5)]
        first = [keys(s) for s in steps]
        assert [keys(s) for s in reversed(steps)] == first[::-1]
        assert first == [idempotency_key(wf, run, s) for s in steps]
        assert all(len(k) == 52 for k in first)


# --- the event codec -----------------------------------------------------------------------
# The generic forms the generated per-class functions replace, as they were written.

_REF_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def reference_encode(event: Event) -> tuple[int, int, int, str, str]:
    cls = type(event)
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    data: dict[str, Any] = {}
    for name, key in cls.KEYS.items():
        value = getattr(event, name)
        if value != defaults[name]:
            data[key] = list(value) if isinstance(value, tuple) else value
    payload = _REF_ENCODER.encode(data)
    code = event.TYPE.code
    pending = getattr(event, "pending", False)
    digest = "" if pending else checksum(event.step, code, event.ts, payload)
    return (event.step, code, event.ts, payload, digest)


def reference_decode(stored: EncodedEvent) -> Event:
    step, code, ts, payload, _ = stored
    classes = {t.code: event_class(t) for t in EventType}
    if code not in classes:
        raise CodecError(f"step {step}: unknown event type code {code}")
    cls = classes[code]
    try:
        data = json.loads(payload) if payload else {}
    except json.JSONDecodeError as exc:
        raise CodecError(f"step {step}: payload is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CodecError(f"step {step}: payload is not a JSON object")
    tuples = {f.name for f in dataclasses.fields(cls) if isinstance(f.default, tuple)}
    kwargs: dict[str, Any] = {}
    for name, key in cls.KEYS.items():
        if key in data:
            kwargs[name] = tuple(data[key]) if name in tuples else data[key]
    return cls(step=step, ts=ts, **kwargs)


class Level(enum.IntEnum):
    HIGH = 7


class Label(enum.StrEnum):
    DONE = "done"


class Text(str):
    pass


def odd_value(rng: random.Random, default: Any) -> Any:
    """The default half of the time, otherwise a value of its type or of a neighbouring one
    (what a caller may pass: an IntEnum status, a float, a str subclass, a big int)."""
    if rng.random() < 0.4:
        return default
    if isinstance(default, bool):
        return rng.choice([True, False, 0, 1])
    if isinstance(default, int):
        return rng.choice([0, 1, -1, 2**70, -(2**63), 1.5, True, Level.HIGH, AbiStatus.OK])
    if isinstance(default, tuple):
        texts = ["a", 'é\n"', "\u2028", "", "日本"]
        return tuple(rng.choice(texts) for _ in range(rng.randint(0, 3)))
    return rng.choice(STRANGE_TEXTS)


STRANGE_TEXTS: list[Any] = [
    *("", "a", 'quote " back \\ nul \x00 ctl \x1f', "日本語 €", "\u2028\u2029", '{"a":1}'),
    *(Text("sub"), Label.DONE, 3, 2.5, None, ["x", 1], {"k": "v"}),
]


def random_event(rng: random.Random, event_type: EventType) -> Event:
    cls = event_class(event_type)
    values = {
        f.name: odd_value(rng, f.default)
        for f in dataclasses.fields(cls)
        if f.name not in ("step", "ts")
    }
    return cls(step=rng.randint(0, 10**6), ts=rng.randint(0, 2**45), **values)


@pytest.mark.parametrize("event_type", list(EventType), ids=[t.value for t in EventType])
def test_generated_encoder_writes_what_the_generic_one_wrote(event_type: EventType) -> None:
    """Byte for byte the same payload and checksum, for values of expected and odd types."""
    rng = random.Random(event_type.code)
    for _ in range(400):
        event = random_event(rng, event_type)
        stored = encode(event)
        assert type(stored) is EncodedEvent
        assert tuple(stored) == reference_encode(event), event


@pytest.mark.parametrize("event_type", list(EventType), ids=[t.value for t in EventType])
def test_generated_decoder_reads_what_the_generic_one_read(event_type: EventType) -> None:
    """The same event (or the same error) from well-formed payloads, payloads with extra or
    missing keys, surrounding whitespace, and broken ones."""
    rng = random.Random(1000 + event_type.code)
    for _ in range(200):
        stored = EncodedEvent(*reference_encode(random_event(rng, event_type)))
        data = json.loads(stored.payload)
        variants = [
            stored.payload,
            f" {stored.payload}\n",
            stored.payload[:-1],
            json.dumps({**data, "unknown": [1]}),
            json.dumps(dict(list(data.items())[: len(data) // 2])),
        ]
        for payload in variants:
            assert_same_decoding(stored._replace(payload=payload))


@pytest.mark.parametrize(
    "payload",
    [
        *("", "{", "[1]", '"x"', "1", "{} x", "\ufeff{}", "nul", "NaN", '{"a":NaN}', " ", "{}{}"),
        *('{"n": 5}', '{"n": "ab"}', '{"rids": null}', '{"st": "x", "svc": 1}'),
    ],
)
@pytest.mark.parametrize("code", [0, 2, 9, 31, 99])
def test_decoder_errors_are_the_generic_ones(payload: str, code: int) -> None:
    assert_same_decoding(EncodedEvent(4, code, 5, payload, ""))


def assert_same_decoding(stored: EncodedEvent) -> None:
    def outcome(fn: Callable[[EncodedEvent], Event]) -> Any:
        try:
            event = fn(stored)
        except Exception as exc:
            return ("raised", type(exc), str(exc))
        return ("event", type(event), repr(event))

    assert outcome(decode) == outcome(reference_decode), stored


# --- frozen-record constructors ------------------------------------------------------------


@pytest.mark.parametrize("event_type", list(EventType), ids=[t.value for t in EventType])
def test_record_maker_builds_what_init_builds(event_type: EventType) -> None:
    cls = event_class(event_type)
    make = record_maker(cls)
    assert make() == cls()
    rng = random.Random(event_type.code)
    for _ in range(50):
        event = random_event(rng, event_type)
        fields = {f.name: getattr(event, f.name) for f in dataclasses.fields(cls)}
        made = make(**fields)
        assert type(made) is cls
        assert made == event and repr(made) == repr(event)
        try:
            expected_hash: Any = hash(event)
        except TypeError:  # a list or dict among the values
            expected_hash = None
        if expected_hash is not None:
            assert hash(made) == expected_hash
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.step = 1  # type: ignore[misc]


def test_record_maker_keeps_positional_and_keyword_rules() -> None:
    """CallContext takes positional arguments with one default; events are keyword-only."""
    make_context = record_maker(CallContext)
    args = ("t", "wf", "run", 3, "svc", "op", "key")
    assert make_context(*args) == CallContext(*args)
    assert make_context(*args, attempt=4) == CallContext(*args, attempt=4)
    with pytest.raises(TypeError):
        make_context("t")
    with pytest.raises(TypeError):
        record_maker(CallEvent)(3)


def test_record_maker_refuses_classes_it_cannot_build_exactly() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int = 0

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int = 0

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class NotInit:
        a: int = dataclasses.field(default=0, init=False)

    for cls in (NoSlots, PostInit, Factory, NotInit):
        with pytest.raises(TypeError):
            record_maker(cls)


# --- JSON helpers --------------------------------------------------------------------------

JSON_TEXTS = [
    "{}",
    "[]",
    '{"a": [1, 2.5, -3e10, true, false, null], "b": {"c": "é\\u00e9\\n"}}',
    '"text"',
    "12",
    "-0.0",
    "NaN",
    "Infinity",
    " {}",
    "{} ",
    "\n[1]\t",
    "",
    " ",
    "{",
    '{"a" 1}',
    "[1,]",
    "{} {}",
    "\ufeff{}",
    "tru",
    '"unterminated',
    '"\\ud800"',
]


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_loads_agrees_with_json_loads(text: str) -> None:
    def outcome(fn: Callable[[str], Any]) -> Any:
        try:
            value = fn(text)
        except Exception as exc:
            return ("raised", type(exc), str(exc))
        return ("value", repr(value))

    assert outcome(json_loads) == outcome(json.loads)


class Unserialisable:
    pass


def circular() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


DUMPS_VALUES: list[Any] = [
    {},
    [],
    {"a": 1, "b": [1.5, None, True], "c": {"d": 'é\n"\\'}},
    "a string",
    Text("str subclass"),
    Label.DONE,
    Level.HIGH,
    3,
    2**80,
    1.0,
    math.nan,
    -math.inf,
    None,
    (1, "two"),
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"},
    {"bad": Unserialisable()},
    {(1, 2): "tuple key"},
    circular(),
]


@pytest.mark.parametrize("value", DUMPS_VALUES, ids=range(len(DUMPS_VALUES)))
def test_service_dumps_agrees_with_json_dumps(value: Any) -> None:
    """Same text, or the same error, as json.dumps with the options it replaces; an error
    leaves nothing behind for the next call (each call has its own circular-reference memo)."""

    def outcome(fn: Callable[[Any], str]) -> Any:
        try:
            return ("text", fn(value))
        except Exception as exc:
            return ("raised", type(exc), str(exc))

    def reference(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)

    assert outcome(_dumps) == outcome(reference)
    shared = {"x": [1]}
    assert _dumps([shared, shared]) == '[{"x":[1]},{"x":[1]}]'


def test_service_dumps_after_a_failure_has_no_stale_memo() -> None:
    """A failed encoding stops inside open containers; encoding the same containers again
    (once fixed) must not report them as circular."""
    outer: list[Any] = [{"x": 1}, Unserialisable()]
    with pytest.raises(TypeError, match="not JSON serializable"):
        _dumps(outer)
    outer.pop()
    assert _dumps(outer) == '[{"x":1}]'


def test_python_service_follows_a_replaced_target() -> None:
    """Whether the target serves every operation is worked out when it is set, and again
    when it is replaced."""

    class Ops:
        @staticmethod
        def ping(request: Any, **_: Any) -> str:
            return "pong"

    def serve_all(request: Any, *, idempotency_key: str, context: CallContext) -> str:
        return context.operation

    ctx = CallContext("t", "wf", "run", 1, "svc", "ping", "key")
    service = PythonService(Ops)
    assert service.call("svc", "ping", "{}", ctx) == (AbiStatus.OK, '"pong"')
    service.target = serve_all
    assert service.call("svc", "ping", "{}", ctx) == (AbiStatus.OK, '"ping"')
    service.target = Ops
    assert service.call("svc", "ping", "{}", ctx) == (AbiStatus.OK, '"pong"')
    assert service.call("svc", "ping", "{", ctx)[0] == AbiStatus.PERMANENT


# --- the host functions' argument reader ---------------------------------------------------


class FakeMemory:
    """What the reader asks of a CoreInstance: the memory view and the string limit."""

    def __init__(self, data: bytes, limit: int) -> None:
        self.data = data
        self._max_string = limit

    def _memory_view(self) -> tuple[bytes, int]:
        return self.data, len(self.data)


def reference_args(name: str, params: str, memory: FakeMemory, raw: tuple[int, ...]) -> Any:
    """What the generated reader must do, written as a plain loop over the signature: each
    string read left to right with ``_guest_bytes`` and decoded as strict UTF-8, integers
    passed through."""
    view, size = memory._memory_view()

    def read(ptr: int, length: int) -> str:
        data = _guest_bytes(name, view, size, ptr, length, memory._max_string)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(name, ptr, exc) from None

    values: list[Any] = []
    index = 0
    for code in params:
        if code == "s":
            values.append(read(raw[index], raw[index + 1]))
            index += 2
        else:
            values.append(raw[index])
            index += 1
    return tuple(values)


@pytest.mark.parametrize("imp", [i for i in IMPORTS if "s" in i.params], ids=lambda i: i.name)
def test_argument_reader_reads_and_refuses_like_the_generic_reader(imp: Any) -> None:
    rng = random.Random(imp.name)
    reader: Any = _arg_reader(imp)
    memory = FakeMemory(rng.randbytes(64) + "ok é 日本".encode() * 8 + b"\xff\xfe" * 8, 40)
    size = len(memory.data)
    interesting = [0, 1, 7, 64, size - 3, size, size + 1, 2**31 - 1, -1, -(2**31), 2**32 - 1]
    for _ in range(300):
        raw: list[int] = []
        for ch in imp.params:
            if ch == "s":
                raw += [rng.choice([*interesting, rng.randrange(size)]), rng.choice([0, 3, 40, 41])]
            else:
                raw.append(rng.randint(-(2**40), 2**40))

        def outcome(fn: Callable[[], Any]) -> Any:
            try:
                return ("args", fn())
            except GuestFault as fault:
                return ("fault", str(fault))

        args = tuple(raw)
        expected = outcome(functools.partial(reference_args, imp.name, imp.params, memory, args))
        assert outcome(functools.partial(reader, memory, args)) == expected, raw


def test_record_maker_orders_parameters_as_the_dataclass_does() -> None:
    """Keyword-only fields come after the others in ``__init__``, wherever declared."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Mixed:
        a: int
        b: int = dataclasses.field(default=2, kw_only=True)
        c: str = "c"

    make = record_maker(Mixed)
    assert make(1) == Mixed(1)
    assert make(1, "x", b=5) == Mixed(1, "x", b=5)
    with pytest.raises(TypeError):
        make(1, "x", 5)
