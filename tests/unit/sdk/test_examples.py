"""The examples in ``examples/``, as their authors would test them: in memory, on virtual
time, built through the cache (``cleat_workflow.testing``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import PermanentError
from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService, assert_replays_quietly, event_types, wait_of

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
DAY_S = 86_400
ORDER = {"order_id": "A-1", "sku": "book", "qty": 1, "amount_cents": 1299}


@pytest.fixture(scope="module")
def order_saga_wasm() -> bytes:
    from cleat_workflow.testing import build

    return build(EXAMPLES / "order_saga.py")


@pytest.fixture(scope="module")
def fan_out_wasm() -> bytes:
    from cleat_workflow.testing import build

    return build(EXAMPLES / "fan_out.py")


@pytest.fixture(scope="module")
def daily_report_wasm() -> bytes:
    from cleat_workflow.testing import build

    return build(EXAMPLES / "daily_report.py")


def environment(services: dict[str, FakeService]) -> WorkflowEnvironment:
    from cleat_workflow.testing import PythonWorkflowEnvironment

    return PythonWorkflowEnvironment(services)


# --- the order saga -------------------------------------------------------------------------


def saga_services(charge: object = None) -> dict[str, FakeService]:
    return {
        "inventory": FakeService({"reserve": {"id": "res-1"}, "release": {"ok": True}}),
        "payments": FakeService(
            {"charge": charge or {"id": "ch-1"}, "refund": {"ok": True}},
        ),
    }


def test_the_saga_ships(order_saga_wasm: bytes) -> None:
    services = saga_services()
    env = environment(services)
    env.deploy("order_saga", order_saga_wasm)
    run = env.run("order_saga", ORDER)
    assert wait_of(env, run)["signals"] == ["shipped"]
    assert env.describe(run)["query_state"] == {"status": '"awaiting_shipment"'}
    env.signal(run, "shipped", {"carrier": "ups"})
    env.advance(seconds=3600)
    result = env.result(run)
    assert (result["status"], result["carrier"], result["charge_id"]) == ("shipped", "ups", "ch-1")
    assert services["inventory"].ops() == ["reserve"]
    assert services["payments"].ops() == ["charge"]
    assert_replays_quietly(env, run, watch=services.values())


def test_a_declined_charge_releases_the_stock(order_saga_wasm: bytes) -> None:
    services = saga_services(charge=PermanentError("card declined"))
    env = environment(services)
    env.deploy("order_saga", order_saga_wasm)
    run = env.run("order_saga", ORDER)
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == ("failed", "permanent")
    assert info["error"] == "order A-1: payment failed: card declined"
    assert services["inventory"].ops() == ["reserve", "release"]
    assert services["inventory"].calls[1].request == {"reservation_id": "res-1"}
    assert_replays_quietly(env, run, watch=services.values())


def test_nothing_shipped_in_three_days_compensates_in_reverse_order(
    order_saga_wasm: bytes,
) -> None:
    services = saga_services()
    env = environment(services)
    env.deploy("order_saga", order_saga_wasm)
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


# --- fan-out / fan-in -----------------------------------------------------------------------


def test_fan_out_gathers_every_child_including_failures(fan_out_wasm: bytes) -> None:
    def resize(request: dict[str, str]) -> dict[str, int]:
        if request["item"] == "broken":
            raise PermanentError("not an image")
        return {"size": len(request["item"])}

    images = FakeService({"resize": resize})
    env = environment({"images": images})
    env.deploy("fan_out", fan_out_wasm)
    env.deploy("process_item", fan_out_wasm)
    run = env.run("fan_out", {"batch": "b-7", "items": ["a", "bb", "broken", "dddd"]})
    assert env.result(run) == {
        "batch": "b-7",
        "processed": 3,
        "total_size": 7,
        "failed": [{"item": "broken", "error": "not an image"}],
    }
    children = [r.run_id for r in env.storage.runs.values() if r.definition == "process_item"]
    assert len(children) == 4
    assert sorted(c.request["item"] for c in images.calls) == ["a", "bb", "broken", "dddd"]
    assert_replays_quietly(env, run, *children, watch=[images])


# --- a daily report on a schedule -----------------------------------------------------------


def test_the_report_is_scheduled_daily_and_reports_on_the_previous_day(
    daily_report_wasm: bytes,
) -> None:
    metrics = FakeService({"daily_totals": {"orders": 12, "refunds": 1}})
    mail = FakeService({"send": {"queued": True}})
    env = environment({"metrics": metrics, "mail": mail})
    env.deploy("schedule_daily_report", daily_report_wasm)
    env.deploy("daily_report", daily_report_wasm)

    setup = env.run(
        "schedule_daily_report", {"timezone": "Europe/Paris", "recipients": ["ops@example.com"]}
    )
    result = env.result(setup)
    [schedule] = env.storage.schedules.values()
    assert schedule["id"] == result["schedule_id"]
    assert (schedule["workflow_name"], schedule["cron"], schedule["timezone"]) == (
        "daily_report",
        "0 7 * * *",
        "Europe/Paris",
    )
    assert json.loads(schedule["input"]) == {"recipients": ["ops@example.com"]}

    env.clock.advance(7 * 3600 * 1000)  # 2026-01-01 07:00 UTC
    report = env.run("daily_report", json.loads(schedule["input"]))
    assert env.result(report)["day"] == "2025-12-31"
    assert metrics.calls[0].request == {"day": "2025-12-31"}
    [sent] = mail.calls
    assert sent.request["subject"] == "Daily report for 2025-12-31"
    assert sent.request["body"] == "orders: 12\nrefunds: 1"
    env.advance(seconds=10 * DAY_S)  # a replay next week: same day
    assert_replays_quietly(env, setup, report, watch=[metrics, mail])
