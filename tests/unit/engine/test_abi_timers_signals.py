"""ABI v1, timers, signals and queries: durable_sleep, durable_await_signals, poll_signal,
poll_cancellation, signal_workflow, send_signal_and_wait, reply_to_signal, set_query_state."""

from __future__ import annotations

import json

from engine.events import AwaitSignalsEvent, SignalSentEvent, SleepEvent
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import assert_replays_quietly, event_types, wait_of
from tests.fixtures.wat import Wat

# --- durable_sleep --------------------------------------------------------------------------


def sleep_module() -> Wat:
    w = Wat()
    w.run(
        """
    (call $recn (call $durable_sleep (i64.const 5000)))
    (call $recn (call $now))
    (call $finish)"""
    )
    return w


SLEEP_WAT = sleep_module().source()


def test_sleep_suspends_on_a_timer_that_fires_when_virtual_time_passes() -> None:
    """durable_sleep ends the segment waiting on a timer; 4.999 s later the run still
    waits; at 5 s it resumes, the sleep returns 0 and now() is the wake-up time."""
    env = WorkflowEnvironment()
    env.deploy("sleep", sleep_module().wasm())
    start = env.clock.ms
    run = env.run("sleep")
    wait = wait_of(env, run)
    assert (wait["kind"], wait["wake_at_ms"]) == ("timer", start + 5000)
    assert env.describe(run)["waiting_on"] == "timer until 2026-01-01 00:00:05 UTC"
    assert env.history(run) == []

    env.advance(ms=4999)
    assert env.status(run) == "ready"
    env.advance(ms=1)
    assert env.result(run) == [0, start + 5000]
    [event] = env.history(run)
    assert isinstance(event, SleepEvent)
    assert (event.duration_ms, event.wake_at_ms, event.status) == (5000, start + 5000, 0)
    assert_replays_quietly(env, run)


def test_sleep_returns_cancelled_when_the_run_is_cancelled() -> None:
    """Cancelling a sleeping run wakes it at once; the sleep returns CANCELLED (5)."""
    env = WorkflowEnvironment()
    env.deploy("sleep", sleep_module().wasm())
    start = env.clock.ms
    run = env.run("sleep")
    env.clock.advance(1000)
    env.cancel(run)
    env.run_until_idle()
    assert env.result(run) == [AbiStatus.CANCELLED, start + 1000]
    [event] = env.history(run)
    assert isinstance(event, SleepEvent)
    assert event.status == AbiStatus.CANCELLED
    assert_replays_quietly(env, run)


# --- durable_await_signals ------------------------------------------------------------------


def await_module(timeout_ms: int, names: tuple[str, ...] | str = ("go", "stop")) -> Wat:
    w = Wat()
    names_text = names if isinstance(names, str) else json.dumps(list(names))
    wait = f"(call $durable_await_signals {w.s(names_text)} (i64.const {timeout_ms}))"
    w.run(f"(call $rec {wait}) (call $rec {wait}) (call $finish)")
    return w


AWAIT_WAT = await_module(-1).source()


def test_signals_delivered_before_the_wait_are_taken_in_order() -> None:
    """Signals that arrive before the guest waits are there when it does: the first wait
    gets the oldest, the second the next; the reply is {"name","payload"} with the payload
    embedded as JSON. No suspension is needed."""
    env = WorkflowEnvironment()
    env.deploy("await", await_module(-1).wasm())
    run = env.start("await")
    env.signal(run, "go", {"n": 1})
    env.signal(run, "stop", "bye")
    assert env.run_until_idle() == 1

    assert env.result(run) == [
        [0, '{"name":"go","payload":{"n":1}}'],
        [0, '{"name":"stop","payload":"bye"}'],
    ]
    assert all(s.consumed for s in env.storage.signals)
    assert event_types(env, run) == ["await_signals", "await_signals"]
    assert_replays_quietly(env, run)


def test_a_waiting_run_resumes_on_a_matching_signal_only() -> None:
    """The run waits on signals go/stop; a signal of another name does not satisfy it; a
    matching one does."""
    env = WorkflowEnvironment()
    env.deploy("await", await_module(-1).wasm())
    run = env.run("await")
    wait = wait_of(env, run)
    assert (wait["kind"], wait["signals"], wait["wake_at_ms"]) == ("signals", ["go", "stop"], None)

    env.signal(run, "other", 1)
    env.run_until_idle()
    assert env.status(run) == "ready"
    assert env.history(run) == []
    env.signal(run, "stop", [1, 2])
    env.run_until_idle()
    env.signal(run, "go")
    env.run_until_idle()
    assert env.result(run) == [
        [0, '{"name":"stop","payload":[1,2]}'],
        [0, '{"name":"go","payload":null}'],
    ]
    assert [s.consumed for s in env.storage.signals] == [False, True, True]
    assert_replays_quietly(env, run)


def test_await_signals_times_out() -> None:
    """With a 2 s timeout and no signal, the wait answers TIMEOUT (4) at 2 s."""
    env = WorkflowEnvironment()
    env.deploy("await", await_module(2000).wasm())
    start = env.clock.ms
    run = env.run("await")
    assert wait_of(env, run)["wake_at_ms"] == start + 2000
    env.advance(seconds=2)
    assert wait_of(env, run)["wake_at_ms"] == start + 4000  # the second wait started at 2 s
    env.advance(seconds=2)
    assert env.result(run) == [[AbiStatus.TIMEOUT, ""], [AbiStatus.TIMEOUT, ""]]
    assert_replays_quietly(env, run)


def test_await_signals_returns_cancelled_for_a_cancelled_run() -> None:
    """Cancellation wakes the waiting run; every wait from then on answers CANCELLED (5)."""
    env = WorkflowEnvironment()
    env.deploy("await", await_module(-1).wasm())
    run = env.run("await")
    env.cancel(run)
    env.run_until_idle()
    assert env.result(run) == [[AbiStatus.CANCELLED, ""], [AbiStatus.CANCELLED, ""]]
    events = [e for e in env.history(run) if isinstance(e, AwaitSignalsEvent)]
    assert [e.status for e in events] == [AbiStatus.CANCELLED, AbiStatus.CANCELLED]
    assert_replays_quietly(env, run)


def test_await_signals_refuses_names_that_are_not_a_list_of_strings() -> None:
    """The names argument must be a non-empty JSON array of strings: PERMANENT."""
    env = WorkflowEnvironment()
    env.deploy("await", await_module(-1, names="[]").wasm())
    run = env.run("await")
    message = "signal names must be a non-empty JSON array of strings"
    assert env.result(run) == [[2, message], [2, message]]
    assert_replays_quietly(env, run)


# --- poll_signal, poll_cancellation ---------------------------------------------------------


def poll_module() -> Wat:
    w = Wat()
    poll = f"(call $poll_signal {w.s('x')})"
    w.run(
        f"""
    (call $rec {poll})
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (call $rec {poll})
    (call $rec {poll})
    (call $finish)"""
    )
    return w


POLL_WAT = poll_module().source()


def test_poll_signal_answers_not_found_or_takes_the_signal() -> None:
    """poll_signal never waits: NOT_FOUND (7) when nothing came, the payload when a signal
    is there, which it consumes (a second poll answers NOT_FOUND). Each outcome is recorded."""
    env = WorkflowEnvironment()
    env.deploy("poll", poll_module().wasm())
    run = env.run("poll")
    env.signal(run, "x", 1)
    env.signal(run, "go")
    env.run_until_idle()
    assert env.result(run) == [
        [7, ""],
        [0, '{"name":"go","payload":null}'],
        [0, "1"],
        [7, ""],
    ]
    assert event_types(env, run) == [
        "signal_received",
        "await_signals",
        "signal_received",
        "signal_received",
    ]
    assert_replays_quietly(env, run)


def cancellation_module() -> Wat:
    w = Wat()
    w.run(
        """
    (call $rec (call $poll_cancellation))
    (call $recn (call $durable_sleep (i64.const 60000)))
    (call $rec (call $poll_cancellation))
    (call $finish)"""
    )
    return w


CANCELLATION_WAT = cancellation_module().source()


def test_poll_cancellation_reports_the_reason_once_requested() -> None:
    """NOT_FOUND before a cancellation request; the reason after it."""
    env = WorkflowEnvironment()
    env.deploy("cancel", cancellation_module().wasm())
    run = env.run("cancel")
    env.cancel(run, "customer changed their mind")
    env.run_until_idle()
    assert env.result(run) == [[7, ""], 5, [0, "customer changed their mind"]]
    assert event_types(env, run) == ["cancellation_check", "sleep", "cancellation_check"]
    assert_replays_quietly(env, run)


# --- signal_workflow ------------------------------------------------------------------------


def receiver_module(name: str = "ping") -> Wat:
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js([name])} (i64.const -1))) (call $finish)")
    return w


def sender_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $signal_workflow {w.input_string()} {w.s("ping")} {w.js({"from": "a"})}))
    (call $rec (call $signal_workflow {w.s("no-such-workflow")} {w.s("ping")} {w.js({})}))
    (call $finish)"""
    )
    return w


SIGNAL_WAT = sender_module().source() + receiver_module().source()


def test_signal_workflow_reaches_another_run_or_reports_not_found() -> None:
    """A workflow signals another by workflow id (OK, the receiver resumes with it); an
    unknown target is NOT_FOUND. Each send is recorded as signal_sent with its status."""
    env = WorkflowEnvironment()
    env.deploy("receiver", receiver_module().wasm())
    env.deploy("sender", sender_module().wasm())
    receiver = env.run("receiver", workflow_id="rx")
    sender = env.run("sender", json.dumps("rx"))

    assert env.result(sender) == [[0, ""], [7, ""]]
    assert env.result(receiver) == [[0, '{"name":"ping","payload":{"from":"a"}}']]
    sent = [e for e in env.history(sender) if isinstance(e, SignalSentEvent)]
    assert [(e.target_id, e.status) for e in sent] == [("rx", 0), ("no-such-workflow", 7)]
    assert_replays_quietly(env, sender, receiver)
    assert len(env.storage.signals) == 1


def test_signal_to_a_finished_workflow_is_not_found() -> None:
    """A run that has finished takes no more signals."""
    env = WorkflowEnvironment()
    env.deploy("receiver", receiver_module().wasm())
    env.deploy("sender", sender_module().wasm())
    receiver = env.run("receiver", workflow_id="rx")
    env.signal(receiver, "ping")
    env.run_until_idle()
    sender = env.run("sender", json.dumps("rx"))
    assert env.result(sender) == [[7, ""], [7, ""]]
    assert_replays_quietly(env, sender)


# --- send_signal_and_wait, reply_to_signal --------------------------------------------------


def server_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (local.set $m (call $durable_await_signals {w.js(["ask"])} (i64.const -1)))
    (call $rec (local.get $m))
    (local.set $c {w.field("m", "correlation_id")})
    (call $rec (call $reply_to_signal {w.payload("c")} {w.js({"answer": 42})}))
    (call $rec (call $reply_to_signal {w.s("not-a-correlation-id")} {w.js({})}))
    (call $finish)""",
        locals="$m i64 $c i64",
    )
    return w


def client_module(timeout_ms: int) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $send_signal_and_wait {w.input_string()} {w.s("ask")} {w.js({"q": "life"})}
        (i64.const {timeout_ms})))
    (call $finish)"""
    )
    return w


REPLY_WAT = server_module().source() + client_module(10_000).source()


def test_send_signal_and_wait_gets_the_receivers_reply() -> None:
    """The client's signal reaches the server with a correlation_id in the await reply;
    the server answers with reply_to_signal; the client's wait returns that answer. A
    reply to a malformed correlation id is NOT_FOUND."""
    env = WorkflowEnvironment()
    env.deploy("server", server_module().wasm())
    env.deploy("client", client_module(10_000).wasm())
    server = env.run("server", workflow_id="srv")
    client = env.run("client", json.dumps("srv"))

    assert env.result(client) == [[0, '{"answer":42}']]
    [(status, received), replied, bad_reply] = env.result(server)
    assert status == 0
    message = json.loads(received)
    assert (message["name"], message["payload"]) == ("ask", {"q": "life"})
    assert isinstance(message["correlation_id"], str)
    assert message["correlation_id"]
    assert replied == [0, ""]
    assert bad_reply == [7, ""]
    assert event_types(env, client) == ["signal_sent", "await_signals"]
    assert event_types(env, server) == ["await_signals", "signal_reply", "signal_reply"]
    assert_replays_quietly(env, client, server)


def test_send_signal_and_wait_times_out_without_a_reply() -> None:
    """The receiver takes the signal but never replies: the sender gets TIMEOUT (4) once
    its timeout has passed."""
    env = WorkflowEnvironment()
    env.deploy("receiver", receiver_module("ask").wasm())
    env.deploy("client", client_module(3000).wasm())
    receiver = env.run("receiver", workflow_id="rx")
    client = env.run("client", json.dumps("rx"))
    assert env.status(receiver) == "done"
    assert env.status(client) == "ready"
    env.advance(seconds=3)
    assert env.result(client) == [[AbiStatus.TIMEOUT, ""]]
    assert_replays_quietly(env, client, receiver)


def test_send_signal_and_wait_to_an_unknown_target_is_not_found() -> None:
    """Nothing to wait for: the send's NOT_FOUND comes back at once."""
    env = WorkflowEnvironment()
    env.deploy("client", client_module(3000).wasm())
    client = env.run("client", json.dumps("nobody"))
    [[status, message]] = env.result(client)
    assert status == AbiStatus.NOT_FOUND
    assert "nobody" in message
    assert_replays_quietly(env, client)


# --- set_query_state ------------------------------------------------------------------------


def query_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $recn (call $set_query_state {w.s("stage")} {w.js("waiting")}))
    (drop (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (drop (call $set_query_state {w.s("stage")} {w.js("done")}))
    (drop (call $set_query_state {w.s("count")} {w.s("1")}))
    (call $finish)"""
    )
    return w


QUERY_WAT = query_module().source()


def test_query_state_is_readable_while_waiting_and_after_the_end() -> None:
    """set_query_state publishes a value under a key (the last value wins) while the run
    waits and after it finished; it records no event, and replay rebuilds the same state."""
    env = WorkflowEnvironment()
    env.deploy("query", query_module().wasm())
    run = env.run("query")
    assert env.describe(run)["query_state"] == {"stage": '"waiting"'}
    env.signal(run, "go")
    env.run_until_idle()

    assert env.result(run) == [0]
    assert env.describe(run)["query_state"] == {"stage": '"done"', "count": "1"}
    assert event_types(env, run) == ["await_signals"]
    assert_replays_quietly(env, run)
    assert env.replay(run).query_state == {"stage": '"done"', "count": "1"}
