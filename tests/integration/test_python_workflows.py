"""Python workflows end to end through the Django store: build_workflow and deploy_workflow,
the definition's kind, the claim, fenced finalize and wake-ups, children and schedules in
the database, and replay-safe time across segments. The components come from the build and
compile caches (``cleat_workflow.testing``)."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from engine.errors import PermanentError
from tests.fixtures import FakeService
from workflows.models import CompiledArtifact, RunStatus, WorkflowDefinition
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

ROOT = Path(__file__).resolve().parents[2]
SDK_PYTHON = ROOT / "sdk" / "python"
if str(SDK_PYTHON) not in sys.path:
    sys.path.insert(0, str(SDK_PYTHON))
EXAMPLES = ROOT / "examples"
SCENARIOS = ROOT / "tests" / "unit" / "sdk" / "apps" / "scenarios.py"

pytestmark = pytest.mark.django_db(transaction=True)


def built(app: Path) -> bytes:
    from cleat_workflow.testing import build

    return build(app)


@pytest.fixture
def make_env(tenant: Any) -> Iterator[Any]:
    made: list[DatabaseWorkflowEnvironment] = []

    def make(services: dict[str, Any] | None = None) -> DatabaseWorkflowEnvironment:
        env = DatabaseWorkflowEnvironment(tenant, services)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def test_build_and_deploy_commands_store_a_component(tenant: Any, tmp_path: Path) -> None:
    """build_workflow writes the component (from the build cache); deploy_workflow accepts
    it and the definition records kind "component" and the workflows it offers."""
    output = tmp_path / "order_saga.wasm"
    out = io.StringIO()
    call_command("build_workflow", str(EXAMPLES / "order_saga.py"), "-o", str(output), stdout=out)
    assert output.read_bytes()[:8] == b"\x00asm\x0d\x00\x01\x00"
    assert str(output) in out.getvalue()

    out, err = io.StringIO(), io.StringIO()
    call_command("deploy_workflow", "order_saga", str(output), stdout=out, stderr=err)
    assert out.getvalue().strip() == "1"
    # It says it compiles, and the compiled artifact is in the database for every worker.
    assert "compiling the component" in err.getvalue()
    assert "every worker loads it from the database" in err.getvalue()
    with tenant_context(tenant.id):
        definition = WorkflowDefinition.objects.get(tenant=tenant, name="order_saga")
    assert definition.kind == "component"
    assert definition.entry_points == ["order_saga", "run"]
    shared = CompiledArtifact.objects.filter(name__startswith=definition.sha256)
    assert {name.rsplit(".", 1)[-1] for name in shared.values_list("name", flat=True)} == {
        "cwasm",
        "json",
    }


def test_build_errors_are_command_errors_in_the_apps_terms(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("from cleat_workflow import workflow\n\nraise ValueError('no config')\n")
    with pytest.raises(CommandError) as failed:
        call_command("build_workflow", str(app), "-o", str(tmp_path / "app.wasm"))
    assert str(failed.value).splitlines()[0] == f"{app}:3: ValueError: no config"


def test_the_order_saga_through_the_store(make_env: Any) -> None:
    inventory = FakeService({"reserve": {"id": "res-1"}, "release": {"ok": True}})
    payments = FakeService({"charge": {"id": "ch-1"}, "refund": {"ok": True}})
    env = make_env({"inventory": inventory, "payments": payments})
    env.deploy("order_saga", built(EXAMPLES / "order_saga.py"))
    order = {"order_id": "B-2", "sku": "pen", "qty": 2, "amount_cents": 300}
    run = env.run("order_saga", order)
    info = env.describe(run)
    assert info["status"] == RunStatus.READY
    assert "shipped" in info["waiting_on"]
    env.signal(run, "shipped", {"carrier": "dhl"})
    env.run_until_idle()
    result = env.result(run)
    assert (result["status"], result["carrier"]) == ("shipped", "dhl")
    assert inventory.ops() == ["reserve"] and payments.ops() == ["charge"]
    types = [e.TYPE.value for e in env.history(run)]
    assert types.count("call") == 2 and "await_signals" in types
    assert len({c.idempotency_key for c in inventory.calls + payments.calls}) == 2


def test_a_declined_saga_compensates_through_the_store(make_env: Any) -> None:
    inventory = FakeService({"reserve": {"id": "res-9"}, "release": {"ok": True}})
    payments = FakeService({"charge": PermanentError("declined: insufficient funds")})
    env = make_env({"inventory": inventory, "payments": payments})
    env.deploy("order_saga", built(EXAMPLES / "order_saga.py"))
    run = env.run("order_saga", {"order_id": "C-3", "sku": "x", "qty": 1, "amount_cents": 1})
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == (RunStatus.FAILED, "permanent")
    assert "payment failed" in info["error"]
    assert inventory.ops() == ["reserve", "release"]


def test_fan_out_children_run_through_the_store(make_env: Any) -> None:
    images = FakeService({"resize": lambda r: {"size": len(r["item"])}})
    env = make_env({"images": images})
    wasm = built(EXAMPLES / "fan_out.py")
    env.deploy("fan_out", wasm)
    env.deploy("process_item", wasm)
    run = env.run("fan_out", {"batch": "db", "items": ["a", "bb", "ccc"]})
    assert env.result(run) == {"batch": "db", "processed": 3, "total_size": 6, "failed": []}
    assert sorted(c.request["item"] for c in images.calls) == ["a", "bb", "ccc"]


def test_the_daily_report_schedule_is_a_database_schedule(make_env: Any, tenant: Any) -> None:
    from schedules.models import Schedule

    env = make_env({"metrics": FakeService({"daily_totals": {}}), "mail": FakeService({})})
    wasm = built(EXAMPLES / "daily_report.py")
    env.deploy("schedule_daily_report", wasm)
    env.deploy("daily_report", wasm)
    run = env.run("schedule_daily_report", {"timezone": "UTC", "recipients": ["a@b.c"]})
    schedule_id = env.result(run)["schedule_id"]
    with tenant_context(tenant.id):
        schedule = Schedule.objects.get(id=schedule_id)
    assert (schedule.workflow_name, schedule.cron, schedule.timezone) == (
        "daily_report",
        "0 7 * * *",
        "UTC",
    )
    assert json.loads(schedule.input) == {"recipients": ["a@b.c"]}


def test_time_and_randomness_replay_across_segments_in_the_store(make_env: Any) -> None:
    """The clock scenario suspends on a 30 s timer between its samples; the second segment
    replays the first samples from the stored history and must see the same values, or the
    recorded result would not match what the first segment's code computed."""
    env = make_env({"shop": FakeService({"price": {"cents": 1}})})
    env.deploy("clock", built(SCENARIOS))
    run = env.run("clock", {"sleep": 30})
    assert env.describe(run)["waiting_on"].startswith("timer until")
    env.advance(seconds=30)
    result = env.result(run)
    first, _, third = result["samples"]
    created = datetime.fromisoformat(env.describe(run)["created_at"])
    # time.time() is the run's virtual start (millisecond resolution), not the wall clock of
    # the segment (which ran well after it): equal to within one millisecond of float rounding.
    assert first["time"] == pytest.approx(created.timestamp(), abs=1.5e-3)
    assert third["time"] - first["time"] >= 30
    assert len({s["uuid4"] for s in result["samples"]}) == 3


def _ready_taken() -> dict[str, float]:
    from prometheus_client import REGISTRY

    import workflows.worker  # noqa: F401  (registers the collector)

    found = {}
    for family in REGISTRY.collect():
        if family.name == "cleat_component_instances_taken":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[sample.labels["made"]] = sample.value
    return found


def test_the_workers_metrics_count_segments_on_instances_made_ahead(make_env: Any) -> None:
    """cleat_component_instances_taken_total{made="ahead"|"inline"} counts every Python
    segment of the process (CLEAT_READY_INSTANCES, engine/ready_instances.py)."""
    from prometheus_client import REGISTRY

    env = make_env({"shop": FakeService({"price": {"cents": 5}})})
    env.deploy("clock", built(SCENARIOS))
    before = _ready_taken()
    run = env.run("clock", {"sleep": 1})
    env.advance(seconds=1)
    assert env.describe(run)["status"] == RunStatus.DONE
    after = _ready_taken()
    segments = sum(after.values()) - sum(before.values())
    assert segments >= 2  # the run's two segments, at least
    assert set(after) == {"ahead", "inline"}
    names = {family.name for family in REGISTRY.collect()}
    assert {
        "cleat_component_instances_made_ahead",
        "cleat_component_instances_dropped",
        "cleat_component_instances_failed",
        "cleat_component_instances_warmed",  # warm pages are on by default
    } <= names


def test_warm_pages_are_on_unless_the_setting_turns_them_off(settings: Any) -> None:
    """CLEAT_WARM_PAGES (default on) reaches the engine's configuration."""
    from workflows.conf import cleat_settings

    cleat_settings.cache_clear()
    try:
        assert cleat_settings().engine.warm_pages is True
        settings.CLEAT_WARM_PAGES = False
        cleat_settings.cache_clear()
        assert cleat_settings().engine.warm_pages is False
    finally:
        cleat_settings.cache_clear()


def test_a_negative_number_of_ready_instances_stops_start_up_with_the_reason(
    settings: Any,
) -> None:
    """CLEAT_READY_INSTANCES below 0 is refused when the settings are read (0 turns it off)."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.conf import cleat_settings

    settings.CLEAT_READY_INSTANCES = -1
    cleat_settings.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="ready_instances must be 0 \\(off\\)"):
            cleat_settings()
        settings.CLEAT_READY_INSTANCES = 0
        cleat_settings.cache_clear()
        assert cleat_settings().engine.ready_instances == 0
    finally:
        cleat_settings.cache_clear()
