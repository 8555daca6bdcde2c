"""The run's state machine (engine.lifecycle) on its own: what each outcome and each close
makes of a run. The stores' application of it is tested by the scenario suite
(tests/integration/test_lifecycle_scenarios.py) against both environments."""

from __future__ import annotations

import pytest

from engine import lifecycle
from engine.errors import ErrorCode
from engine.events import CallEvent, PluginCallEvent, SleepEvent
from engine.session import Completed, ContinuedAsNew, Suspended, WaitCondition, WaitKind, failed
from engine.status import AbiStatus

NOW = 1_000_000
RUN = lifecycle.RunState(workflow_id="wf-1", version=4, attempt=1)
POLICY = lifecycle.RunPolicy()


def test_a_completion_ends_the_run_done_and_releases_its_locks() -> None:
    t = lifecycle.after_segment(Completed('{"ok":1}'), RUN, POLICY, NOW)
    assert (t.status, t.result, t.error, t.error_code) == ("done", '{"ok":1}', None, None)
    assert t.ended and t.release_locks_of == "wf-1"
    assert t.attempt is None and t.wake_at_ms is None and t.waiting_on is None
    assert t == lifecycle.completion(Completed('{"ok":1}'), "wf-1")
    assert lifecycle.completion(failed(ErrorCode.ERROR, "x"), "wf-1") is None
    assert t.updates_failure == "the run ended (done) before answering"


def test_a_suspension_waits_until_its_deadline_or_the_recheck() -> None:
    timer = Suspended(WaitCondition(WaitKind.TIMER, wake_at_ms=NOW + 60_000))
    signals = Suspended(WaitCondition(WaitKind.SIGNALS, signals=("go",)))
    t = lifecycle.after_segment(timer, RUN, POLICY, NOW)
    assert (t.status, t.wake_at_ms, t.attempt, t.ended) == ("ready", NOW + 60_000, 1, False)
    assert t.waiting_on == timer.wait.as_dict() and t.release_locks_of is None
    assert lifecycle.after_segment(signals, RUN, POLICY, NOW).wake_at_ms is None
    recheck = lifecycle.RunPolicy(wait_recheck_ms=300_000)
    assert lifecycle.after_segment(signals, RUN, recheck, NOW).wake_at_ms == NOW + 300_000
    assert lifecycle.after_segment(timer, RUN, recheck, NOW).wake_at_ms == NOW + 60_000


def test_a_wakeup_that_arrived_during_the_segment_makes_the_run_due_at_once() -> None:
    arrived = lifecycle.RunState("wf-1", 4, attempt=3, wakeup_arrived=True)
    wait = Suspended(WaitCondition(WaitKind.SIGNALS, signals=("go",)))
    t = lifecycle.after_segment(wait, arrived, POLICY, NOW)
    assert (t.wake_at_ms, t.attempt) == (NOW, 1)  # a suspension starts the attempts again


def test_a_retryable_failure_is_retried_with_backoff_then_dead_lettered() -> None:
    retry = lifecycle.RetryPolicy(max_attempts=3, initial_interval_s=1, backoff_coefficient=2)
    policy = lifecycle.RunPolicy(retry=retry)
    error = failed(ErrorCode.ERROR, "boom")
    first = lifecycle.after_segment(error, RUN, policy, NOW)
    assert (first.status, first.wake_at_ms, first.attempt) == ("ready", NOW + 1000, 2)
    assert (first.error, first.error_code, first.forget_failed_call) == ("boom", "error", True)
    assert first.waiting_on == {"kind": "retry", "description": "retry 2 of 3 after error"}
    assert not first.ended and first.release_locks_of is None
    second = lifecycle.after_segment(error, lifecycle.RunState("wf-1", 4, 2), policy, NOW)
    assert (second.wake_at_ms, second.attempt) == (NOW + 2000, 3)
    last = lifecycle.after_segment(error, lifecycle.RunState("wf-1", 4, 3), policy, NOW)
    assert (last.status, last.error_code, last.attempt) == ("dead_lettered", "error", None)
    assert last.ended and last.release_locks_of == "wf-1" and not last.forget_failed_call


def test_backoff_is_capped_at_the_longest_interval() -> None:
    retry = lifecycle.RetryPolicy(
        10, initial_interval_s=1, backoff_coefficient=10, max_interval_s=60
    )
    assert [retry.delay_s(a) for a in (1, 2, 3, 4)] == [1, 10, 60, 60]


def test_a_permanent_failure_fails_and_nondeterminism_dead_letters_at_once() -> None:
    permanent = lifecycle.after_segment(failed(ErrorCode.PERMANENT, "no"), RUN, POLICY, NOW)
    assert (permanent.status, permanent.error_code) == ("failed", "permanent")
    drift = lifecycle.after_segment(failed(ErrorCode.NONDETERMINISM, "step 0"), RUN, POLICY, NOW)
    assert (drift.status, drift.error_code) == ("dead_lettered", "nondeterminism")


def test_continue_as_new_ends_the_run_and_names_its_successor_keeping_the_locks() -> None:
    same = lifecycle.after_segment(ContinuedAsNew('{"n":2}', 0), RUN, POLICY, NOW)
    assert (same.status, same.result) == ("done", lifecycle.CONTINUED_RESULT)
    assert same.successor == lifecycle.Successor('{"n":2}', 4)
    assert same.release_locks_of is None  # held by the workflow id the successor carries on
    assert lifecycle.after_segment(ContinuedAsNew("{}", 7), RUN, POLICY, NOW).successor == (
        lifecycle.Successor("{}", 7)
    )


def test_closes_from_outside_end_the_run_and_release_its_locks() -> None:
    terminated = lifecycle.terminate("wf-1", "stop")
    assert (terminated.status, terminated.error, terminated.error_code) == (
        "terminated",
        "stop",
        "terminated",
    )
    forced = lifecycle.force_complete("wf-1", "42")
    assert (forced.status, forced.result, forced.error) == ("done", "42", None)
    broken = lifecycle.force_fail("wf-1", "given up", "permanent")
    assert (broken.status, broken.error_code) == ("failed", "permanent")
    assert {t.release_locks_of for t in (terminated, forced, broken)} == {"wf-1"}
    assert all(t.ended for t in (terminated, forced, broken))


@pytest.mark.parametrize(
    ("action", "status", "refusal"),
    [
        ("terminate", "ready", None),
        ("terminate", "running", None),
        ("terminate", "done", "already done"),
        ("force_fail", "dead_lettered", "already dead_lettered"),
        ("force_complete", "failed", None),
        ("force_complete", "done", "already done"),
        ("cancel", "terminated", "already terminated"),
        ("cancel", "paused", None),
    ],
)
def test_which_closes_a_status_allows(action: str, status: str, refusal: str | None) -> None:
    assert lifecycle.close_refusal(action, status) == refusal


def test_each_parent_close_policy() -> None:
    assert lifecycle.child_close("terminate", "p") == lifecycle.ChildClose(
        "terminate", "parent p closed"
    )
    assert lifecycle.child_close("request_cancel", "p") == lifecycle.ChildClose(
        "request_cancel", "parent p closed"
    )
    assert lifecycle.child_close("abandon", "p") is None


def test_a_retry_forgets_only_a_call_that_failed_retryably() -> None:
    def call(status: AbiStatus) -> CallEvent:
        return CallEvent(step=3, ts=0, service="s", operation="o", status=status)

    def plugin(status: AbiStatus, streaming: bool) -> PluginCallEvent:
        return PluginCallEvent(
            step=3, ts=0, plugin="p", function="f", status=status, streaming=streaming
        )

    assert lifecycle.is_forgettable_failed_call(call(AbiStatus.ERROR))
    assert lifecycle.is_forgettable_failed_call(call(AbiStatus.TIMEOUT))
    assert not lifecycle.is_forgettable_failed_call(call(AbiStatus.OK))
    assert not lifecycle.is_forgettable_failed_call(call(AbiStatus.PERMANENT))
    assert lifecycle.is_forgettable_failed_call(plugin(AbiStatus.ERROR, streaming=False))
    assert not lifecycle.is_forgettable_failed_call(plugin(AbiStatus.ERROR, streaming=True))
    sleep = SleepEvent(step=3, ts=0, duration_ms=5, status=AbiStatus.CANCELLED)
    assert not lifecycle.is_forgettable_failed_call(sleep)


def test_the_workers_report_of_each_outcome() -> None:
    assert lifecycle.outcome_kind(Completed("1")) == ("completed", "")
    assert lifecycle.outcome_kind(failed(ErrorCode.ERROR, "x" * 300)) == (
        "failed",
        "error: " + "x" * 200,
    )
    wait = WaitCondition(WaitKind.SIGNALS, signals=("go",))
    assert lifecycle.outcome_kind(Suspended(wait)) == ("suspended", "signals go")
    assert lifecycle.outcome_kind(ContinuedAsNew("{}", 0)) == ("continued", "")


def test_the_in_memory_store_refuses_the_closes_the_rule_refuses() -> None:
    """engine.testing's operator closes go through close_refusal, as the services' do: an
    ended run cannot be terminated or force-failed, a done one not force-completed; an
    unknown run is NOT_FOUND."""
    from engine.errors import Refused
    from engine.testing import WorkflowEnvironment
    from tests.fixtures.wat import Wat

    w = Wat()
    w.run("(call $finish)")
    env = WorkflowEnvironment()
    env.deploy("quick", w.wasm())
    run = env.run("quick")
    for close in (
        lambda: env.terminate(run),
        lambda: env.force_fail(run, "no"),
        lambda: env.force_complete(run, 1),
    ):
        with pytest.raises(Refused, match="is already done") as refused:
            close()
        assert refused.value.status == AbiStatus.PERMANENT
    assert env.history(run) == []  # a refused close writes nothing
    with pytest.raises(Refused) as missing:
        env.terminate("no-such-run")
    assert missing.value.status == AbiStatus.NOT_FOUND
