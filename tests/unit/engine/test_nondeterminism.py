"""Non-determinism: a resumed run whose code asks a different question than its history
recorded is stopped with error code ``nondeterminism``, naming the step, the recorded event
and the new call (ABI.md section 3). The divergent code is swapped in for the same
name/version while the run waits, as a careless redeploy would."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine.config import EngineConfig
from engine.outcomes import Completed, Failed
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types
from tests.fixtures.wat import Wat

SLEEP = "(drop (call $durable_sleep (i64.const 1000)))"


def module(w: Wat, body: str, *, then_sleep: bool = True) -> bytes:
    """``body`` (statements), then a one-second sleep that suspends the first segment."""
    w.run(f"{body} {SLEEP if then_sleep else ''} (call $finish)")
    return w.wasm()


def call(w: Wat, op: str) -> str:
    return f"(call $rec (call $durable_call {w.s('svc')} {w.s(op)} {w.js({})}))"


def calls(*ops: str, then_sleep: bool = True) -> bytes:
    """A module calling ``svc.<op>`` for each op, then (by default) sleeping."""
    w = Wat()
    return module(w, "".join(call(w, op) for op in ops), then_sleep=then_sleep)


def swap(env: WorkflowEnvironment, name: str, wasm: bytes) -> None:
    """Replace the deployed code of ``name`` version 1 (what a careless redeploy does)."""
    env._modules[(name, 1)] = env.runtime.load(wasm)


def test_a_different_call_on_resume_fails_with_nondeterminism() -> None:
    """v1 called svc.a then slept; the code now calls svc.b at that step: the run is
    dead-lettered (a fixed version can be retried) with nondeterminism naming step 0, the
    recorded call and the new one; svc.b is never called and the history is left as it was."""
    svc = FakeService({"a": {"v": 1}, "b": {"v": 2}})
    env = WorkflowEnvironment({"svc": svc})
    env.deploy("wf", calls("a"))
    run = env.run("wf")
    history_before = list(env.storage.runs[run].history)
    swap(env, "wf", calls("b"))
    env.advance(seconds=1)

    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("dead_lettered", "nondeterminism")
    assert info["error"] == (
        "non-determinism at step 0: the history recorded call(svc, a, {}), "
        "but the workflow now calls call(svc, b, {})"
    )
    _, last = env.segments[-1]
    assert isinstance(last.outcome, Failed)
    assert not last.outcome.retryable
    assert svc.ops() == ["a"]
    assert env.storage.runs[run].history == history_before


Body = Callable[[Wat], str]

DIVERGENCES: dict[str, tuple[Body, Body, str, str]] = {
    "call-argument": (
        lambda w: f"(drop (call $durable_call {w.s('svc')} {w.s('a')} {w.js({'n': 1})}))",
        lambda w: f"(drop (call $durable_call {w.s('svc')} {w.s('a')} {w.js({'n': 2})}))",
        'call(svc, a, {"n":1})',
        'call(svc, a, {"n":2})',
    ),
    "kind": (
        lambda w: call(w, "a"),
        lambda w: f"(drop (call $get_state {w.s('a')}))",
        "call(svc, a, {})",
        "state_mutation(get, a, , 0)",
    ),
    "sleep-duration": (
        lambda w: "(drop (call $durable_sleep (i64.const 0)))",
        lambda w: "(drop (call $durable_sleep (i64.const 5)))",
        "sleep(0, sleep)",
        "sleep(5, sleep)",
    ),
    "signal-names": (
        lambda w: f"(drop (call $durable_await_signals {w.js(['go'])} (i64.const -1)))",
        lambda w: f"(drop (call $durable_await_signals {w.js(['stop'])} (i64.const -1)))",
        'await_signals(["go"], -1)',
        'await_signals(["stop"], -1)',
    ),
    "child-input": (
        lambda w: f"(drop (call $child_workflow {w.s('leaf')} {w.js(1)}))",
        lambda w: f"(drop (call $child_workflow {w.s('leaf')} {w.js(2)}))",
        "child_workflow(leaf, 1, 0, terminate)",
        "child_workflow(leaf, 2, 0, terminate)",
    ),
    "state-key": (
        lambda w: f"(drop (call $set_state {w.s('a')} {w.s('1')}))",
        lambda w: f"(drop (call $set_state {w.s('b')} {w.s('1')}))",
        "state_mutation(set, a, 1, 0)",
        "state_mutation(set, b, 1, 0)",
    ),
}


@pytest.mark.parametrize("case", sorted(DIVERGENCES))
def test_each_kind_of_divergence_is_reported_with_both_sides(case: str) -> None:
    """Changing a call's kind or any identifying argument (request, duration, signal
    names, child input, state key) is non-determinism, with both sides named."""
    before, after, recorded, attempted = DIVERGENCES[case]
    env = WorkflowEnvironment({"svc": FakeService({"a": {}})})
    env.deploy("leaf", Wat().run("(call $finish)").wasm())
    w = Wat()
    env.deploy("wf", module(w, before(w)))
    run = env.start("wf")
    env.signal(run, "go")
    env.run_until_idle()
    assert len(env.history(run)) >= 1, "the first segment recorded the step that diverges"
    w = Wat()
    swap(env, "wf", module(w, after(w)))
    env.advance(seconds=1)

    info = env.describe(run)
    assert info["error_code"] == "nondeterminism"
    assert info["error"] == (
        f"non-determinism at step 0: the history recorded {recorded}, "
        f"but the workflow now calls {attempted}"
    )


def test_returning_where_the_history_records_more_steps_is_nondeterminism() -> None:
    """v1 called svc.a and svc.b before sleeping; the code now returns after svc.a. The
    recorded svc.b would be silently dropped, so this is non-determinism too."""
    svc = FakeService({"a": {}, "b": {}})
    env = WorkflowEnvironment({"svc": svc})
    env.deploy("wf", calls("a", "b"))
    run = env.run("wf")
    swap(env, "wf", calls("a", then_sleep=False))
    env.advance(seconds=1)

    info = env.describe(run)
    assert info["error_code"] == "nondeterminism"
    assert info["error"] == (
        "non-determinism at step 1: the history recorded call(svc, b, {}), "
        "but the workflow now calls no host function: the entry point returned"
    )
    assert svc.ops() == ["a", "b"]


def test_new_code_after_the_recorded_steps_is_not_nondeterminism() -> None:
    """Steps added after everything the history holds execute fresh: the resumed run
    finishes, calling only the new operation."""
    svc = FakeService({"a": {"v": 1}, "c": {"v": 3}})
    env = WorkflowEnvironment({"svc": svc})
    env.deploy("wf", calls("a"))
    run = env.run("wf")
    w = Wat()
    swap(env, "wf", module(w, call(w, "a") + SLEEP + call(w, "c"), then_sleep=False))
    env.advance(seconds=1)

    assert env.result(run) == [[0, '{"v":1}'], [0, '{"v":3}']]
    assert svc.ops() == ["a", "c"]
    assert_replays_quietly(env, run, watch=[svc])


def test_the_history_of_a_diverged_run_still_replays_with_the_original_code() -> None:
    """Nothing of the failed attempt was written: with the original code back, the
    history replays past the step that diverged, answering svc.a from the history (the
    replay refuses service calls), so the run can be retried after a fix."""
    env = WorkflowEnvironment({"svc": FakeService({"a": {}, "b": {}})})
    original = calls("a")
    env.deploy("wf", original)
    run = env.run("wf")
    swap(env, "wf", calls("b"))
    env.advance(seconds=1)
    assert env.describe(run)["error_code"] == "nondeterminism"

    swap(env, "wf", original)
    replayed = env.replay(run)
    assert replayed.outcome == Completed('[[0,"{}"]]')
    assert replayed.replayed_steps == 1
    assert [e.TYPE.value for e in replayed.recorded] == ["sleep"]


def test_a_run_continued_as_new_at_the_history_limit_replays() -> None:
    """A run that reached max_history_events continued as new at a fresh call; replaying
    its history stops at the same point the same way, instead of reporting the recorded
    continue-as-new as a divergence."""
    w = Wat()
    w.run(
        f"(loop $more (drop (call $incr_state {w.s('n')} (i64.const 1))) (br $more)) (call $finish)"
    )
    env = WorkflowEnvironment(config=EngineConfig(max_history_events=10))
    try:
        env.deploy("endless", w.wasm())
        run = env.start("endless")
        env.step()
        assert env.storage.runs[run].continued_as is not None
        assert event_types(env, run) == ["state_mutation"] * 10 + ["continue_as_new"]
        assert_replays_quietly(env, run)
    finally:
        env.runtime.close()
