"""The operator's retry rule (``engine.lifecycle.retry_plan``): which last step a retry in
each mode makes again, and what it tells the operator."""

from __future__ import annotations

import pytest

from engine import lifecycle
from engine.events import CallEvent, SleepEvent
from engine.status import AbiStatus


def call(status: AbiStatus) -> CallEvent:
    return CallEvent(step=3, ts=1, service="shop", operation="reserve", request="{}", status=status)


@pytest.mark.parametrize("status", [AbiStatus.ERROR, AbiStatus.TIMEOUT, AbiStatus.AMBIGUOUS])
def test_a_retryable_failure_is_made_again_in_both_modes(status: AbiStatus) -> None:
    for mode in lifecycle.RETRY_MODES:
        plan = lifecycle.retry_plan(call(status), mode)
        assert plan.forgets_step == 3 and plan.effect.startswith("re-executes step 3")


@pytest.mark.parametrize("status", [AbiStatus.PERMANENT, AbiStatus.NOT_FOUND, AbiStatus.DENIED])
def test_a_permanent_failure_is_replayed_unless_asked_to_reexecute(status: AbiStatus) -> None:
    replay = lifecycle.retry_plan(call(status))
    assert replay.forgets_step is None
    assert "fail the same way" in replay.effect and "reexecute_last_call" in replay.effect
    again = lifecycle.retry_plan(call(status), lifecycle.RETRY_REEXECUTE_LAST_CALL)
    assert again.forgets_step == 3 and "call(shop, reserve" in again.effect


def test_a_successful_or_other_last_step_is_replayed() -> None:
    for last in (call(AbiStatus.OK), SleepEvent(step=2, ts=1, duration_ms=5), None):
        plan = lifecycle.retry_plan(last, lifecycle.RETRY_REEXECUTE_LAST_CALL)
        assert plan.forgets_step is None and plan.effect.startswith("replays the history")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="retry mode"):
        lifecycle.retry_plan(None, "sideways")
