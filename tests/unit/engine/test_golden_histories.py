"""Golden histories: checked-in JSON histories (tests/fixtures/histories, see its README)
replay to the recorded outcome with services that must not be called. One of them is
known to be non-deterministic against its module and must fail with ``nondeterminism``,
as Temporal's replayer tests do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from engine.errors import ErrorCode
from engine.events import EventType, history_from_json
from engine.outcomes import Completed, Failed, SegmentResult
from engine.testing import WorkflowEnvironment

HISTORIES = Path(__file__).parents[2] / "fixtures" / "histories"
GOLDEN_FILES = sorted(HISTORIES.glob("*.json"))


class UntouchablePlugins:
    """Every attribute lookup is a plugin call replay must not make."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        raise AttributeError(name)


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def replay(golden: dict[str, Any], plugins: UntouchablePlugins) -> SegmentResult:
    """Replay a golden history in a fresh environment holding nothing but its module."""
    env = WorkflowEnvironment(start_ms=golden["start_ms"], plugins={"tok": plugins})
    wasm = wasmtime.wat2wasm("\n".join(golden["wat"]))
    env.deploy(golden["definition"], wasm, version=golden["version"])
    record = env.storage.create_run(
        golden["definition"],
        golden["version"],
        golden["input"],
        run_id=golden["run_id"],
        workflow_id=golden["workflow_id"],
    )
    for event in history_from_json(golden["history"]):
        record.history.append(event)
    return env.replay(record.run_id)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.stem for p in GOLDEN_FILES])
def test_golden_history_replays_to_its_recorded_outcome(path: Path) -> None:
    """The history replays to the recorded result (or, for the non-deterministic golden,
    to the recorded nondeterminism error) without calling a service or a plugin and
    without recording anything new."""
    golden = load(path)
    plugins = UntouchablePlugins()
    result = replay(golden, plugins)

    expect = golden["expect"]
    if expect["status"] == "done":
        assert result.outcome == Completed(expect["result"])
        assert result.recorded == ()
        assert result.replayed_steps == len(golden["history"])
    else:
        assert result.outcome == Failed(ErrorCode(expect["error_code"]), expect["error"])
    assert plugins.calls == []


def test_the_goldens_hold_a_nondeterministic_one_and_many_event_types() -> None:
    """The set is worth replaying: one golden expects nondeterminism, and together they
    record most event types of the codec."""
    goldens = [load(path) for path in GOLDEN_FILES]
    assert {g["expect"]["status"] for g in goldens} == {"done", "failed"}
    assert [g["expect"].get("error_code") for g in goldens].count("nondeterminism") == 1
    rows = [row for g in goldens for row in g["history"]]
    # "type" is there for readers; it must name the wire code the row holds.
    assert all(EventType(row["type"]).code == row["type_code"] for row in rows)
    assert len({row["type"] for row in rows}) >= 25


def test_a_tampered_golden_history_is_reported_corrupt() -> None:
    """Changing a recorded answer without its checksum is caught before any replay."""
    golden = load(HISTORIES / "order.json")
    first = golden["history"][0]
    first["payload"] = first["payload"].replace("book", "lamp")
    result = replay(golden, UntouchablePlugins())
    assert isinstance(result.outcome, Failed)
    assert result.outcome.code is ErrorCode.HISTORY_CORRUPT
    assert "checksum mismatch at step 0" in result.outcome.message
