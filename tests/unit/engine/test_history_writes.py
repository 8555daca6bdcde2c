"""When a run's events reach storage (engine.session.replay, "Persistence"): before anything
leaves the process -- the next call, a batch of calls, a write-ahead call's dispatch -- and
with the finalize; never on their own right after a call (the guest computes with the reply
first), so the last call of a segment costs no write of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.events import CallEvent, Event
from engine.inmemory import InMemoryStorage
from engine.services import CallContext
from engine.storage import RunRef
from engine.testing import WorkflowEnvironment
from tests.fixtures import event_types
from tests.fixtures.wat import Wat


class Shop:
    """A service that notes, at each call, how many of the run's events are stored."""

    def __init__(self) -> None:
        self.storage: InMemoryStorage | None = None
        self.stored_at_call: list[tuple[str, int]] = []

    def __call__(self, request: Any, *, idempotency_key: str, context: CallContext) -> Any:
        assert self.storage is not None
        stored = len(self.storage.runs[context.run_id].history)
        self.stored_at_call.append((context.operation, stored))
        return {"op": context.operation}


@pytest.fixture
def appends() -> list[int]:
    """The number of events of each ``append_events`` call the runs made."""
    return []


@contextlib.contextmanager
def environment(
    appends: list[int], config: EngineConfig | None = None
) -> Iterator[tuple[WorkflowEnvironment, Shop]]:
    shop = Shop()
    env = WorkflowEnvironment({"shop": shop}, config=config)
    shop.storage = env.storage
    real = env.storage.append_events

    def counted(run: RunRef, events: Sequence[Event]) -> None:
        appends.append(len(events))
        real(run, events)

    env.storage.append_events = counted  # type: ignore[method-assign]
    try:
        yield env, shop
    finally:
        if config is not None:
            env.runtime.close()


def calls(w: Wat, *ops: str) -> str:
    return "\n".join(
        f"(call $rec (call $durable_call {w.s('shop')} {w.s(op)} {w.js({})}))" for op in ops
    )


def test_one_call_is_written_by_the_finalize_alone(appends: list[int]) -> None:
    """A segment with one call makes no append: its event is committed with the run's end."""
    with environment(appends) as (env, shop):
        w = Wat()
        w.run(f"{calls(w, 'a')}\n(call $finish)")
        env.deploy("one", w.wasm())
        run = env.run("one")
        assert env.result(run) == [[0, '{"op":"a"}']]
        assert appends == []
        assert event_types(env, run) == ["call"]
        assert shop.stored_at_call == [("a", 0)]


def test_a_call_is_stored_before_the_next_call_goes_out(appends: list[int]) -> None:
    """Three calls: before the second goes out the first is stored, before the third the
    second; the third comes with the finalize."""
    with environment(appends) as (env, shop):
        w = Wat()
        w.run(f"{calls(w, 'a', 'b', 'c')}\n(call $finish)")
        env.deploy("three", w.wasm())
        run = env.run("three")
        assert shop.stored_at_call == [("a", 0), ("b", 1), ("c", 2)]
        assert appends == [1, 1]
        assert event_types(env, run) == ["call"] * 3


def test_a_batch_goes_out_after_what_came_before_it_is_stored(appends: list[int]) -> None:
    """A call, then a batch of two: the first call is stored before the batch's calls go
    out; the batch's events come with the finalize."""
    with environment(appends) as (env, shop):
        w = Wat()
        batch = [{"service": "shop", "operation": op, "request": "{}"} for op in ("b", "c")]
        w.run(
            f"{calls(w, 'a')}\n(call $rec (call $durable_call_many {w.js(batch)}))\n(call $finish)"
        )
        env.deploy("batch", w.wasm())
        run = env.run("batch")
        assert sorted(shop.stored_at_call) == [("a", 0), ("b", 1), ("c", 1)]
        assert appends == [1]
        assert event_types(env, run) == ["call"] * 3


def test_a_write_ahead_intent_is_stored_before_its_call(appends: list[int]) -> None:
    """A write-ahead call's intent (with the call before it) is stored before the call goes
    out, and completed in place after it."""
    config = EngineConfig(write_ahead_ops=frozenset({"shop.b"}))
    with environment(appends, config) as (env, shop):
        w = Wat()
        w.run(f"{calls(w, 'a', 'b')}\n(call $finish)")
        env.deploy("ahead", w.wasm())
        run = env.run("ahead")
        assert shop.stored_at_call == [("a", 0), ("b", 2)]
        assert appends == [2]
        history = env.history(run)
        assert [type(e) for e in history] == [CallEvent, CallEvent]
        assert not any(e.pending for e in history if isinstance(e, CallEvent))


def test_a_guest_that_fails_after_a_call_keeps_the_call_in_its_history(
    appends: list[int],
) -> None:
    """The guest traps right after its call's reply: the finalize stores the call with the
    failure, so the retry answers it from the history instead of calling again."""
    with environment(appends) as (env, shop):
        w = Wat()
        w.run(f"{calls(w, 'a')}\n(unreachable)")
        env.deploy("trap", w.wasm())
        run = env.run("trap")
        assert event_types(env, run)[:1] == ["call"]
        assert appends == []
        env.advance(seconds=3600)
        assert shop.stored_at_call == [("a", 0)], "the retry called again"
