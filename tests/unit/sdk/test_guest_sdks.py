"""The order saga written with each guest SDK (Rust, C, Zig, AssemblyScript), run fresh and
replayed in memory on virtual time: the same behaviour as ``examples/order_saga.py``."""

from __future__ import annotations

import datetime as dt

import pytest
import wasmtime

from engine.abi import IMPORTS, IMPORTS_BY_NAME, wasm_param_types
from engine.errors import PermanentError
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
