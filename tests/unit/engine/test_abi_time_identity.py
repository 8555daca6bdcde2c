"""ABI v1, time, randomness, identity and logging: now, random, uuid, side_effect,
workflow_id, run_id, version, min_version, durable_log, json_parse, json_stringify."""

from __future__ import annotations

import json
import logging
import uuid

import pytest

from engine.events import DurableLogEvent, SideEffectEvent
from engine.inmemory import InMemoryStorage
from engine.outcomes import Completed
from engine.services import Services
from engine.session import RunInfo
from engine.storage import RunRef
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of
from tests.fixtures.wat import Wat

# --- now ------------------------------------------------------------------------------------


def clock_module() -> Wat:
    w = Wat()
    ping = f"(call $durable_call {w.s('svc')} {w.s('ping')} {w.js({})})"
    w.run(
        f"""
    (call $recn (call $now))
    (drop {ping})
    (call $recn (call $now))
    (drop (call $durable_sleep (i64.const 60000)))
    (call $recn (call $now))
    (drop {ping})
    (call $recn (call $now))
    (call $finish)"""
    )
    return w


CLOCK_WAT = clock_module().source()


def test_now_is_virtual_time_that_moves_with_recorded_events() -> None:
    """now() starts at the run's creation, moves to each event's time, reads the sleep's
    wake-up time after a sleep (not the later moment the worker ran), and replays equal."""
    svc = FakeService({"ping": "{}"})
    env = WorkflowEnvironment({"svc": svc})
    env.deploy("clock", clock_module().wasm())
    created = env.clock.ms
    run = env.start("clock")
    env.clock.advance(500)  # the worker picks the run up half a second later
    env.run_until_idle()
    assert wait_of(env, run)["wake_at_ms"] == created + 500 + 60_000
    env.advance(seconds=90)  # the worker is late: 30 s after the timer was due

    assert env.result(run) == [
        created,
        created + 500,
        created + 500 + 60_000,
        created + 500 + 90_000,
    ]
    assert event_types(env, run) == ["call", "sleep", "call"]
    assert_replays_quietly(env, run, watch=[svc])


# --- random, uuid, ids, version -------------------------------------------------------------


def identity_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $random))
    (call $recn (call $random))
    (call $rec (call $uuid {w.s("a")}))
    (call $rec (call $uuid {w.s("a")}))
    (call $rec (call $uuid {w.s("b")}))
    (drop (call $set_query_state {w.s("before_sleep")} {w.transcript()}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $rec (call $uuid {w.s("a")}))
    (call $recn (call $random))
    (call $rec (call $workflow_id))
    (call $rec (call $run_id))
    (call $recn (call $version))
    (call $finish)"""
    )
    return w


IDENTITY_WAT = identity_module().source()


def test_random_uuid_and_ids_are_stable_across_segments_and_replay() -> None:
    """random() gives a stream of distinct values; uuid(seed) is a UUID fixed by (run,
    step, seed): equal for the same seed at the same step, different for another seed or a
    later step. What the first segment saw is what the resumed and replayed runs see."""
    env = WorkflowEnvironment()
    env.deploy("ids", identity_module().wasm())
    env.deploy("ids", identity_module().wasm())  # version 2 is the default now
    run = env.run("ids", workflow_id="order-7")
    seen_before_sleep = env.describe(run)["query_state"]["before_sleep"]
    env.advance(seconds=1)

    result = env.result(run)
    r1, r2, (s1, a1), (s2, a2), (s3, b), (s4, a_later), r3, wf, rid, version = result
    assert json.dumps(result, separators=(",", ":")).startswith(seen_before_sleep)
    assert len({r1, r2, r3}) == 3
    assert all(-(2**63) <= r < 2**63 for r in (r1, r2, r3))
    assert (s1, s2, s3, s4) == (0, 0, 0, 0)
    assert a1 == a2
    assert len({a1, b, a_later}) == 3
    assert all(str(uuid.UUID(u)) == u for u in (a1, b, a_later))
    assert wf == [0, "order-7"]
    assert rid == [0, run]
    assert version == 2
    assert_replays_quietly(env, run)

    other = env.run("ids", version=1)
    env.advance(seconds=1)
    r1_other, _, (_, a1_other), *_, version_other = env.result(other)
    assert (r1_other, a1_other) != (r1, a1), "another run must get other values"
    assert version_other == 1


def versions_module() -> Wat:
    w = Wat()
    w.run("(call $recn (call $version)) (call $recn (call $min_version)) (call $finish)")
    return w


VERSIONS_WAT = versions_module().source()


def test_version_and_min_version_come_from_the_run() -> None:
    """version() and min_version() answer the RunInfo the worker built for the segment."""
    env = WorkflowEnvironment()
    module = env.runtime.load(versions_module().wasm())
    storage = InMemoryStorage(lambda: 0)
    info = RunInfo(
        ref=RunRef("default", "wf", "run"),
        definition="versions",
        version=5,
        input="null",
        start_ms=0,
        min_version=3,
    )
    result = env.runtime.run_segment(module, info, [], storage, Services.from_settings())
    assert result.outcome == Completed("[5,3]")


# --- side_effect ----------------------------------------------------------------------------


def side_effect_module(value: str) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $side_effect {w.s(value)}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $finish)"""
    )
    return w


SIDE_EFFECT_WAT = side_effect_module("first").source()


def test_side_effect_returns_the_first_executions_value_ever_after() -> None:
    """side_effect records its value; a resumed run whose code now offers another value
    still gets the recorded one (side_effect is never compared, only fed back)."""
    env = WorkflowEnvironment()
    env.deploy("se", side_effect_module("first").wasm())
    run = env.run("se")
    env._modules[("se", 1)] = env.runtime.load(side_effect_module("second").wasm())
    env.advance(seconds=1)

    assert env.result(run) == [[0, "first"]]
    [effect, _sleep] = env.history(run)
    assert isinstance(effect, SideEffectEvent)
    assert effect.value == "first"
    assert_replays_quietly(env, run)


# --- durable_log ----------------------------------------------------------------------------


def log_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $durable_log (i32.const 1) {w.s("hello")}))
    (call $recn (call $durable_log (i32.const 7) {w.s("loud")}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $recn (call $durable_log (i32.const 2) {w.s("after the sleep")}))
    (call $finish)"""
    )
    return w


LOG_WAT = log_module().source()


def test_durable_log_logs_once_and_not_again_on_replay(caplog: pytest.LogCaptureFixture) -> None:
    """Each message is logged when first executed only: not when the next segment replays
    it, not when the finished run is replayed. Levels above 3 are clamped to error."""
    caplog.set_level(logging.DEBUG, logger="cleat.engine")
    env = WorkflowEnvironment()
    env.deploy("log", log_module().wasm())
    run = env.run("log")
    env.advance(seconds=1)
    assert_replays_quietly(env, run)

    assert env.result(run) == [0, 0, 0]
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "cleat.engine"]
    assert logged == [
        (logging.INFO, f"workflow {run} run {run}: hello"),
        (logging.ERROR, f"workflow {run} run {run}: loud"),
        (logging.WARNING, f"workflow {run} run {run}: after the sleep"),
    ]
    logs = [e for e in env.history(run) if isinstance(e, DurableLogEvent)]
    assert [(e.level, e.message) for e in logs] == [
        (1, "hello"),
        (3, "loud"),
        (2, "after the sleep"),
    ]


# --- json_parse, json_stringify -------------------------------------------------------------


def json_module() -> Wat:
    w = Wat()
    text = ' { "b" : 1, "a" : [1, 2.5, "é"] } '
    w.run(
        f"""
    (call $rec (call $json_parse {w.s(text)}))
    (call $rec (call $json_stringify {w.s(text)}))
    (call $rec (call $json_parse {w.s("{oops")}))
    (call $rec (call $json_stringify {w.s("[1,")}))
    (call $finish)"""
    )
    return w


JSON_WAT = json_module().source()


def test_json_helpers_normalise_or_refuse_and_record_nothing() -> None:
    """json_parse answers normalised JSON (sorted keys, compact), json_stringify compact
    JSON in the given order; invalid input is PERMANENT. Both are pure: no event."""
    env = WorkflowEnvironment()
    env.deploy("json", json_module().wasm())
    run = env.run("json")
    parsed, stringified, bad_parse, bad_stringify = env.result(run)
    assert parsed == [0, '{"a":[1,2.5,"é"],"b":1}']
    assert stringified == [0, '{"b":1,"a":[1,2.5,"é"]}']
    assert bad_parse[0] == bad_stringify[0] == 2
    assert bad_parse[1].startswith("invalid JSON")
    assert bad_stringify[1].startswith("invalid JSON")
    assert event_types(env, run) == []
    assert_replays_quietly(env, run)
