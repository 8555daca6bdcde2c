"""The order saga written with each guest SDK (Rust, C, Zig, AssemblyScript), run fresh and
replayed in memory on virtual time: the same behaviour as ``examples/order_saga.py``."""

from __future__ import annotations

import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime

from engine.abi import IMPORTS, IMPORTS_BY_NAME, wasm_param_types
from engine.errors import PermanentError
from engine.services import Fetcher
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of
from tests.fixtures.guests import CARGO_SAGA, LANGUAGES, ROOT, built, built_example

DAY_S = 86_400
ORDER = {"order_id": "A-1", "sku": "book", "qty": 1, "amount_cents": 1299}


@pytest.fixture(params=[*LANGUAGES, "cargo"])
def saga(request: pytest.FixtureRequest) -> bytes:
    if request.param == "cargo":
        return built(CARGO_SAGA)
    return built_example(request.param, "order_saga")


def saga_services(charge: object = None) -> dict[str, FakeService]:
    return {
        "inventory": FakeService({"reserve": {"id": "res-1"}, "release": {"ok": True}}),
        "payments": FakeService({"charge": charge or {"id": "ch-1"}, "refund": {"ok": True}}),
    }


def test_the_saga_ships(saga: bytes) -> None:
    services = saga_services()
    env = WorkflowEnvironment(services)
    env.deploy("order_saga", saga)
    run = env.run("order_saga", ORDER)
    assert wait_of(env, run)["signals"] == ["shipped"]
    assert env.describe(run)["query_state"] == {"status": '"awaiting_shipment"'}
    assert services["inventory"].calls[0].request == {"order_id": "A-1", "sku": "book", "qty": 1}
    assert services["payments"].calls[0].request == {"order_id": "A-1", "amount_cents": 1299}
    env.signal(run, "shipped", {"carrier": "ups", "tracking": "1Z"})
    env.advance(seconds=3601.25)
    shipped_at = dt.datetime.fromtimestamp(env.clock.now() / 1000, dt.UTC).isoformat()
    assert env.result(run) == {
        "order_id": "A-1",
        "status": "shipped",
        "charge_id": "ch-1",
        "carrier": "ups",
        "shipped_at": shipped_at,
    }
    assert env.describe(run)["query_state"] == {"status": '"shipped"'}
    assert services["inventory"].ops() == ["reserve"]
    assert services["payments"].ops() == ["charge"]
    assert_replays_quietly(env, run, watch=services.values())


def test_a_declined_charge_releases_the_stock(saga: bytes) -> None:
    services = saga_services(charge=PermanentError("card declined"))
    env = WorkflowEnvironment(services)
    env.deploy("order_saga", saga)
    run = env.run("order_saga", ORDER)
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("failed", "permanent")
    assert info["error"] == "order A-1: payment failed: card declined"
    assert info["query_state"] == {"status": '"payment_failed"'}
    assert services["inventory"].ops() == ["reserve", "release"]
    assert services["inventory"].calls[1].request == {"reservation_id": "res-1"}
    assert_replays_quietly(env, run, watch=services.values())


def test_nothing_shipped_in_three_days_compensates_in_reverse_order(saga: bytes) -> None:
    services = saga_services()
    env = WorkflowEnvironment(services)
    env.deploy("order_saga", saga)
    run = env.run("order_saga", ORDER)
    env.advance(seconds=3 * DAY_S - 1)
    assert env.status(run) == "ready"
    env.advance(seconds=1)
    assert env.result(run) == {
        "order_id": "A-1",
        "status": "cancelled",
        "reason": "not shipped within 3 days",
    }
    calls = [
        (c.operation, c.request)
        for s in ("payments", "inventory")
        for c in services[s].calls
        if c.operation in ("refund", "release")
    ]
    assert calls == [("refund", {"charge_id": "ch-1"}), ("release", {"reservation_id": "res-1"})]
    types = event_types(env, run)
    assert types.index("await_signals") < len(types) - 2, "compensations come after the wait"
    assert_replays_quietly(env, run, watch=services.values())


def test_a_failing_charge_is_retried_durably_then_compensated(saga: bytes) -> None:
    """A retryable failure is retried three times with durable backoff (2 s, then 4 s);
    the exhausted retries compensate and fail the run as permanent, naming the last error."""
    services = saga_services(charge=[RuntimeError("gateway down")] * 3)
    env = WorkflowEnvironment(services)
    env.deploy("order_saga", saga)
    run = env.run("order_saga", ORDER)
    env.advance(seconds=2)
    env.advance(seconds=4)
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("failed", "permanent")
    assert info["error"].startswith("order A-1: payment failed: ")
    assert "gateway down" in info["error"]
    assert [c.attempt for c in services["payments"].calls] == [1, 2, 3]
    assert services["inventory"].ops() == ["reserve", "release"]
    assert_replays_quietly(env, run, watch=services.values())


# --- every wrapper compiles, and imports the host function it wraps ---------------------------

CHECKS = ROOT / "tests" / "fixtures" / "guest_checks"
TOUR_SUFFIXES = (".rs", ".c", ".zig", ".ts")


def _imports(wasm: bytes) -> dict[str, tuple[list[str], list[str]]]:
    module = wasmtime.Module(wasmtime.Engine(), wasm)
    found = {}
    for imp in module.imports:
        assert imp.module == "env", imp.module
        func = imp.type
        assert isinstance(func, wasmtime.FuncType), imp.name
        found[imp.name] = ([str(p) for p in func.params], [str(r) for r in func.results])
    return found


def test_every_assemblyscript_wrapper_imports_its_host_function_with_the_abis_types() -> None:
    """The check module exports the whole SDK, so asc compiles every wrapper; each one's
    import must be the host's, with the signature the host links."""
    found = _imports(built(CHECKS / "sdk_check.ts"))
    expected = {imp.name: (wasm_param_types(imp.params), ["i64"]) for imp in IMPORTS}
    assert found == expected


def test_every_declaration_of_the_zig_sdk_compiles_and_deploys() -> None:
    wasm = built(CHECKS / "sdk_check.zig")
    env = WorkflowEnvironment({})
    env.deploy("check", wasm)
    assert env.result(env.run("check", {"echo": [1, "two"]})) == {"echo": [1, "two"]}


@pytest.mark.parametrize("language", LANGUAGES)
def test_each_saga_imports_only_host_functions_with_the_abis_types(language: str) -> None:
    for name, (params, results) in _imports(built_example(language, "order_saga")).items():
        imp = IMPORTS_BY_NAME[name]
        assert (params, results) == (wasm_param_types(imp.params), ["i64"]), name


# --- the wrappers beyond the saga's, at run time ------------------------------------------------

TOUR_RESULT = {
    "count": 3,
    "has": True,
    "stored": 3,
    "listed": ["count"],
    "deleted": True,
    "after": None,
    "uuid_len": 36,
    "side": 42,
    "slept": True,
    "polled": None,
    "child": {"x": 1},
    "workflow_id_set": True,
    "version": 1,
    "promised": 7,
    "locked": True,
    "scope_is_object": True,
}


@pytest.mark.parametrize("suffix", TOUR_SUFFIXES)
def test_the_tour_of_state_identity_timers_signals_promises_locks_and_children(suffix: str) -> None:
    env = WorkflowEnvironment({})
    env.deploy("tour", built(CHECKS / f"tour{suffix}"))
    run = env.run("tour", {"n": 2})
    assert env.status(run) == "ready", "the durable sleep suspends the run"
    env.advance(seconds=1)
    env.run_until_idle()
    assert env.result(run) == TOUR_RESULT
    types = event_types(env, run)
    assert {"state_mutation", "side_effect", "sleep", "child_workflow", "await_child"} <= set(types)
    assert {"create_promise", "promise_resolved", "await_promise", "acquire_lock"} <= set(types)
    assert_replays_quietly(env, run)


# --- the rest of the wrappers, at run time: the excursion ------------------------------------

EXCURSION_SUFFIXES = TOUR_SUFFIXES


class _Tour(http.server.BaseHTTPRequestHandler):
    """The fetch target: GET answers the X-Tour header it received as the body."""

    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:
        tour = self.headers.get("X-Tour", "")
        self.seen.append((self.path, tour))
        body = json.dumps({"tour": tour}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fetch_target() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    seen: list[tuple[str, str]] = []
    handler = type("Handler", (_Tour,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


class MathPlugin:
    """A host plugin: ``double`` answers at once, ``count`` streams 0..n-1."""

    def double(self, n: int) -> int:
        return n * 2

    def count(self, n: int) -> Iterator[int]:
        yield from range(n)


LANGUAGE_OF = {".rs": "rust", ".c": "c", ".zig": "zig", ".ts": "assemblyscript"}


@pytest.mark.parametrize("suffix", EXCURSION_SUFFIXES)
def test_the_excursion_runs_every_wrapper_the_saga_and_the_tour_do_not(
    suffix: str, fetch_target: tuple[str, list[tuple[str, str]]]
) -> None:
    """fetch (to a local target), plugins (plain and streaming), send and schedule_invoke
    (queued invocations), a heartbeat call, the JSON helpers, identity, cancellation,
    promise rejection, scopes, crons, a detached run, a signal to a child, await_all /
    await_any / poll_child, signal_and_wait answered by a child's reply_to_signal, an update
    handler applied at a blocking point, continue-as-new
    (plain, then with a version) and a defer, each with the answer the host gave."""
    base, seen = fetch_target
    audit = FakeService({"deferred": {"ok": True}, "note": {}, "later": {}})
    shop = FakeService({"slow": {"ok": True}})
    env = WorkflowEnvironment({"audit": audit, "shop": shop}, plugins={"math": MathPlugin()})
    env.services.fetcher = Fetcher((base + "/",), allow_private=True)
    env.deploy("excursion", built(CHECKS / f"excursion{suffix}"))
    run = env.start("excursion", {"url": base + "/tour"})
    env.run_until_idle()
    assert wait_of(env, run)["signals"] == ["go"]
    update = env.update(run, "on_update", {"u": 1})
    env.run_until_idle()
    assert env.update_result(update) == ("done", '{"u":1}')
    assert env.describe(run)["query_state"] == {"updated": '{"u":1}'}
    env.signal(run, "go", {"g": 1})
    env.run_until_idle()

    final = env.latest_run(run)
    assert final != run
    result = env.result(final)
    assert result == {
        "go": {"g": 1},
        "fetch_status": 200,
        "fetch_body": json.dumps({"tour": LANGUAGE_OF[suffix]}),
        "doubled": 42,
        "counted": [0, 1, 2],
        "sent": 0,
        "invocation_id_len": 36,
        "heartbeat": {"ok": True},
        "parsed": {"a": [1, 2]},
        "stringified": '{"b":true}',
        "bad_json": AbiStatus.PERMANENT,
        "random_differs": True,
        "run_id_len": 36,
        "min_version": 0,
        "cancellation": AbiStatus.NOT_FOUND,
        "rejecting": 0,
        "rejected_status": AbiStatus.ERROR,
        "rejected": "no",
        "previous_scope": {"object_type": "", "instance_key": ""},
        "scope": {"object_type": "cart", "instance_key": "c-1"},
        "crons": 1,
        "cron_deleted": 0,
        "bad_cron": AbiStatus.PERMANENT,
        "detached_id_len": 36,
        "signalled": 0,
        "all": [{"name": "ping", "payload": {"v": 1}}, 2],
        "any": 3,
        "polled": 3,
        "answer": {"answered": {"q": 1}},
    }
    assert seen == [("/tour", LANGUAGE_OF[suffix])]
    assert [(i.service, i.operation) for i in env.storage.invocations] == [
        ("audit", "note"),
        ("audit", "later"),
    ]
    assert shop.ops() == ["slow"]
    assert audit.ops() == ["deferred"]  # the defer ran when the last run ended
    assert audit.calls[0].request == "ok"
    assert event_types(env, final) == ["defer", "call"]  # the handler made its call
    assert event_types(env, run)[-1] == "continue_as_new"
    assert {"update_applied", "fetch", "plugin_call", "durable_send"} <= set(event_types(env, run))
    assert {"schedule_cron", "delete_cron", "list_crons", "await_any_child"} <= set(
        event_types(env, run)
    )
    for each in (run, final):
        assert_replays_quietly(env, each, watch=[audit, shop])
