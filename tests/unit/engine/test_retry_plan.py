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


# --- the locks a retried run takes again (``engine.lifecycle.locks_held``) ------------------


def test_locks_held_are_those_acquired_and_not_released_nor_expired() -> None:
    from engine.events import AcquireLockEvent, ReleaseLockEvent

    history = [
        AcquireLockEvent(step=0, ts=1_000, key="a", ttl_ms=0, acquired=True),
        AcquireLockEvent(step=1, ts=1_000, key="b", ttl_ms=500, acquired=True),
        AcquireLockEvent(step=2, ts=1_000, key="c", ttl_ms=0, acquired=False),
        AcquireLockEvent(step=3, ts=1_000, key="d", ttl_ms=0, acquired=True),
        ReleaseLockEvent(step=4, ts=1_100, key="d"),
        AcquireLockEvent(step=5, ts=1_200, key="e", ttl_ms=10_000, acquired=True),
    ]
    held = lifecycle.locks_held(history, now_ms=1_400)
    assert held == [
        lifecycle.HeldLock("a", None),
        lifecycle.HeldLock("b", 1_500),
        lifecycle.HeldLock("e", 11_200),
    ]
    # Past b's TTL only the others remain; a lock taken again after its release is held.
    later = lifecycle.locks_held(history, now_ms=2_000)
    assert [h.key for h in later] == ["a", "e"]
    again = [*history, AcquireLockEvent(step=6, ts=1_300, key="d", ttl_ms=0, acquired=True)]
    assert [h.key for h in lifecycle.locks_held(again, now_ms=2_000)] == ["a", "e", "d"]
