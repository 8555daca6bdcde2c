"""ABI v1, children and run lifecycle: child_workflow, child_workflow_with_options,
await_child, await_all_children, await_any_child, poll_child, continue_as_new,
continue_as_new_with_version, run_detached, durable_defer."""

from __future__ import annotations

import json

import pytest

from engine.events import ChildWorkflowEvent
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of
from tests.fixtures.wat import Ref, Wat

# --- the children ---------------------------------------------------------------------------


def echo_child() -> Wat:
    """Finishes at once with [input, version]."""
    w = Wat()
    w.run(f"(call $note {w.input()}) (call $recn (call $version)) (call $finish)")
    return w


def failing_child() -> Wat:
    w = Wat()
    w.run(w.reply(AbiStatus.PERMANENT, "child refused"))
    return w


def waiting_child() -> Wat:
    """Waits for signal "go" (or a cancellation) and reports what it got."""
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1))) (call $finish)")
    return w


def _child_ids(env: WorkflowEnvironment, parent: str) -> list[str]:
    return [e.run_id for e in env.history(parent) if isinstance(e, ChildWorkflowEvent)]


def family() -> WorkflowEnvironment:
    env = WorkflowEnvironment()
    env.deploy("echo", echo_child().wasm())
    env.deploy("failing", failing_child().wasm())
    env.deploy("waiting", waiting_child().wasm())
    return env


CHILDREN_WAT = echo_child().source() + failing_child().source() + waiting_child().source()


# --- child_workflow, await_child ------------------------------------------------------------


def parent_module(child: str) -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $c (call $child_workflow {w.s(child)} {w.js({"x": 1})}))
    (call $rec (local.get $c))
    (call $rec (call $await_child {w.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    return w


PARENT_WAT = parent_module("echo").source()


@pytest.mark.parametrize(
    ("child", "answer"),
    [("echo", [0, '["{\\"x\\":1}",1]']), ("failing", [AbiStatus.PERMANENT, "child refused"])],
)
def test_await_child_returns_the_childs_result_with_its_status(
    child: str, answer: list[object]
) -> None:
    """child_workflow starts a child linked to the parent and answers its run id; the
    parent waits on it, and await_child answers the child's result with OK, or the child's
    error with the child's status."""
    env = family()
    env.deploy("parent", parent_module(child).wasm())
    parent = env.start("parent")
    env.step()
    [started] = env.history(parent)
    assert isinstance(started, ChildWorkflowEvent)
    child_id = started.run_id
    assert wait_of(env, parent)["run_ids"] == [child_id]
    env.run_until_idle()

    assert env.result(parent) == [[0, child_id], answer]
    record = env.storage.runs[child_id]
    assert (record.definition, record.parent_run_id, record.input) == (child, parent, '{"x":1}')
    assert event_types(env, parent) == ["child_workflow", "await_child"]
    assert_replays_quietly(env, parent, child_id)


# --- child_workflow_with_options ------------------------------------------------------------


def options_parent() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $a (call $child_workflow_with_options {w.s("echo")} {w.js("a")}
        (i64.const 0) (i64.const 0) {w.s("")}))
    (local.set $b (call $child_workflow_with_options {w.s("echo")} {w.js("b")}
        (i64.const 2) (i64.const 5) {w.s("abandon")}))
    (call $rec (call $child_workflow_with_options {w.s("echo")} {w.js("c")}
        (i64.const 9) (i64.const 0) {w.s("")}))
    (call $rec (call $child_workflow_with_options {w.s("echo")} {w.js("d")}
        (i64.const 0) (i64.const 0) {w.s("orphan")}))
    (call $rec (call $await_child {w.payload("a")}))
    (call $rec (call $await_child {w.payload("b")}))
    (call $finish)""",
        locals="$a i64 $b i64",
    )
    return w


OPTIONS_WAT = options_parent().source()


def test_child_options_choose_version_priority_and_policy() -> None:
    """Version <= 0 resolves to the parent's version when the child has it; an explicit
    version is used as given (an unknown one is NOT_FOUND); priority and the close policy
    are stored on the child; an unknown policy is PERMANENT without starting anything."""
    env = family()
    env.deploy("echo", echo_child().wasm())  # echo has versions 1 and 2
    env.deploy("parent", options_parent().wasm())
    parent = env.run("parent")

    missing, bad_policy, a, b = env.result(parent)
    assert a == [0, '["\\"a\\"",1]']
    assert b == [0, '["\\"b\\"",2]']
    assert missing == [
        AbiStatus.NOT_FOUND,
        "unknown_definition: echo has no version 9 (asked for by the parent)",
    ]
    assert bad_policy == [
        AbiStatus.PERMANENT,
        "parent_close_policy must be one of terminate, abandon, request_cancel, not 'orphan'",
    ]
    children = [r for r in env.storage.runs.values() if r.parent_run_id == parent]
    assert sorted((r.input, r.version, r.priority, r.parent_close_policy) for r in children) == [
        ('"a"', 1, 0, "terminate"),
        ('"b"', 2, 5, "abandon"),
    ]
    assert event_types(env, parent) == ["child_workflow"] * 3 + ["await_child"] * 2
    assert_replays_quietly(env, parent, *(r.run_id for r in children))


def policy_parent(policy: str) -> Wat:
    """Starts a waiting child with ``policy`` and finishes without awaiting it."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $child_workflow_with_options {w.s("waiting")} {w.js(None)}
        (i64.const 0) (i64.const 0) {w.s(policy)}))
    (call $finish)"""
    )
    return w


POLICY_WAT = policy_parent("request_cancel").source()


@pytest.mark.parametrize(
    ("policy", "child_status"),
    [("terminate", "terminated"), ("abandon", "ready"), ("request_cancel", "done")],
)
def test_parent_close_policy_decides_what_happens_to_a_running_child(
    policy: str, child_status: str
) -> None:
    """When the parent ends: terminate ends the child, abandon leaves it running,
    request_cancel asks it to cancel (its wait answers CANCELLED and it finishes)."""
    env = family()
    env.deploy("parent", policy_parent(policy).wasm())
    parent = env.run("parent")
    [[_, child]] = env.result(parent)
    assert env.status(child) == child_status
    if policy == "request_cancel":
        assert env.result(child) == [[AbiStatus.CANCELLED, ""]]
    if policy == "abandon":
        env.signal(child, "go", 1)
        env.run_until_idle()
        assert env.result(child) == [[0, '{"name":"go","payload":1}']]
    assert_replays_quietly(env, parent)


# --- await_all_children, await_any_child, poll_child ----------------------------------------


def all_children_parent() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $a (call $child_workflow {w.s("echo")} {w.js("a")}))
    (local.set $b (call $child_workflow {w.s("failing")} {w.js("b")}))
    (call $rec (call $await_all_children {w.text('["', Ref("b"), '","', Ref("a"), '"]')}))
    (call $rec (call $await_all_children {w.s("not json")}))
    (call $finish)""",
        locals="$a i64 $b i64",
    )
    return w


ALL_WAT = all_children_parent().source()


def test_await_all_children_answers_every_outcome_in_the_given_order() -> None:
    """await_all_children waits until every child finished and answers an array of
    {"run_id","status","result"|"error"} in the order the guest gave; a malformed id list
    is PERMANENT."""
    env = family()
    env.deploy("parent", all_children_parent().wasm())
    parent = env.run("parent")
    [a, b] = _child_ids(env, parent)

    [[status, body], malformed] = env.result(parent)
    assert status == 0
    assert json.loads(body) == [
        {"run_id": b, "status": "permanent", "error": "child refused"},
        {"run_id": a, "status": "ok", "result": ['"a"', 1]},
    ]
    assert malformed == [AbiStatus.PERMANENT, "run_ids must be a JSON array of strings"]
    assert_replays_quietly(env, parent, a, b)


def any_child_parent() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $slow (call $child_workflow {w.s("waiting")} {w.js("slow")}))
    (local.set $fast (call $child_workflow {w.s("echo")} {w.js("fast")}))
    (drop (call $set_query_state {w.s("slow")} {w.payload("slow")}))
    (call $rec (call $await_any_child
        {w.text('["', Ref("slow"), '","', Ref("fast"), '"]')}))
    (call $rec (call $poll_child {w.payload("slow")}))
    (call $rec (call $await_child {w.payload("slow")}))
    (call $rec (call $poll_child {w.payload("slow")}))
    (call $finish)""",
        locals="$slow i64 $fast i64",
    )
    return w


ANY_WAT = any_child_parent().source()


def test_await_any_child_answers_the_first_to_finish_and_poll_child_never_waits() -> None:
    """With one slow and one fast child, await_any_child answers the fast one's outcome;
    poll_child answers NOT_FOUND while the slow one runs and its result once it is done."""
    env = family()
    env.deploy("parent", any_child_parent().wasm())
    parent = env.run("parent")
    slow = env.describe(parent)["query_state"]["slow"]
    fast = _child_ids(env, parent)[1]
    assert wait_of(env, parent)["run_ids"] == [slow]
    env.signal(slow, "go", "now")
    env.run_until_idle()

    [(status, first), polled_early, awaited, polled_late] = env.result(parent)
    assert status == 0
    assert json.loads(first) == {"run_id": fast, "status": "ok", "result": ['"fast"', 1]}
    assert polled_early == [AbiStatus.NOT_FOUND, ""]
    assert awaited == polled_late == [0, '[[0,"{\\"name\\":\\"go\\",\\"payload\\":\\"now\\"}"]]']
    assert event_types(env, parent) == [
        "child_workflow",
        "child_workflow",
        "await_any_child",
        "poll_child",
        "await_child",
        "poll_child",
    ]
    assert_replays_quietly(env, parent, slow, fast)


# --- continue_as_new ------------------------------------------------------------------------


def rounds_module() -> Wat:
    """Counts rounds in workflow state; continues as new until the third round."""
    w = Wat()
    w.run(
        f"""
    (local.set $n (call $incr_state {w.s("round")} (i64.const 1)))
    (if (i64.lt_s (local.get $n) (i64.const 3))
      (then (drop (call $continue_as_new {w.js({"next": True})})) (unreachable)))
    (call $recn (local.get $n))
    (call $note {w.input()})
    (call $finish)""",
        locals="$n i64",
    )
    return w


ROUNDS_WAT = rounds_module().source()


def test_continue_as_new_ends_the_run_and_starts_the_next_with_the_new_input() -> None:
    """continue_as_new never returns: the run completes, a new run of the same workflow
    starts with the new input (same workflow id, so workflow state carries over)."""
    env = WorkflowEnvironment()
    env.deploy("rounds", rounds_module().wasm())
    first = env.run("rounds", {"start": True}, workflow_id="counter")

    latest = env.latest_run(first)
    assert latest != first
    assert env.result(first) == [3, '{"next":true}']
    chain = [first]
    while env.storage.runs[chain[-1]].continued_as:
        chain.append(env.storage.runs[chain[-1]].continued_as or "")
    assert len(chain) == 3
    assert chain[-1] == latest
    assert {env.storage.runs[r].workflow_id for r in chain} == {"counter"}
    assert [env.storage.runs[r].input for r in chain] == [
        '{"start":true}',
        '{"next":true}',
        '{"next":true}',
    ]
    assert event_types(env, first) == ["state_mutation", "continue_as_new"]
    assert_replays_quietly(env, *chain)


def evolving_module(version: int) -> Wat:
    w = Wat()
    if version == 1:
        again = f"(call $continue_as_new_with_version {w.js('v2 please')} (i64.const 2))"
        w.run(f"(drop {again}) {w.reply(AbiStatus.ERROR, 'continue_as_new returned')}")
    else:
        w.run(f"(call $recn (call $version)) (call $note {w.input()}) (call $finish)")
    return w


EVOLVING_WAT = evolving_module(1).source()


def test_continue_as_new_with_version_moves_the_workflow_to_that_version() -> None:
    """Version 1 continues as new on version 2; the new run runs version 2's code."""
    env = WorkflowEnvironment()
    env.deploy("evolving", evolving_module(1).wasm())
    env.deploy("evolving", evolving_module(2).wasm())
    first = env.run("evolving", version=1)
    latest = env.latest_run(first)
    assert (env.storage.runs[first].version, env.storage.runs[latest].version) == (1, 2)
    assert env.result(first) == [2, '"v2 please"']
    assert_replays_quietly(env, first, latest)


# --- run_detached ---------------------------------------------------------------------------


def detaching_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $run_detached {w.s("waiting")} {w.js("detached")}))
    (call $rec (call $run_detached {w.s("unknown")} {w.js(None)}))
    (call $finish)"""
    )
    return w


DETACHED_WAT = detaching_module().source()


def test_run_detached_starts_an_independent_workflow() -> None:
    """run_detached answers the id of a run with no parent link: the starter finishing
    does not end it (unlike a child under the default terminate policy)."""
    env = family()
    env.deploy("starter", detaching_module().wasm())
    starter = env.run("starter")
    [[status, detached], unknown] = env.result(starter)
    assert status == 0
    assert unknown == [AbiStatus.NOT_FOUND, "no workflow definition named 'unknown'"]
    record = env.storage.runs[detached]
    assert (record.definition, record.input, record.parent_run_id) == (
        "waiting",
        '"detached"',
        None,
    )
    assert env.status(detached) == "ready"
    env.signal(detached, "go")
    env.run_until_idle()
    assert env.result(detached) == [[0, '{"name":"go","payload":null}']]
    assert event_types(env, starter) == ["run_detached", "run_detached"]
    assert_replays_quietly(env, starter, detached)


# --- durable_defer --------------------------------------------------------------------------


def deferring_module(fail: bool) -> Wat:
    """Registers two defers, each reporting its input to the audit service."""
    w = Wat()
    outcome = w.reply(AbiStatus.PERMANENT, "order rejected") if fail else "(call $finish)"
    w.run(
        f"""
    (call $rec (call $durable_defer {w.s("audit_first")}))
    (call $rec (call $durable_defer {w.s("audit_second")}))
    {outcome}"""
    )
    for name in ("audit_first", "audit_second"):
        w.func(
            name,
            f"(drop (call $durable_call {w.s('audit')} {w.s(name)} {w.input()})) {w.reply(0, '')}",
        )
    return w


DEFER_WAT = deferring_module(fail=False).source()


def test_defers_run_last_in_first_out_with_the_runs_result() -> None:
    """When the entry point returns, the registered defers run in reverse order, each
    given {"defer_id","status","result"}; their host calls are recorded, so replay runs
    them again without calling the service."""
    audit = FakeService({"audit_first": "{}", "audit_second": "{}"})
    env = WorkflowEnvironment({"audit": audit})
    env.deploy("defer", deferring_module(fail=False).wasm())
    run = env.run("defer")

    result = env.result(run)
    [[_, first_id], [_, second_id]] = result
    assert audit.ops() == ["audit_second", "audit_first"]
    assert [c.request for c in audit.calls] == [
        {"defer_id": second_id, "status": "ok", "result": result},
        {"defer_id": first_id, "status": "ok", "result": result},
    ]
    assert event_types(env, run) == ["defer", "defer", "call", "call"]
    assert_replays_quietly(env, run, watch=[audit])


def test_defers_receive_the_error_of_a_failed_run() -> None:
    """A failed run's defers get its status label and error message; the run still fails."""
    audit = FakeService({"audit_first": "{}", "audit_second": "{}"})
    env = WorkflowEnvironment({"audit": audit})
    env.deploy("defer", deferring_module(fail=True).wasm())
    run = env.run("defer")

    info = env.describe(run)
    assert (info["status"], info["error_code"], info["error"]) == (
        "failed",
        "permanent",
        "order rejected",
    )
    assert [(c.operation, c.request["status"], c.request["error"]) for c in audit.calls] == [
        ("audit_second", "permanent", "order rejected"),
        ("audit_first", "permanent", "order rejected"),
    ]
    assert_replays_quietly(env, run, watch=[audit])


def test_deferring_an_export_the_module_lacks_is_a_guest_fault() -> None:
    """durable_defer names an export; a missing one fails the run (guest_fault)."""
    w = Wat()
    w.run(f"(drop (call $durable_defer {w.s('cleanup')})) (call $finish)")
    env = WorkflowEnvironment()
    env.deploy("bad", w.wasm())
    run = env.run("bad")
    info = env.describe(run)
    assert (info["error_code"], info["error"]) == (
        "guest_fault",
        "durable_defer: the module has no export 'cleanup'",
    )
    assert_replays_quietly(env, run)
