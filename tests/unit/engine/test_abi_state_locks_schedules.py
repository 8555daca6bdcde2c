"""ABI v1, state, scopes, locks and schedules: set_state, get_state, delete_state,
incr_state, has_state, list_state, set_scope, get_scope, acquire_lock, release_lock,
schedule_cron, delete_cron, list_crons."""

from __future__ import annotations

import json

from engine.events import StateMutationEvent
from engine.policies import Quotas
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import assert_replays_quietly, event_types
from tests.fixtures.wat import Wat

# --- workflow state -------------------------------------------------------------------------


def state_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $set_state {w.s("b")} {w.s("2")}))
    (call $recn (call $set_state {w.s("a")} {w.s("1")}))
    (call $recn (call $set_state {w.s("other/x")} {w.js({"deep": True})}))
    (call $rec (call $get_state {w.s("a")}))
    (call $rec (call $get_state {w.s("missing")}))
    (call $recn (call $has_state {w.s("a")}))
    (call $recn (call $has_state {w.s("missing")}))
    (call $rec (call $list_state {w.s("")}))
    (call $rec (call $list_state {w.s("o")}))
    (call $recn (call $delete_state {w.s("a")}))
    (call $recn (call $delete_state {w.s("a")}))
    (call $recn (call $has_state {w.s("a")}))
    (call $recn (call $incr_state {w.s("n")} (i64.const 5)))
    (call $recn (call $incr_state {w.s("n")} (i64.const -7)))
    (drop (call $durable_sleep (i64.const 1000)))
    (call $rec (call $get_state {w.s("n")}))
    (call $finish)"""
    )
    return w


STATE_WAT = state_module().source()


def test_state_operations_answer_from_the_workflows_own_state() -> None:
    """set/get (NOT_FOUND for a missing key) / has / list (sorted, by prefix) / delete
    (1 if it existed) / incr (the new value); state survives the suspension, every
    operation is recorded, and replay changes nothing in storage."""
    env = WorkflowEnvironment()
    env.deploy("state", state_module().wasm())
    run = env.run("state", workflow_id="wf-s")
    env.advance(seconds=1)

    result = env.result(run)
    listed_all, listed_o = result[7], result[8]
    assert [listed_all[0], json.loads(listed_all[1])] == [0, ["a", "b", "other/x"]]
    assert [listed_o[0], json.loads(listed_o[1])] == [0, ["other/x"]]
    assert result[:7] + result[9:] == [
        0,
        0,
        0,
        [0, "1"],
        [AbiStatus.NOT_FOUND, ""],
        1,
        0,
        1,
        0,
        0,
        5,
        -2,
        [0, "-2"],
    ]
    ops = [e.op for e in env.history(run) if isinstance(e, StateMutationEvent)]
    assert ops == [
        *["set"] * 3,
        *["get"] * 2,
        *["has"] * 2,
        *["list"] * 2,
        *["delete"] * 2,
        "has",
        *["incr"] * 2,
        "get",
    ]
    assert event_types(env, run)[-4:] == ["state_mutation"] * 2 + ["sleep", "state_mutation"]
    stored = {"b": "2", "other/x": '{"deep":true}', "n": "-2"}
    assert {k: v for (scope, k), v in env.storage.state.items() if scope == "wf:wf-s"} == stored
    assert_replays_quietly(env, run)
    assert {k: v for (scope, k), v in env.storage.state.items() if scope == "wf:wf-s"} == stored


def test_incr_state_of_a_non_integer_is_a_guest_fault() -> None:
    """incr_state answers a scalar, so a value that is not an integer cannot be reported
    as a status: the run fails with guest_fault naming the key."""
    w = Wat()
    w.run(
        f"""
    (drop (call $set_state {w.s("name")} {w.js("ada")}))
    (drop (call $incr_state {w.s("name")} (i64.const 1)))
    (call $finish)"""
    )
    env = WorkflowEnvironment()
    env.deploy("incr", w.wasm())
    run = env.run("incr")
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("failed", "guest_fault")
    assert "incr_state" in info["error"]
    assert "'name'" in info["error"]


# --- scopes ---------------------------------------------------------------------------------


def writer_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $set_scope {w.s("cart")} {w.s("c-1")}))
    (call $rec (call $get_scope))
    (drop (call $set_state {w.s("items")} {w.js(["book"])}))
    (call $recn (call $incr_state {w.s("visits")} (i64.const 1)))
    (call $rec (call $set_scope {w.s("")} {w.s("")}))
    (call $rec (call $get_scope))
    (call $rec (call $get_state {w.s("items")}))
    (call $finish)"""
    )
    return w


def reader_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (drop (call $set_scope {w.s("cart")} {w.s("c-1")}))
    (call $rec (call $get_state {w.s("items")}))
    (call $recn (call $incr_state {w.s("visits")} (i64.const 1)))
    (drop (call $set_scope {w.s("cart")} {w.s("c-2")}))
    (call $rec (call $get_state {w.s("items")}))
    (call $finish)"""
    )
    return w


SCOPE_WAT = writer_module().source() + reader_module().source()


def test_a_scope_addresses_one_virtual_objects_state_shared_across_workflows() -> None:
    """set_scope answers the previous scope and makes state operations address that
    object; another workflow in the same scope sees the same state; another instance key
    or the empty scope (the workflow's own state) does not."""
    env = WorkflowEnvironment()
    env.deploy("writer", writer_module().wasm())
    env.deploy("reader", reader_module().wasm())
    writer = env.run("writer")
    reader = env.run("reader")

    empty = {"object_type": "", "instance_key": ""}
    cart = {"object_type": "cart", "instance_key": "c-1"}
    prev, scoped, visits, prev_again, unscoped, own = env.result(writer)
    assert [json.loads(s[1]) for s in (prev, scoped, prev_again, unscoped)] == [
        empty,
        cart,
        cart,
        empty,
    ]
    assert {s[0] for s in (prev, scoped, prev_again, unscoped)} == {0}
    assert visits == 1
    assert own == [AbiStatus.NOT_FOUND, ""]
    assert env.result(reader) == [[0, '["book"]'], 2, [AbiStatus.NOT_FOUND, ""]]
    assert env.storage.state[("obj:cart:c-1", "visits")] == "2"
    assert event_types(env, writer)[:2] == ["scope_acquired", "state_mutation"]
    assert_replays_quietly(env, writer, reader)
    assert env.storage.state[("obj:cart:c-1", "visits")] == "2"


# --- locks ----------------------------------------------------------------------------------


def holder_module(ttl_ms: int) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $acquire_lock {w.s("printer")} (i64.const {ttl_ms})))
    (call $recn (call $acquire_lock {w.s("printer")} (i64.const {ttl_ms})))
    (drop (call $durable_await_signals {w.js(["release"])} (i64.const -1)))
    (call $recn (call $release_lock {w.s("printer")}))
    (call $finish)"""
    )
    return w


def contender_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $acquire_lock {w.s("printer")} (i64.const 0)))
    (drop (call $durable_await_signals {w.js(["retry"])} (i64.const -1)))
    (call $recn (call $acquire_lock {w.s("printer")} (i64.const 0)))
    (call $finish)"""
    )
    return w


LOCK_WAT = holder_module(0).source() + contender_module().source()


def test_a_held_lock_refuses_other_workflows_until_released() -> None:
    """acquire_lock answers 1 to the holder (again when it asks again) and 0 to another
    workflow while it is held; after release_lock the other workflow gets it, and holds
    it until its run ends (which gives it back)."""
    env = WorkflowEnvironment()
    env.deploy("holder", holder_module(0).wasm())
    env.deploy("contender", contender_module().wasm())
    holder = env.run("holder")
    contender = env.run("contender")
    assert env.storage.locks["printer"][0] == holder
    env.signal(holder, "release")
    env.run_until_idle()
    env.signal(contender, "retry")
    env.run_until_idle()

    assert env.result(holder) == [1, 1, 0]
    assert env.result(contender) == [0, 1]
    assert "printer" not in env.storage.locks  # the contender's end released it
    assert event_types(env, holder) == [
        "acquire_lock",
        "acquire_lock",
        "await_signals",
        "release_lock",
    ]
    assert_replays_quietly(env, holder, contender)
    assert "printer" not in env.storage.locks


def test_a_lock_expires_after_its_ttl() -> None:
    """A lock taken with a 5 s ttl and never released is free for others after 5 s."""
    env = WorkflowEnvironment()
    env.deploy("holder", holder_module(5000).wasm())
    env.deploy("contender", contender_module().wasm())
    holder = env.run("holder")
    contender = env.run("contender")
    env.clock.advance(5000)
    env.signal(contender, "retry")
    env.run_until_idle()

    assert env.status(holder) == "ready"
    assert env.result(contender) == [0, 1]
    assert_replays_quietly(env, contender)


# --- schedules ------------------------------------------------------------------------------


def schedules_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $s (call $schedule_cron {w.s("report")} {w.s("0 9 * * 1-5")}
        {w.s("Europe/London")} {w.js({"kind": "daily"})}))
    (call $rec (local.get $s))
    (call $rec (call $schedule_cron {w.s("report")} {w.s("61 * * * *")} {w.s("UTC")} {w.js({})}))
    (call $rec (call $schedule_cron {w.s("report")} {w.s("0 9 * * *")} {w.s("Mars/Olympus")}
        {w.js({})}))
    (call $rec (call $schedule_cron {w.s("nope")} {w.s("@daily")} {w.s("")} {w.js({})}))
    (call $rec (call $list_crons))
    (call $rec (call $delete_cron {w.payload("s")}))
    (call $rec (call $delete_cron {w.payload("s")}))
    (call $rec (call $list_crons))
    (call $finish)""",
        locals="$s i64",
    )
    return w


SCHEDULES_WAT = schedules_module().source()


def test_schedule_cron_validates_then_list_and_delete_see_the_schedule() -> None:
    """schedule_cron answers a schedule id; an invalid expression or zone is PERMANENT
    with the reason, an unknown workflow NOT_FOUND; list_crons answers the tenant's
    schedules; delete_cron removes one (NOT_FOUND the second time)."""
    env = WorkflowEnvironment()
    env.deploy("report", Wat().run("(call $finish)").wasm())
    env.deploy("sched", schedules_module().wasm())
    run = env.run("sched")

    [created, bad_cron, bad_zone, unknown, listed, deleted, again, empty] = env.result(run)
    assert created[0] == 0
    schedule_id = created[1]
    assert bad_cron == [AbiStatus.PERMANENT, "minute field '61': 61 is outside 0-59"]
    assert bad_zone[0] == AbiStatus.PERMANENT
    assert "Mars/Olympus" in bad_zone[1]
    assert unknown == [AbiStatus.NOT_FOUND, "no workflow definition named 'nope'"]
    assert listed[0] == 0
    assert json.loads(listed[1]) == [
        {
            "id": schedule_id,
            "workflow_name": "report",
            "cron": "0 9 * * 1-5",
            "timezone": "Europe/London",
            "input": '{"kind":"daily"}',
        }
    ]
    assert (deleted, again, empty) == ([0, ""], [AbiStatus.NOT_FOUND, ""], [0, "[]"])
    assert env.storage.schedules == {}
    assert event_types(env, run) == ["schedule_cron"] * 4 + ["list_crons"] + ["delete_cron"] * 2 + [
        "list_crons"
    ]
    assert_replays_quietly(env, run)


def test_schedule_cron_over_the_quota_is_denied() -> None:
    """With a quota of one schedule, the second is DENIED; the zone defaults to UTC."""
    w = Wat()
    create = f"(call $schedule_cron {w.s('report')} {w.s('@hourly')} {w.s('')} {w.js(None)})"
    w.run(f"(call $rec {create}) (call $rec {create}) (call $finish)")
    env = WorkflowEnvironment()
    env.storage.quotas = Quotas(schedules=1)
    env.deploy("report", Wat().run("(call $finish)").wasm())
    env.deploy("sched", w.wasm())
    run = env.run("sched")

    [(status, schedule_id), denied] = env.result(run)
    assert status == 0
    assert denied == [AbiStatus.DENIED, "quota schedules exceeded: at most 1 per tenant"]
    assert env.storage.schedules[schedule_id]["timezone"] == "UTC"
    assert len(env.storage.schedules) == 1
    assert_replays_quietly(env, run)
