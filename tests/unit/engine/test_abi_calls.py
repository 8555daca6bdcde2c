"""ABI v1, calls to the outside world: durable_call, durable_call_with_retry,
durable_call_with_heartbeat, durable_send, durable_schedule_invoke, fetch, plugin_call,
plugin_call_streaming and write-ahead intents. Each scenario runs fresh, then replays."""

from __future__ import annotations

import http.server
import importlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime

from engine.abi import IMPORTS
from engine.config import EngineConfig
from engine.determinism import idempotency_key
from engine.errors import FenceLost, InvalidModule, PermanentError
from engine.events import CallEvent, HeartbeatEvent, PluginCallEvent, StreamChunkEvent, encode
from engine.services import Fetcher
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of
from tests.fixtures.wat import ABI_V1_PARAMS, Wat, import_all

# --- durable_call ---------------------------------------------------------------------------


def call_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("shop")} {w.s("reserve")} {w.js({"item": "book"})}))
    (call $rec (call $durable_call {w.s("shop")} {w.s("refuse")} {w.js({})}))
    (call $rec (call $durable_call {w.s("shop")} {w.s("crash")} {w.js({})}))
    (call $rec (call $durable_call {w.s("nowhere")} {w.s("op")} {w.js({})}))
    (call $finish)"""
    )
    return w


CALL_WAT = call_module().source()


def test_durable_call_returns_each_outcome_and_replays_without_calling_again() -> None:
    """OK carries the response; PermanentError is PERMANENT; any other exception ERROR; an
    unknown service PERMANENT. Every call gets the step's idempotency key."""
    shop = FakeService(
        {
            "reserve": lambda req: {"reserved": req["item"]},
            "refuse": PermanentError("out of stock"),
            "crash": RuntimeError("db down"),
        }
    )
    env = WorkflowEnvironment({"shop": shop})
    env.deploy("calls", call_module().wasm())
    run = env.run("calls", workflow_id="order-1")

    assert env.result(run) == [
        [0, '{"reserved":"book"}'],
        [2, "out of stock"],
        [1, "RuntimeError: db down"],
        [2, "unknown service 'nowhere' (configure it in CLEAT_SERVICES)"],
    ]
    assert shop.ops() == ["reserve", "refuse", "crash"]
    assert [c.request for c in shop.calls] == [{"item": "book"}, {}, {}]
    assert [c.idempotency_key for c in shop.calls] == [
        idempotency_key("order-1", run, step) for step in (0, 1, 2)
    ]
    history = env.history(run)
    assert event_types(env, run) == ["call"] * 4
    assert [e.status for e in history if isinstance(e, CallEvent)] == [0, 2, 1, 2]
    assert_replays_quietly(env, run, watch=[shop])


# --- durable_call_with_retry ----------------------------------------------------------------


def retry_module(max_attempts: int, initial_ms: int, coeff_x100: int, max_ms: int) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call_with_retry {w.s("pay")} {w.s("charge")} {w.js({"amount": 5})}
        (i64.const {max_attempts}) (i64.const {initial_ms}) (i64.const {coeff_x100})
        (i64.const {max_ms}) {w.js(["card declined"])}))
    (call $finish)"""
    )
    return w


RETRY_WAT = retry_module(3, 1000, 200, 0).source()


def test_retry_waits_on_durable_backoff_timers_between_attempts() -> None:
    """Two failures then success: the run suspends on a retry-backoff timer of 1 s, then
    2 s (coefficient 2.0); every attempt carries the first attempt's idempotency key."""
    pay = FakeService({"charge": [RuntimeError("busy"), RuntimeError("busy"), {"paid": 5}]})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", retry_module(3, 1000, 200, 0).wasm())
    run = env.run("retry")
    start = env.clock.ms

    wait = wait_of(env, run)
    assert (wait["kind"], wait["wake_at_ms"]) == ("retry_backoff", start + 1000)
    assert len(pay.calls) == 1
    env.advance(ms=999)
    assert len(pay.calls) == 1, "the backoff timer fired early"
    env.advance(ms=1)
    assert len(pay.calls) == 2
    assert wait_of(env, run)["wake_at_ms"] == start + 1000 + 2000
    env.advance(seconds=2)

    assert env.result(run) == [[0, '{"paid":5}']]
    assert [c.attempt for c in pay.calls] == [1, 2, 3]
    assert {c.idempotency_key for c in pay.calls} == {idempotency_key(run, run, 0)}
    assert event_types(env, run) == ["call", "sleep", "call", "sleep", "call"]
    sleeps = [e for e in env.history(run) if e.TYPE.value == "sleep"]
    assert [(e.duration_ms, e.reason) for e in sleeps] == [(1000, "retry"), (2000, "retry")]
    assert_replays_quietly(env, run, watch=[pay])


def test_retry_backoff_is_capped_by_max_interval() -> None:
    """initial 1 s, coefficient 10x, max 1.5 s: the second wait is 1.5 s, not 10 s."""
    pay = FakeService({"charge": [RuntimeError("a"), RuntimeError("b"), {"ok": 1}]})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", retry_module(5, 1000, 1000, 1500).wasm())
    run = env.run("retry")
    env.advance(seconds=1)
    env.advance(ms=1500)
    assert env.result(run) == [[0, '{"ok":1}']]
    sleeps = [e.duration_ms for e in env.history(run) if e.TYPE.value == "sleep"]
    assert sleeps == [1000, 1500]
    assert_replays_quietly(env, run, watch=[pay])


def test_retry_reports_retries_exhausted_with_the_last_error() -> None:
    """Every attempt fails: RETRIES_EXHAUSTED (6) carrying the last attempt's message."""
    pay = FakeService({"charge": [RuntimeError("first"), RuntimeError("second")]})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", retry_module(2, 10, 100, 0).wasm())
    run = env.run("retry")
    env.advance(ms=10)
    assert env.result(run) == [[AbiStatus.RETRIES_EXHAUSTED, "RuntimeError: second"]]
    assert len(pay.calls) == 2
    assert_replays_quietly(env, run, watch=[pay])


@pytest.mark.parametrize(
    "failure",
    [PermanentError("invalid card"), RuntimeError("gateway says: card declined")],
    ids=["permanent-status", "non-retryable-substring"],
)
def test_retry_stops_at_a_permanent_or_non_retryable_error(failure: Exception) -> None:
    """A PERMANENT answer, or an error containing one of non_retryable_errors, ends the
    retries at once with PERMANENT: one attempt, no backoff timer."""
    pay = FakeService({"charge": [failure, "never reached"]})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", retry_module(5, 1000, 200, 0).wasm())
    run = env.run("retry")
    [[status, message]] = env.result(run)
    assert status == AbiStatus.PERMANENT
    assert message.endswith(str(failure))
    assert len(pay.calls) == 1
    assert event_types(env, run) == ["call"]
    assert_replays_quietly(env, run, watch=[pay])


def test_retry_attempts_are_capped_at_100() -> None:
    """max_attempts 1000 is capped at 100 (zero backoff keeps it in one segment)."""
    pay = FakeService({"charge": lambda req: (_ for _ in ()).throw(RuntimeError("down"))})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", retry_module(1000, 0, 100, 0).wasm())
    run = env.run("retry")
    assert env.result(run) == [[AbiStatus.RETRIES_EXHAUSTED, "RuntimeError: down"]]
    assert len(pay.calls) == 100
    assert pay.calls[-1].attempt == 100
    assert event_types(env, run).count("call") == 100
    assert_replays_quietly(env, run, watch=[pay])


def test_retry_refuses_a_malformed_non_retryable_list_without_calling() -> None:
    """non_retryable_errors must be a JSON array of strings: PERMANENT, no call made."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call_with_retry {w.s("pay")} {w.s("charge")} {w.js({})}
        (i64.const 3) (i64.const 10) (i64.const 100) (i64.const 0) {w.s('{"not":"a list"}')}))
    (call $finish)"""
    )
    pay = FakeService({"charge": "ok"})
    env = WorkflowEnvironment({"pay": pay})
    env.deploy("retry", w.wasm())
    run = env.run("retry")
    assert env.result(run) == [[2, "non_retryable_errors must be a JSON array of strings"]]
    assert pay.calls == []
    assert_replays_quietly(env, run, watch=[pay])


# --- durable_call_with_heartbeat ------------------------------------------------------------


def heartbeat_module(interval_ms: int) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call_with_heartbeat {w.s("batch")} {w.s("export")}
        {w.js({"rows": 3})} (i64.const {interval_ms})))
    (call $finish)"""
    )
    return w


HEARTBEAT_WAT = heartbeat_module(100).source()


def test_heartbeat_call_keeps_the_lease_alive_while_it_runs() -> None:
    """A 0.35 s call with a 100 ms heartbeat: the answer is recorded once as a heartbeat
    event that counts the beats sent; replay does not call again."""
    batch = FakeService({"export": lambda req: time.sleep(0.35) or {"exported": req["rows"]}})
    env = WorkflowEnvironment({"batch": batch})
    env.deploy("hb", heartbeat_module(100).wasm())
    run = env.run("hb")
    assert env.result(run) == [[0, '{"exported":3}']]
    [event] = env.history(run)
    assert isinstance(event, HeartbeatEvent)
    assert event.interval_ms == 100
    assert event.beats >= 1
    assert_replays_quietly(env, run, watch=[batch])


def test_heartbeat_call_notices_a_lost_lease() -> None:
    """When the run is taken away during the call (here: terminated, which bumps the
    generation), the next heartbeat fails and the segment ends with FenceLost, writing
    nothing: the history holds only the operator's close."""
    env = WorkflowEnvironment()

    def export(request: Any) -> str:
        env.terminate(run, "operator")
        time.sleep(0.25)
        return "done"

    env.services.caller.inner.register("batch", FakeService({"export": export}))
    env.deploy("hb", heartbeat_module(100).wasm())
    run = env.start("hb")
    with pytest.raises(FenceLost, match="lost its lease during a heartbeat call"):
        env.step()
    assert env.status(run) == "terminated"
    assert [e.TYPE.value for e in env.history(run)] == ["admin_action"]


# --- durable_send, durable_schedule_invoke --------------------------------------------------


def send_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_send {w.s("mail")} {w.s("welcome")} {w.js({"to": "ada"})}))
    (call $rec (call $durable_schedule_invoke {w.s("mail")} {w.s("remind")}
        {w.js({"to": "ada"})} (i64.const 5000)))
    (call $finish)"""
    )
    return w


SEND_WAT = send_module().source()


def test_send_and_schedule_invoke_enqueue_invocations_instead_of_calling() -> None:
    """durable_send answers a bare OK and enqueues an invocation due now; the scheduled one
    is due after its delay and answers its invocation id. Neither calls the service in the
    segment; both carry the step's idempotency key."""
    mail = FakeService({"welcome": "sent", "remind": "sent"})
    env = WorkflowEnvironment({"mail": mail})
    env.deploy("send", send_module().wasm())
    start = env.clock.ms
    run = env.run("send")

    first, second = env.storage.invocations
    result = env.result(run)
    assert result == [[0, ""], [0, second.invocation_id]]
    assert mail.calls == []
    assert (first.service, first.operation, first.request) == ("mail", "welcome", '{"to":"ada"}')
    assert first.deliver_at_ms == start
    assert (second.operation, second.deliver_at_ms) == ("remind", start + 5000)
    assert [first.idempotency_key, second.idempotency_key] == [
        idempotency_key(run, run, 0),
        idempotency_key(run, run, 1),
    ]
    assert event_types(env, run) == ["durable_send", "durable_schedule_invoke"]
    assert_replays_quietly(env, run, watch=[mail])
    assert len(env.storage.invocations) == 2


# --- fetch ----------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    requests: list[tuple[str, str, str, str]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.requests.append((self.command, self.path, self.headers.get("X-Trace", ""), body))
        data = json.dumps({"echo": body}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[tuple[str, str, str, str]]]]:
    requests: list[tuple[str, str, str, str]] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def fetch_module(url: str) -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $fetch {w.s("POST")} {w.s(url)} {w.js({"X-Trace": "t-1"})}
        {w.s("hello")}))
    (call $finish)"""
    )
    return w


FETCH_WAT = fetch_module("https://api.example.com/hook").source()


def test_fetch_is_denied_for_a_url_off_the_allow_list(
    http_server: tuple[str, list[Any]],
) -> None:
    """A URL the allow-list does not cover is DENIED (8), and nothing is requested."""
    base, requests = http_server
    env = WorkflowEnvironment(fetch_allow=("https://api.example.com/",))
    env.services.fetcher = Fetcher(("https://api.example.com/",), allow_private=True)
    env.deploy("fetch", fetch_module(base + "/hook").wasm())
    run = env.run("fetch")
    assert env.result(run) == [[AbiStatus.DENIED, f"{base}/hook is not on the fetch allow-list"]]
    assert requests == []
    assert event_types(env, run) == ["fetch"]
    assert_replays_quietly(env, run)


def test_fetch_refuses_loopback_unless_private_addresses_are_allowed(
    http_server: tuple[str, list[Any]],
) -> None:
    """On the allow-list but resolving to 127.0.0.1: DENIED without allow_private."""
    base, requests = http_server
    env = WorkflowEnvironment(fetch_allow=(base + "/",))
    env.deploy("fetch", fetch_module(base + "/hook").wasm())
    run = env.run("fetch")
    [[status, message]] = env.result(run)
    assert status == AbiStatus.DENIED
    assert "private address" in message
    assert requests == []
    assert_replays_quietly(env, run)


def test_allowed_fetch_returns_status_headers_and_body_and_replays_without_a_request(
    http_server: tuple[str, list[Any]],
) -> None:
    """An allowed fetch answers {"status","headers","body"}; the request carried the
    method, headers and body the guest gave; replay makes no second request."""
    base, requests = http_server
    env = WorkflowEnvironment()
    env.services.fetcher = Fetcher((base + "/",), allow_private=True)
    env.deploy("fetch", fetch_module(base + "/hook").wasm())
    run = env.run("fetch")

    [[status, payload]] = env.result(run)
    assert status == AbiStatus.OK
    response = json.loads(payload)
    assert response["status"] == 201
    assert response["headers"]["Content-Type"] == "application/json"
    assert json.loads(response["body"]) == {"echo": "hello"}
    assert requests == [("POST", "/hook", "t-1", "hello")]
    env.assert_replays(run)
    assert len(requests) == 1, "replay fetched again"


# --- plugins --------------------------------------------------------------------------------


class Tokenizer:
    """A host plugin: ``split`` answers at once, ``stream`` yields one chunk per word."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def split(self, text: str) -> list[str]:
        self.calls.append(("split", text))
        return text.split()

    def broken(self, text: str) -> None:
        self.calls.append(("broken", text))
        raise ValueError("model unavailable")

    def stream(self, text: str) -> Iterator[dict[str, str]]:
        self.calls.append(("stream", text))
        for word in text.split():
            yield {"token": word}


def plugin_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $plugin_call {w.s("tok")} {w.s("split")} {w.js("a b")}))
    (call $rec (call $plugin_call {w.s("tok")} {w.s("broken")} {w.js("x")}))
    (call $rec (call $plugin_call {w.s("tok")} {w.s("missing")} {w.js("x")}))
    (call $rec (call $plugin_call_streaming {w.s("tok")} {w.s("stream")} {w.js("hi there you")}))
    (call $rec (call $plugin_call {w.s("nope")} {w.s("split")} {w.js("x")}))
    (call $finish)"""
    )
    return w


PLUGIN_WAT = plugin_module().source()


def test_plugin_calls_and_streaming_chunks_are_recorded_and_replayed() -> None:
    """plugin_call answers OK / ERROR / PERMANENT; plugin_call_streaming answers the JSON
    array of chunks and records each chunk as a plugin_call_stream_chunk event before the
    call's own event. Replay calls no plugin function."""
    tok = Tokenizer()
    env = WorkflowEnvironment(plugins={"tok": tok})
    # No cool-down here (test_policy_scenarios.py covers it): the call after the one that
    # raised is made, and reports its own problem.
    env.services.plugins.cooldown_s = 0
    env.deploy("plugins", plugin_module().wasm())
    run = env.run("plugins")

    assert env.result(run) == [
        [0, '["a","b"]'],
        [1, "ValueError: model unavailable"],
        [2, "plugin 'tok' has no function 'missing'"],
        [0, '[{"token":"hi"},{"token":"there"},{"token":"you"}]'],
        [2, "unknown plugin 'nope'"],
    ]
    assert tok.calls == [("split", "a b"), ("broken", "x"), ("stream", "hi there you")]
    assert event_types(env, run) == [
        "plugin_call",
        "plugin_call",
        "plugin_call",
        *["plugin_call_stream_chunk"] * 3,
        "plugin_call",
        "plugin_call",
    ]
    chunks = [e for e in env.history(run) if isinstance(e, StreamChunkEvent)]
    assert [(c.index, c.chunk) for c in chunks] == [
        (0, '{"token":"hi"}'),
        (1, '{"token":"there"}'),
        (2, '{"token":"you"}'),
    ]
    streamed = [e for e in env.history(run) if isinstance(e, PluginCallEvent) and e.streaming]
    assert len(streamed) == 1
    assert_replays_quietly(env, run, watch=[tok])


# --- write-ahead intents --------------------------------------------------------------------

WRITE_AHEAD = EngineConfig(write_ahead_ops=frozenset({"bank.transfer"}))


@pytest.fixture
def write_ahead_env() -> Iterator[WorkflowEnvironment]:
    env = WorkflowEnvironment(config=WRITE_AHEAD, resolvers={})
    yield env
    env.runtime.close()


def transfer_module() -> Wat:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("bank")} {w.s("transfer")} {w.js({"cents": 100})}))
    (call $rec (call $durable_call {w.s("bank")} {w.s("balance")} {w.js({})}))
    (call $finish)"""
    )
    return w


TRANSFER_WAT = transfer_module().source()


def test_write_ahead_intent_is_completed_in_place(write_ahead_env: WorkflowEnvironment) -> None:
    """A write-ahead call stores a pending intent before dispatch, then its outcome at the
    same step: the history ends with one completed call event per call."""
    env = write_ahead_env
    seen: list[int] = []

    def transfer(request: Any) -> dict[str, bool]:
        # The intent is in storage while the service runs.
        [intent] = env.storage.runs[run].history
        seen.append(intent.step)
        assert intent.checksum == ""
        return {"ok": True}

    bank = FakeService({"transfer": transfer, "balance": 900})
    env.services.caller.inner.register("bank", bank)
    env.deploy("transfer", transfer_module().wasm())
    run = env.start("transfer")
    env.run_until_idle()

    assert env.result(run) == [[0, '{"ok":true}'], [0, "900"]]
    assert seen == [0]
    history = env.history(run)
    assert [(e.step, e.pending) for e in history if isinstance(e, CallEvent)] == [
        (0, False),
        (1, False),
    ]
    assert all(stored.checksum for stored in env.storage.runs[run].history)
    assert_replays_quietly(env, run, watch=[bank])


def _crash_after_dispatch(env: WorkflowEnvironment, run: str) -> None:
    """Leave the run as a worker that died mid-call would: a pending intent at step 0."""
    intent = CallEvent(
        step=0,
        ts=env.clock.ms,
        service="bank",
        operation="transfer",
        request='{"cents":100}',
        pending=True,
    )
    env.storage.runs[run].history.append(encode(intent))


def test_pending_intent_without_resolver_replays_as_ambiguous(
    write_ahead_env: WorkflowEnvironment,
) -> None:
    """Replaying an intent with no outcome never re-sends the call: the guest gets
    AMBIGUOUS (3) naming the idempotency key, and that outcome is written to the history."""
    env = write_ahead_env
    bank = FakeService({"transfer": {"ok": True}, "balance": 900})
    env.services.caller.inner.register("bank", bank)
    env.deploy("transfer", transfer_module().wasm())
    run = env.start("transfer")
    _crash_after_dispatch(env, run)
    env.run_until_idle()

    [[status, message], balance] = env.result(run)
    assert status == AbiStatus.AMBIGUOUS
    assert idempotency_key(run, run, 0) in message
    assert balance == [0, "900"]
    assert bank.ops() == ["balance"]
    first = env.history(run)[0]
    assert isinstance(first, CallEvent)
    assert (first.pending, first.status) == (False, AbiStatus.AMBIGUOUS)
    assert_replays_quietly(env, run, watch=[bank])


def test_pending_intent_takes_the_resolvers_answer() -> None:
    """With a resolver for the service, the intent's outcome is what the resolver says
    about the call with that idempotency key."""
    asked: list[tuple[str, str, str]] = []

    def resolver(service: str, operation: str, key: str) -> str:
        asked.append((service, operation, key))
        return '{"ok":true,"resolved":true}'

    env = WorkflowEnvironment(config=WRITE_AHEAD, resolvers={"bank": resolver})
    try:
        bank = FakeService({"transfer": {"ok": True}, "balance": 900})
        env.services.caller.inner.register("bank", bank)
        env.deploy("transfer", transfer_module().wasm())
        run = env.start("transfer")
        _crash_after_dispatch(env, run)
        env.run_until_idle()

        assert env.result(run) == [[0, '{"ok":true,"resolved":true}'], [0, "900"]]
        assert asked == [("bank", "transfer", idempotency_key(run, run, 0))]
        assert bank.ops() == ["balance"]
        assert_replays_quietly(env, run, watch=[bank])
        assert len(asked) == 1, "replay asked the resolver again"
    finally:
        env.runtime.close()


# --- the fixtures cover the whole ABI -------------------------------------------------------

GROUP_MODULES = (
    "tests.unit.engine.test_abi_calls",
    "tests.unit.engine.test_abi_time_identity",
    "tests.unit.engine.test_abi_timers_signals",
    "tests.unit.engine.test_abi_promises_updates",
    "tests.unit.engine.test_abi_children",
    "tests.unit.engine.test_abi_state_locks_schedules",
)


def test_the_fixture_transcription_of_abi_md_matches_the_host() -> None:
    """wat.py states every import's signature from ABI.md; a module importing all 55 loads
    (the host checks each signature) and the names are exactly the host's table."""
    assert list(ABI_V1_PARAMS) == [imp.name for imp in IMPORTS]
    env = WorkflowEnvironment()
    env.deploy("everything", wasmtime.wat2wasm(import_all()))
    assert env._modules[("everything", 1)].info.imports == tuple(ABI_V1_PARAMS)


def test_every_abi_import_is_called_by_a_group_fixture() -> None:
    """The group files' module-level WAT sources (``*_WAT``) call every ABI v1 import."""
    called: set[str] = set()
    for name in GROUP_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.endswith("_WAT") and isinstance(value, str):
                called.update(n for n in ABI_V1_PARAMS if f'"env" "{n}"' in value)
    assert sorted(set(ABI_V1_PARAMS) - called) == []


def test_the_batch_extension_links_and_a_wrong_signature_is_refused() -> None:
    """durable_call_many (an optional extension, not ABI v1) is served to core modules in
    "env" with its declared signature; another signature is refused at deploy."""
    env = WorkflowEnvironment()
    try:
        w = Wat()
        w.run(f"(call $rec (call $durable_call_many {w.js([])}))\n(call $finish)")
        env.deploy("batch", w.wasm())
        assert env.result(env.run("batch")) == [[0, "[]"]]
        bad = """(module
  (import "env" "durable_call_many" (func (param i32) (result i64)))
  (memory (export "memory") 1)
  (func (export "cleat_alloc") (param i32) (result i32) (i32.const 0))
  (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"""
        with pytest.raises(InvalidModule, match="durable_call_many with type"):
            env.deploy("bad", wasmtime.wat2wasm(bad))
    finally:
        env.runtime.close()
