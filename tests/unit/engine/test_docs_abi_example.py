"""The worked example of docs/abi.md runs as written: its first ```wat block is compiled and
driven through every path it describes (approved, timed out, service refused, cancelled),
each run replayed from its history afterwards. Edit the document and this test follows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from engine.errors import PermanentError
from engine.events import AwaitSignalsEvent, CallEvent
from engine.status import AbiStatus
from engine.testing import WorkflowEnvironment

ABI_DOC = Path(__file__).resolve().parents[3] / "docs" / "abi.md"
HOUR_MS = 3_600_000


def example_wat() -> str:
    """The first ```wat fenced block of docs/abi.md."""
    found = re.search(r"^```wat\n(.*?)^```$", ABI_DOC.read_text(), re.DOTALL | re.MULTILINE)
    assert found, f"{ABI_DOC} has no ```wat block: the worked example is gone"
    return found.group(1)


class Inventory:
    """The service the example calls: order 0 does not exist."""

    @staticmethod
    def reserve(request: dict[str, Any], *, idempotency_key: str, context: Any) -> Any:
        if request["order"] == 0:
            raise PermanentError("no such order")
        return {"order": request["order"], "slot": "A7"}


@pytest.fixture(scope="module")
def wasm() -> bytes:
    return wasmtime.wat2wasm(example_wat())


@pytest.fixture
def env(wasm: bytes) -> WorkflowEnvironment:
    environment = WorkflowEnvironment(services={"inventory": Inventory})
    environment.deploy("order-approval", wasm)
    return environment


def test_the_example_is_a_complete_module_exporting_what_the_abi_requires(
    env: WorkflowEnvironment, wasm: bytes
) -> None:
    info = env.runtime.load(wasm).info
    assert info.entry_points == ("run",)
    assert set(info.imports) == {"durable_call", "durable_await_signals"}


def test_approved_order_returns_reservation_and_signal_and_replays(
    env: WorkflowEnvironment,
) -> None:
    run = env.run("order-approval", {"order": 42})
    waiting = env.describe(run)["waiting_on"]
    assert waiting.startswith("signals approved"), waiting
    assert [type(e) for e in env.history(run)] == [CallEvent]  # the wait recorded nothing

    env.signal(run, "approved", {"by": "ada"})
    env.run_until_idle()

    assert env.result(run) == {
        "reservation": {"order": 42, "slot": "A7"},
        "approval": {"name": "approved", "payload": {"by": "ada"}},
    }
    call, approval = env.history(run)
    assert isinstance(call, CallEvent) and call.request == '{"order":42}'
    assert isinstance(approval, AwaitSignalsEvent)
    assert approval.names == ("approved",) and approval.timeout_ms == HOUR_MS
    assert len(env.caller.calls) == 1, "the second segment replayed the call"
    env.assert_replays(run)


def test_unapproved_order_times_out_after_an_hour_with_null_approval(
    env: WorkflowEnvironment,
) -> None:
    run = env.run("order-approval", {"order": 7})
    started = env.clock.now()
    env.advance(ms=HOUR_MS - 1)
    assert env.status(run) == "ready", "an hour has not passed yet"

    env.advance(ms=1)

    assert env.result(run) == {"reservation": {"order": 7, "slot": "A7"}, "approval": None}
    timeout = env.history(run)[1]
    assert isinstance(timeout, AwaitSignalsEvent) and timeout.status == AbiStatus.TIMEOUT
    assert timeout.ts == started + HOUR_MS
    env.assert_replays(run)


def test_refused_reservation_fails_the_workflow_with_the_services_status(
    env: WorkflowEnvironment,
) -> None:
    run = env.run("order-approval", {"order": 0})

    described = env.describe(run)
    assert (described["status"], described["error_code"]) == ("failed", "permanent")
    assert described["error"] == "no such order"
    env.assert_replays(run)


def test_cancelled_while_waiting_fails_with_cancelled(env: WorkflowEnvironment) -> None:
    run = env.run("order-approval", {"order": 9})

    env.cancel(run)
    env.run_until_idle()

    assert (env.status(run), env.describe(run)["error_code"]) == ("failed", "cancelled")
    env.assert_replays(run)
