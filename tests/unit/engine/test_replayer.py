"""``engine.testing.replay``: an exported history replayed against a new build, as
Temporal's replayer does. The same code replays it; code that diverges inside the history
fails with the ``NondeterminismError`` naming the step; a finished run that ends differently
is a ``ReplayMismatch``; nothing is called or written, and the export survives JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import NondeterminismError
from engine.outcomes import Completed, Suspended
from engine.recorded import InvalidExport, RecordedRun
from engine.testing import ReplayMismatch, WorkflowEnvironment, replay
from tests.fixtures import FakeService
from tests.fixtures.histories.regenerate import drive_order, order_module
from tests.fixtures.wat import Wat


def shop() -> FakeService:
    return FakeService(
        {
            "reserve": lambda req: {"reserved": req["item"]},
            "charge": [RuntimeError("gateway busy"), {"charged": 12}],
        }
    )


def recorded_order(*, finish: bool = True) -> RecordedRun:
    env = WorkflowEnvironment(services={"shop": shop()})
    env.deploy("order", order_module().wasm())
    run = env.start("order", {"customer": "ada"})
    if finish:
        drive_order(env, run)
    else:
        env.run_until_idle()  # waiting for "paid"
    return env.export(run)


def test_the_same_build_replays_an_exported_run_through_json(tmp_path: Path) -> None:
    """The export is written as a file and read back; every recorded event is matched and
    the run completes with its recorded result."""
    recorded = recorded_order()
    assert recorded.status == "done"
    path = tmp_path / "order.json"
    path.write_text(recorded.dumps(), encoding="utf-8")

    result = replay(path, order_module().wasm())

    assert result.outcome == Completed(recorded.result or "")
    assert result.replayed_steps == len(recorded.history)
    assert result.recorded == ()


def test_a_build_that_calls_something_else_fails_naming_the_step() -> None:
    recorded = recorded_order()
    with pytest.raises(NondeterminismError) as diverged:
        replay(recorded.to_json(), order_module(charge="refund").wasm())
    assert diverged.value.step == 4
    assert diverged.value.recorded == 'call(shop, charge, {"amount":12})'
    assert diverged.value.attempted == 'call(shop, refund, {"amount":12})'
    assert "non-determinism at step 4" in str(diverged.value)


def test_a_waiting_run_replays_up_to_its_wait_and_calls_nothing() -> None:
    """A run still waiting for "paid": the change after the wait is not in its history yet,
    so both builds replay it; replay stops at the wait."""
    recorded = recorded_order(finish=False)
    assert recorded.status == "ready"
    for build in (order_module(), order_module(charge="refund")):
        result = replay(recorded, build.wasm())
        assert isinstance(result.outcome, Suspended)
        assert result.replayed_steps == len(recorded.history)


def test_code_that_stops_before_the_recorded_steps_names_the_first_lost_step() -> None:
    recorded = recorded_order()
    w = Wat()
    w.run(
        f"(call $rec (call $durable_call {w.s('shop')} {w.s('reserve')} "
        f"{w.js({'item': 'book'})})) (call $finish)"
    )
    with pytest.raises(NondeterminismError) as diverged:
        replay(recorded, w.wasm())
    assert diverged.value.step == 1
    assert diverged.value.attempted == "no host function: the entry point returned"


def test_a_finished_run_that_now_ends_differently_is_a_replay_mismatch() -> None:
    env = WorkflowEnvironment(services={"shop": shop()})
    one = Wat()
    one.run(
        f"(call $rec (call $durable_call {one.s('shop')} {one.s('reserve')} "
        f"{one.js({'item': 'book'})})) (call $finish)"
    )
    env.deploy("short", one.wasm())
    recorded = env.export(env.run("short"))
    other = Wat()
    other.run(
        f"(call $rec (call $durable_call {other.s('shop')} {other.s('reserve')} "
        f"{other.js({'item': 'book'})})) (call $note {other.s('extra')}) (call $finish)"
    )
    with pytest.raises(ReplayMismatch, match="completed with"):
        replay(recorded, other.wasm())


def test_a_document_that_is_not_an_export_names_the_field() -> None:
    document = recorded_order().to_json()
    with pytest.raises(InvalidExport, match="format"):
        replay({**document, "format": "something"}, b"")
    with pytest.raises(InvalidExport, match="start_ms: expected an integer"):
        RecordedRun.from_json({**document, "start_ms": "soon"})
    with pytest.raises(InvalidExport, match="history"):
        RecordedRun.load(json.dumps({**document, "history": [{"step": 0}]}))
