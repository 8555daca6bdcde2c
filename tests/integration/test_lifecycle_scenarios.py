"""One suite of run-lifecycle scenarios, run unchanged against both environments: the
in-memory one workflow authors test with (``engine.testing``) and the database one (the
Django store, the claim, the executor's segment and its fenced finalize, with a virtual
clock). Every scenario asserts the same outcome on both, so an environment that behaves
differently from the other fails its parametrization.

The database parametrization runs on whatever database the suite is pointed at (SQLite by
default, PostgreSQL as ``cleat_app``, MariaDB); the in-memory one runs in every pass too
(it takes milliseconds and needs no database).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from engine.lifecycle import RetryPolicy
from tests.fixtures import FakeService
from tests.fixtures.wat import Ref, Wat
from tests.integration.support.environments import (
    MemoryEnvironment,
    ScenarioEnvironment,
    database_environment,
)

MakeEnv = Callable[..., ScenarioEnvironment]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def make_env(request: pytest.FixtureRequest) -> Iterator[MakeEnv]:
    made: list[Any] = []

    def make(services: dict[str, Any] | None = None) -> ScenarioEnvironment:
        if request.param == "memory":
            env: Any = MemoryEnvironment(services)
        else:
            env = database_environment(request.getfixturevalue("tenant"), services)
            made.append(env)
        return env  # type: ignore[no-any-return]

    yield make
    for env in made:
        env.close()


def types(env: ScenarioEnvironment, run: str) -> list[str]:
    return [e.TYPE.value for e in env.history(run)]


def chain(env: ScenarioEnvironment, run: str) -> list[str]:
    """The run and the runs continue-as-new started after it, in order."""
    runs = [run]
    while (successor := env.describe(runs[-1])["continued_as"]) is not None:
        runs.append(successor)
    return runs


def summary(env: ScenarioEnvironment, run: str) -> tuple[Any, ...]:
    info = env.describe(run)
    return info["status"], info["error_code"], info["attempt"]


# --- retry with backoff, then the dead-letter queue -------------------------------------------


def fails_after_a_call(status: int = 1) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("flaky")} {w.s("go")} {w.js({})}))
    {w.reply(status, "the service said no")}"""
    )
    return w


def test_a_retryable_failure_is_retried_with_backoff_then_dead_lettered(make_env: MakeEnv) -> None:
    """ERROR is retryable: attempts 2 and 3 come after 1 s then 2 s (the definition's
    backoff), each replaying the recorded call; after the last the run is dead-lettered."""
    flaky = FakeService({"go": {"no": True}})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", fails_after_a_call().wasm())
    run = env.run("flaky")
    assert summary(env, run) == ("ready", "error", 2)
    assert env.describe(run)["waiting_on"] == "retry 2 of 3 after error"
    env.advance(ms=999)
    assert summary(env, run) == ("ready", "error", 2)  # not due yet
    env.advance(ms=1)
    assert summary(env, run) == ("ready", "error", 3)
    env.advance(ms=1999)
    assert summary(env, run) == ("ready", "error", 3)
    env.advance(ms=1)
    assert summary(env, run) == ("dead_lettered", "error", 3)
    assert env.describe(run)["error"] == "the service said no"
    assert env.describe(run)["waiting_on"] is None
    assert flaky.ops() == ["go"]  # every retry replayed it
    assert env.advance(seconds=3600) == 0  # nothing left to do


def test_the_definitions_retry_policy_is_the_one_applied(make_env: MakeEnv) -> None:
    """Two attempts 5 s apart, as deployed; a permanent failure is never retried."""
    env = make_env({"flaky": FakeService({"go": {"no": True}})})
    env.deploy("flaky", fails_after_a_call().wasm(), retry=RetryPolicy(2, 5.0, 3.0, 60.0))
    env.deploy("stubborn", fails_after_a_call(status=2).wasm())
    run = env.run("flaky")
    assert env.describe(run)["waiting_on"] == "retry 2 of 2 after error"
    env.advance(ms=4999)
    assert summary(env, run) == ("ready", "error", 2)
    env.advance(ms=1)
    assert summary(env, run) == ("dead_lettered", "error", 2)
    permanent = env.run("stubborn")
    assert summary(env, permanent) == ("failed", "permanent", 1)


def call_or_fail() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $r (call $durable_call {w.s("flaky")} {w.s("go")} {w.js({})}))
    (if (result i64) (i32.ne (call $status (local.get $r)) (i32.const 0))
      (then {w.reply(1, "the call failed")})
      (else (call $rec (local.get $r)) (call $finish)))""",
        locals="$r i64",
    )
    return w


def test_an_automatic_retry_makes_the_failed_call_again(make_env: MakeEnv) -> None:
    """A run that failed because its last call failed is retried by calling the service
    again (same idempotency key), not by replaying the recorded failure."""
    flaky = FakeService({"go": [RuntimeError("down"), {"ok": True}]})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", call_or_fail().wasm())
    run = env.run("flaky")
    assert summary(env, run) == ("ready", "error", 2)
    assert env.describe(run)["events"] == 0  # the failed call was forgotten
    env.advance(seconds=1)
    assert env.result(run) == [[0, '{"ok":true}']]
    assert summary(env, run) == ("done", None, 2)
    assert flaky.ops() == ["go", "go"]
    assert flaky.calls[0].idempotency_key == flaky.calls[1].idempotency_key


# --- non-determinism ------------------------------------------------------------------------


def calls_then_sleeps(operation: str) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("pay")} {w.s(operation)} {w.js({})}))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $finish)"""
    )
    return w


def test_nondeterminism_dead_letters_at_once_naming_the_step(make_env: MakeEnv) -> None:
    """Code that asks a different question on replay is dead-lettered at once (no retry)
    with ``nondeterminism`` and a message naming the step and both calls."""
    pay = FakeService({"charge": 1, "refund": 2})
    env = make_env({"pay": pay})
    env.deploy("drift", calls_then_sleeps("charge").wasm())
    run = env.run("drift")
    env.replace_module("drift", 1, calls_then_sleeps("refund").wasm())
    env.advance(seconds=1)
    assert summary(env, run) == ("dead_lettered", "nondeterminism", 1)
    assert env.describe(run)["error"] == (
        "non-determinism at step 0: the history recorded call(pay, charge, {}), "
        "but the workflow now calls call(pay, refund, {})"
    )
    assert pay.ops() == ["charge"]
    assert types(env, run) == ["call"]  # as it was: the sleep never completed


# --- continue-as-new ------------------------------------------------------------------------


def counter_continuing_as_new() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $n (call $incr_state {w.s("count")} (i64.const 1)))
    (if (i64.lt_s (local.get $n) (i64.const 3))
      (then (drop (call $continue_as_new {w.js({"again": True})}))))
    (call $recn (local.get $n))
    (call $rec (call $json_parse {w.input()}))
    (call $finish)""",
        locals="$n i64",
    )
    return w


def test_continue_as_new_chains_runs_that_share_state(make_env: MakeEnv) -> None:
    """Each run increments the workflow-scoped counter and continues as new until it reaches
    3: three runs with one workflow id, each ``done`` with its own history; the last one's
    input is the one continue-as-new passed."""
    env = make_env()
    env.deploy("loop", counter_continuing_as_new().wasm())
    first = env.run("loop", {"first": True})
    runs = chain(env, first)
    assert len(runs) == 3
    assert [env.status(r) for r in runs] == ["done", "done", "done"]
    assert {env.describe(r)["workflow_id"] for r in runs} == {first}
    assert env.result(first) == [3, [0, '{"again":true}']]
    assert {json.loads(env.describe(r)["result"])["continued_as_new"] for r in runs[:-1]} == {True}
    assert types(env, first) == ["state_mutation", "continue_as_new"]
    assert types(env, runs[-1]) == ["state_mutation"]


def test_continue_as_new_with_a_version_starts_that_version(make_env: MakeEnv) -> None:
    old, new = Wat(), Wat()
    old.run(
        f"""
    (drop (call $continue_as_new_with_version {old.js({"moved": 1})} (i64.const 2)))
    (call $finish)"""
    )
    new.run("(call $recn (call $version)) (call $finish)")
    env = make_env()
    env.deploy("versioned", old.wasm())
    env.deploy("versioned", new.wasm())
    run = env.start("versioned", version=1)
    env.run_until_idle()
    successor = chain(env, run)[-1]
    assert (env.describe(run)["version"], env.describe(successor)["version"]) == (1, 2)
    assert env.result(run) == [2]


def counter_to(limit: int) -> Wat:
    w = Wat()
    w.run(
        f"""
    (block $done (loop $again
      (local.set $n (call $incr_state {w.s("count")} (i64.const 1)))
      (br_if $done (i64.ge_s (local.get $n) (i64.const {limit})))
      (br $again)))
    (call $recn (local.get $n))
    (call $finish)""",
        locals="$n i64",
    )
    return w


def test_a_run_at_the_definitions_event_cap_continues_as_new(make_env: MakeEnv) -> None:
    """With ``max_history_length`` 10, a run that keeps going continues as new with its
    input when its history reaches 10 events; the chain picks up where it was."""
    env = make_env()
    env.deploy("counter", counter_to(25).wasm(), max_history_length=10)
    first = env.run("counter")
    runs = chain(env, first)
    assert len(runs) == 3
    assert env.result(first) == [25]
    assert [len(env.history(r)) for r in runs] == [11, 11, 5]
    assert types(env, first)[-1] == "continue_as_new"


# --- children -------------------------------------------------------------------------------


def signal_waiter() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $a (call $durable_await_signals {w.js(["approve", "reject"])} (i64.const 3600000)))
    (call $rec (local.get $a))
    (call $finish)""",
        locals="$a i64",
    )
    return w


def test_a_child_runs_and_wakes_its_parent(make_env: MakeEnv) -> None:
    parent, child = Wat(), Wat()
    parent.run(
        f"""
    (local.set $c (call $child_workflow {parent.s("child")} {parent.js({"x": 2})}))
    (call $rec (call $await_child {parent.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    child.run(
        f"""
    (call $rec (call $durable_call {child.s("math")} {child.s("double")} {child.input()}))
    (call $finish)"""
    )
    env = make_env({"math": FakeService({"double": lambda r: r["x"] * 2})})
    env.deploy("parent", parent.wasm())
    env.deploy("child", child.wasm())
    run = env.run("parent")
    assert env.result(run) == [[0, '[[0,"4"]]']]
    assert [status for status, _ in env.children(run).values()] == ["done"]
    assert types(env, run) == ["child_workflow", "await_child"]


def test_awaiting_several_children_reads_each_ones_end(make_env: MakeEnv) -> None:
    """A parent starts a child that completes, one that fails, one that continues as new
    twice and one that waits for a signal. ``await_any_child`` over the waiter and the
    failing one answers the failure; ``await_all_children`` over the others (one id twice,
    and an id that names no run) answers each in the order asked, the continued child by
    the last run of its chain."""
    parent, done, failing = Wat(), Wat(), Wat()
    starts = "".join(
        f"(local.set ${local} (call $child_workflow {parent.s(name)} {parent.js(value)}))"
        for local, name, value in (
            ("d", "done", {}),
            ("f", "failing", {}),
            ("l", "loop", {"first": True}),
            ("w", "waiter", {}),
        )
    )
    any_of = parent.text('["', Ref("w"), '","', Ref("f"), '"]')
    all_of = parent.text('["', Ref("d"), '","', Ref("l"), '","nobody","', Ref("d"), '"]')
    parent.run(
        f"""{starts}
    (call $rec (call $await_any_child {any_of}))
    (call $rec (call $await_all_children {all_of}))
    (call $finish)""",
        locals="$d i64 $f i64 $l i64 $w i64",
    )
    done.run(f"(call $rec (call $json_parse {done.js({'v': 1})})) (call $finish)")
    failing.run(failing.reply(2, "refused for good"))
    env = make_env()
    for name, module in (
        ("parent", parent),
        ("done", done),
        ("failing", failing),
        ("loop", counter_continuing_as_new()),
        ("waiter", signal_waiter()),
    ):
        env.deploy(name, module.wasm())
    run = env.run("parent")
    assert env.status(run) == "done"
    children: dict[str, str] = {}
    for child in env.children(run):  # the loop's first run: the one whose chain is longest
        name = env.describe(child)["definition"]
        if len(chain(env, child)) > len(chain(env, children.get(name, child))):
            children[name] = child
        children.setdefault(name, child)
    [[any_status, any_answer], [all_status, all_answer]] = env.result(run)
    assert (any_status, json.loads(any_answer)) == (
        0,
        {"run_id": children["failing"], "status": "permanent", "error": "refused for good"},
    )
    assert all_status == 0
    answers = json.loads(all_answer)
    assert [a["run_id"] for a in answers] == [
        children["done"],
        children["loop"],
        "nobody",
        children["done"],
    ]
    assert (
        answers[0]
        == answers[3]
        == {
            "run_id": children["done"],
            "status": "ok",
            "result": [[0, '{"v":1}']],
        }
    )
    assert len(chain(env, children["loop"])) == 3
    assert answers[1] == {
        "run_id": children["loop"],
        "status": "ok",
        "result": env.result(children["loop"]),  # the chain's last run's
    }
    assert env.result(children["loop"]) == [3, [0, '{"again":true}']]
    assert answers[2] == {"run_id": "nobody", "status": "not_found", "error": "no run nobody"}
    assert env.status(children["waiter"]) == "terminated"  # by the parent's end (its policy)


def test_a_run_awaiting_its_detached_run_is_woken_by_its_end(make_env: MakeEnv) -> None:
    """A run that awaits the run it started with ``run_detached`` is woken when that run
    ends (it slept until its re-check), and the detached run is not its child."""
    starter, sleeper = Wat(), Wat()
    starter.run(
        f"""
    (local.set $d (call $run_detached {starter.s("sleeper")} {starter.js({})}))
    (call $rec (call $await_child {starter.payload("d")}))
    (call $finish)""",
        locals="$d i64",
    )
    sleeper.run(
        "(drop (call $durable_sleep (i64.const 60000))) (call $recn (i64.const 7)) (call $finish)"
    )
    env = make_env()
    env.deploy("starter", starter.wasm())
    env.deploy("sleeper", sleeper.wasm())
    run = env.run("starter")
    assert env.status(run) == "ready"
    assert env.children(run) == {}
    env.advance(61)  # the sleeper's timer fires and it ends; the re-check is far off
    assert env.status(run) == "done"
    [[status, answer]] = env.result(run)
    assert (status, json.loads(answer)) == (0, [7])


def test_a_parents_end_applies_each_childs_close_policy(make_env: MakeEnv) -> None:
    """A parent that completes with three children waiting: the ``terminate`` child is
    terminated, the ``request_cancel`` one sees the cancellation and finishes, the
    ``abandon`` one goes on waiting (and later completes on its own)."""
    parent = Wat()
    starts = "".join(
        f"(call $rec (call $child_workflow_with_options {parent.s('waiter')} {parent.js({})} "
        f"(i64.const 0) (i64.const 0) {parent.s(policy)}))"
        for policy in ("terminate", "request_cancel", "abandon")
    )
    parent.run(f"{starts} (call $finish)")
    env = make_env()
    env.deploy("parent", parent.wasm())
    env.deploy("waiter", signal_waiter().wasm())
    run = env.run("parent")
    terminated, cancelled, abandoned = [answer[1] for answer in env.result(run)]
    children = env.children(run)
    assert children[terminated] == ("terminated", "terminated")
    assert children[cancelled] == ("done", None)
    assert env.result(cancelled) == [[5, ""]]
    assert children[abandoned] == ("ready", None)
    env.signal(abandoned, "approve")
    env.run_until_idle()
    assert env.result(abandoned) == [[0, '{"name":"approve","payload":null}']]


def test_terminating_a_parent_terminates_its_child(make_env: MakeEnv) -> None:
    parent = Wat()
    parent.run(
        f"""
    (local.set $c (call $child_workflow {parent.s("waiter")} {parent.js({})}))
    (call $rec (call $await_child {parent.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    env = make_env()
    env.deploy("parent", parent.wasm())
    env.deploy("waiter", signal_waiter().wasm())
    run = env.run("parent")
    env.terminate(run, "stop it")
    assert (env.describe(run)["status"], env.describe(run)["error"]) == ("terminated", "stop it")
    assert list(env.children(run).values()) == [("terminated", "terminated")]
    assert env.run_until_idle() == 0


# --- defers, timers, signals, promises, updates, cancellation --------------------------------


def state_and_defers() -> Wat:
    w = Wat()
    w.func("cleanup", f"(drop (call $set_state {w.s('cleaned')} {w.s('yes')})) {w.reply(0, '')}")
    w.run(
        f"""
    (drop (call $durable_defer {w.s("cleanup")}))
    (drop (call $set_state {w.s("a")} {w.js(1)}))
    (call $rec (call $get_state {w.s("a")}))
    (call $rec (call $get_state {w.s("missing")}))
    (call $finish)"""
    )
    return w


def test_state_and_a_defer_that_runs_when_the_workflow_ends(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("stateful", state_and_defers().wasm())
    run = env.run("stateful")
    assert env.result(run) == [[0, "1"], [7, ""]]
    assert env.state(f"wf:{run}", "cleaned") == "yes"
    assert types(env, run)[0] == "defer"


def call_sleep_call() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("pay")} {w.s("charge")} {w.js({"amount": 5})}))
    (call $recn (call $durable_sleep (i64.const 60000)))
    (call $rec (call $durable_call {w.s("pay")} {w.s("receipt")} {w.input()}))
    (call $finish)"""
    )
    return w


def test_a_durable_timer_fires_when_virtual_time_passes_it(make_env: MakeEnv) -> None:
    """Two calls around a one-minute sleep: the first is not repeated when the second
    segment replays it; each call's idempotency key is its own."""
    pay = FakeService({"charge": {"ok": 1}, "receipt": lambda r: {"echo": r}})
    env = make_env({"pay": pay})
    env.deploy("order", call_sleep_call().wasm())
    run = env.run("order", {"n": 7})
    assert env.describe(run)["waiting_on"].startswith("timer until")
    env.advance(seconds=59)
    assert env.status(run) == "ready"
    assert pay.ops() == ["charge"]
    env.advance(seconds=1)
    assert env.result(run) == [[0, '{"ok":1}'], 0, [0, '{"echo":{"n":7}}']]
    assert pay.ops() == ["charge", "receipt"]
    assert types(env, run) == ["call", "sleep", "call"]
    assert len({c.idempotency_key for c in pay.calls}) == 2


def test_a_signal_wakes_a_waiting_run_and_an_unanswered_wait_times_out(
    make_env: MakeEnv,
) -> None:
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    answered, unanswered = env.run("approval"), env.run("approval")
    assert env.describe(answered)["waiting_on"].startswith("signals approve/reject")
    assert env.run_until_idle() == 0
    env.signal(answered, "reject", {"why": "budget"})
    assert env.run_until_idle() == 1
    assert env.result(answered) == [[0, '{"name":"reject","payload":{"why":"budget"}}']]
    env.advance(seconds=3599)
    assert env.status(unanswered) == "ready"
    env.advance(seconds=1)
    assert env.result(unanswered) == [[4, ""]]


def promise_waiter() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("approval")}))
    (call $set_query_state {w.s("promise")} {w.payload("p")}) drop
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    return w


def test_promises_resolved_or_rejected_from_outside(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("promising", promise_waiter().wasm())
    resolved, rejected = env.run("promising"), env.run("promising")
    env.resolve_promise(env.describe(resolved)["query_state"]["promise"], {"approved": True})
    env.reject_promise(env.describe(rejected)["query_state"]["promise"], "not today")
    env.run_until_idle()
    assert env.result(resolved) == [[0, '{"approved":true}']]
    assert env.result(rejected) == [[1, "not today"]]


def updatable() -> Wat:
    w = Wat()
    w.func(
        "bump",
        f"(drop (call $set_query_state {w.s('bumped')} {w.input()})) {w.reply(0, 'bumped!')}",
    )
    w.run(
        f"""
    (drop (call $register_update_handler {w.s("bump")}))
    (call $rec (call $durable_await_signals {w.js(["stop"])} (i64.const -1)))
    (call $finish)"""
    )
    return w


def test_an_update_is_answered_at_a_blocking_point(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("updatable", updatable().wasm())
    run = env.run("updatable")
    update_id = env.update(run, "bump", {"by": 2})
    env.run_until_idle()
    assert env.update_result(update_id) == ("done", "bumped!")
    assert env.describe(run)["query_state"] == {"bumped": '{"by":2}'}
    env.signal(run, "stop")
    env.run_until_idle()
    assert env.result(run)[0][0] == 0


def test_an_update_pending_when_the_run_ends_is_failed(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("updatable", updatable().wasm())
    run = env.run("updatable")
    update_id = env.update(run, "bump", {"by": 1})
    env.terminate(run, "enough")
    assert env.update_result(update_id) == (
        "failed",
        "the run ended (terminated) before answering",
    )


def test_cancellation_reaches_a_waiting_run(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    run = env.run("approval")
    env.cancel(run, "no longer needed")
    env.run_until_idle()
    assert env.result(run) == [[5, ""]]


def test_a_sleep_answers_the_pending_update_then_reports_the_cancellation(
    make_env: MakeEnv,
) -> None:
    """Both wait for the run when it reaches its sleep: the one read of both (on PostgreSQL
    one function call) hands the update to its handler first, then the sleep returns
    CANCELLED (5) without waiting."""
    w = Wat()
    w.func(
        "bump",
        f"(drop (call $set_query_state {w.s('bumped')} {w.input()})) {w.reply(0, 'bumped!')}",
    )
    w.run(
        f"""
    (drop (call $register_update_handler {w.s("bump")}))
    (call $recn (call $durable_sleep (i64.const 60000)))
    (call $finish)"""
    )
    env = make_env()
    env.deploy("sleeper", w.wasm())
    run = env.run("sleeper")
    first, second = env.update(run, "bump", {"by": 1}), env.update(run, "bump", {"by": 2})
    env.cancel(run, "no longer needed")
    env.run_until_idle()
    assert env.update_result(first) == ("done", "bumped!")
    assert env.update_result(second) == ("done", "bumped!")
    assert env.describe(run)["query_state"] == {"bumped": '{"by":2}'}  # in the order sent
    assert env.result(run) == [5]
    assert types(env, run).count("update_applied") == 2


def test_a_terminated_runs_timer_never_fires(make_env: MakeEnv) -> None:
    env = make_env({"pay": FakeService({"charge": 1, "receipt": 2})})
    env.deploy("order", call_sleep_call().wasm())
    run = env.run("order", {})
    env.terminate(run)
    assert env.advance(seconds=120) == 0
    assert summary(env, run) == ("terminated", "terminated", 1)
    assert types(env, run) == ["call", "admin_action"]  # the operator's close is kept


def test_operators_force_complete_and_force_fail(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("approval", signal_waiter().wasm())
    completed, failed = env.run("approval"), env.run("approval")
    env.force_complete(completed, {"by": "ops"})
    env.force_fail(failed, "given up", "permanent")
    assert env.result(completed) == {"by": "ops"}
    info = env.describe(failed)
    assert (info["status"], info["error_code"], info["error"]) == (
        "failed",
        "permanent",
        "given up",
    )
    assert env.advance(seconds=7200) == 0


# --- a run's end gives back its locks ------------------------------------------------------


def lock_holder(ends: str) -> Wat:
    """Takes lock "k", waits for "go" (or a cancellation), then finishes or fails."""
    w = Wat()
    finish = {
        "finishes": "(call $finish)",
        "fails": w.reply(2, "broken"),
        "fails retryably": w.reply(1, "flaky"),
    }[ends]
    w.run(
        f"""
    (call $recn (call $acquire_lock {w.s("k")} (i64.const 0)))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    {finish}"""
    )
    return w


def lock_taker() -> Wat:
    w = Wat()
    w.run(f"(call $recn (call $acquire_lock {w.s('k')} (i64.const 0))) (call $finish)")
    return w


ENDINGS: dict[str, tuple[str, Callable[[ScenarioEnvironment, str], None], str]] = {
    "completes": ("finishes", lambda env, run: env.signal(run, "go"), "done"),
    "fails": ("fails", lambda env, run: env.signal(run, "go"), "failed"),
    "is dead-lettered": (
        "fails retryably",
        lambda env, run: env.signal(run, "go"),
        "dead_lettered",
    ),
    "is terminated": ("finishes", lambda env, run: env.terminate(run), "terminated"),
    "is cancelled": ("finishes", lambda env, run: env.cancel(run), "done"),
    "is force-completed": ("finishes", lambda env, run: env.force_complete(run, 1), "done"),
    "is force-failed": ("finishes", lambda env, run: env.force_fail(run, "no"), "failed"),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_lock_is_released_when_its_holder_ends(make_env: MakeEnv, ending: str) -> None:
    """While the holder runs, another workflow's acquire_lock answers 0; once the holder's
    run has ended, however it ended, the next one answers 1."""
    module, end, status = ENDINGS[ending]
    env = make_env()
    env.deploy("holder", lock_holder(module).wasm(), retry=RetryPolicy(max_attempts=1))
    env.deploy("taker", lock_taker().wasm())
    holder = env.run("holder")
    assert env.locks() == {"k": holder}
    refused = env.run("taker")
    assert env.result(refused) == [0]
    end(env, holder)
    env.run_until_idle()
    assert env.status(holder) == status
    assert env.locks() == {}
    assert env.result(env.run("taker")) == [1]
    assert env.locks() == {}  # the taker's own end (one plain segment) gave it back


def test_a_lock_is_kept_while_a_run_waits_for_its_retry(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("holder", lock_holder("fails retryably").wasm())
    holder = env.run("holder")
    env.signal(holder, "go")
    env.run_until_idle()
    assert summary(env, holder) == ("ready", "error", 2)
    assert env.locks() == {"k": holder}
    env.advance(seconds=1)
    assert env.locks() == {"k": holder}
    env.advance(seconds=2)
    assert summary(env, holder) == ("dead_lettered", "error", 3)
    assert env.locks() == {}


def test_a_lock_is_kept_across_continue_as_new(make_env: MakeEnv) -> None:
    """The lock is the workflow's: the successor run holds it on, and its end gives it back."""
    w = Wat()
    w.run(
        f"""
    (call $recn (call $acquire_lock {w.s("k")} (i64.const 0)))
    (if (i64.lt_s (call $incr_state {w.s("runs")} (i64.const 1)) (i64.const 2))
      (then (drop (call $continue_as_new {w.js({})}))))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (call $finish)"""
    )
    env = make_env()
    env.deploy("holder", w.wasm())
    env.deploy("taker", lock_taker().wasm())
    holder = env.run("holder")
    successor = chain(env, holder)[-1]
    assert successor != holder and env.status(successor) == "ready"
    assert env.locks() == {"k": holder}  # the workflow id, which the chain shares
    assert env.result(env.run("taker")) == [0]
    env.signal(successor, "go")
    env.run_until_idle()
    assert env.result(holder) == [1, [0, '{"name":"go","payload":null}']]
    assert env.locks() == {}


# --- what the definition declares ---------------------------------------------------------


def test_min_version_answers_the_definitions_declared_minimum(make_env: MakeEnv) -> None:
    w = Wat()
    w.run("(call $recn (call $version)) (call $recn (call $min_version)) (call $finish)")
    env = make_env()
    env.deploy("versions", w.wasm(), version=3, min_version=2)
    assert env.result(env.run("versions")) == [3, 2]


def test_the_result_of_a_run_is_its_json(make_env: MakeEnv) -> None:
    """Both environments hand back the same parsed result and history shape."""
    w = Wat()
    w.run(f"(call $rec (call $json_parse {w.input()})) (call $finish)")
    env = make_env()
    env.deploy("echo", w.wasm())
    run = env.run("echo", {"a": [1, 2]})
    assert env.result(run) == [[0, json.dumps({"a": [1, 2]}, separators=(",", ":"))]]
    assert summary(env, run) == ("done", None, 1)
