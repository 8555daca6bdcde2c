"""``cleat_workflow.testing.replay``: a Python workflow's run, exported, replays against
the same code and fails with the ``NondeterminismError`` naming the step against code whose
second call changed (``apps/scenarios_changed.py``), as Temporal's replayer does."""

from __future__ import annotations

import pytest

from engine.errors import NondeterminismError, PermanentError
from engine.outcomes import Suspended
from tests.fixtures import FakeService


def recorded_calls_run(scenarios_wasm: bytes) -> dict[str, object]:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    shop = FakeService(
        {
            "price": {"cents": 1200},
            "reject": PermanentError("out of stock"),
            "flaky": RuntimeError("503"),
            "eventually": [RuntimeError("busy"), {"ok": 1}],
        }
    )
    env = PythonWorkflowEnvironment({"shop": shop})
    env.deploy("calls", scenarios_wasm)
    run = env.run("calls", {"sku": "book"})  # waits on its first retry backoff
    return env.export(run).to_json()


def test_an_exported_python_run_replays_against_its_code_and_not_against_a_change(
    scenarios_wasm: bytes, scenarios_changed_wasm: bytes
) -> None:
    from cleat_workflow.testing import replay

    history = recorded_calls_run(scenarios_wasm)
    result = replay(history, scenarios_wasm)
    assert isinstance(result.outcome, Suspended)
    assert result.replayed_steps == len(history["history"])  # type: ignore[arg-type]

    with pytest.raises(NondeterminismError) as diverged:
        replay(history, scenarios_changed_wasm)
    assert diverged.value.step == 1
    assert "reject" in diverged.value.recorded
    assert "refund" in diverged.value.attempted
