"""The guest-language order sagas (Rust, C, Zig, AssemblyScript) end to end through the
Django store: ``build_workflow`` recognises the language and reports its stages, and each
saga runs fresh (the first segment suspends on the shipping signal), then replays its stored
history in the next segment without calling a service again, on SQLite, PostgreSQL and
MariaDB. The modules come from the guest build cache (``workflows.guest_build``)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from engine.errors import PermanentError
from tests.fixtures import FakeService
from tests.fixtures.guests import LANGUAGES, built_example, example
from workflows import guest_build
from workflows.models import RunStatus, WorkflowDefinition, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = {"order_id": "B-2", "sku": "pen", "qty": 2, "amount_cents": 300}


@pytest.fixture
def make_env(tenant: Any) -> Iterator[Any]:
    made: list[DatabaseWorkflowEnvironment] = []

    def make(services: dict[str, Any]) -> DatabaseWorkflowEnvironment:
        env = DatabaseWorkflowEnvironment(tenant, services)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


@pytest.mark.parametrize("language", LANGUAGES)
def test_build_and_deploy_commands_store_a_core_module(
    language: str, tenant: Any, tmp_path: Path
) -> None:
    output = tmp_path / "order_saga.wasm"
    out = io.StringIO()
    call_command(
        "build_workflow", str(example(language, "order_saga")), "-o", str(output), stdout=out
    )
    lines = out.getvalue().splitlines()
    assert output.read_bytes()[:8] == b"\x00asm\x01\x00\x00\x00"
    assert lines[-1].startswith(f"{output} (") and "key " in lines[-1]
    # The stages: the language first, then (on a cache miss) each compiler step.
    assert lines[0].strip().startswith(f"{guest_build.LANGUAGE_NAMES[language]}: ")

    out = io.StringIO()
    call_command("deploy_workflow", "order_saga", str(output), stdout=out)
    assert out.getvalue().strip() == "1"
    with tenant_context(tenant.id):
        definition = WorkflowDefinition.objects.get(tenant=tenant, name="order_saga")
    assert definition.kind == "core"
    assert "run" in definition.entry_points

    # docs/guest-sdks.md's start command.
    out = io.StringIO()
    order = '{"order_id": "A-1", "sku": "book", "qty": 1, "amount_cents": 1299}'
    call_command("start_workflow", "order_saga", "--input", order, stdout=out)
    run_id = out.getvalue().strip().splitlines()[-1]
    with tenant_context(tenant.id):
        instance = WorkflowInstance.objects.select_related("definition").get(id=run_id)
    assert (instance.definition.name, json.loads(instance.input)) == (
        "order_saga",
        json.loads(order),
    )


def test_a_broken_c_source_is_a_command_error_with_the_compilers_words(tmp_path: Path) -> None:
    source = tmp_path / "broken.c"
    source.write_text('#include "cleat.h"\nint64_t run(const char *p, size_t n) { return nope; }\n')
    with pytest.raises(CommandError) as failed:
        call_command("build_workflow", str(source), "-o", str(tmp_path / "broken.wasm"))
    message = str(failed.value)
    assert message.startswith(f"{source}: ")
    assert "nope" in message and "broken.c:2" in message


@pytest.mark.parametrize("language", LANGUAGES)
def test_the_saga_ships_through_the_store(language: str, make_env: Any) -> None:
    inventory = FakeService({"reserve": {"id": "res-1"}, "release": {"ok": True}})
    payments = FakeService({"charge": {"id": "ch-1"}, "refund": {"ok": True}})
    env = make_env({"inventory": inventory, "payments": payments})
    env.deploy("order_saga", built_example(language, "order_saga"))
    run = env.run("order_saga", ORDER)
    info = env.describe(run)
    assert info["status"] == RunStatus.READY
    assert "shipped" in info["waiting_on"]
    assert [e.TYPE.value for e in env.history(run)] == ["call", "call"]

    env.signal(run, "shipped", {"carrier": "dhl"})
    env.run_until_idle()
    result = env.result(run)
    assert (result["order_id"], result["status"], result["carrier"]) == ("B-2", "shipped", "dhl")
    assert result["charge_id"] == "ch-1"
    # The second segment replayed both calls from the stored history: no service saw them twice.
    assert inventory.ops() == ["reserve"] and payments.ops() == ["charge"]
    types = [e.TYPE.value for e in env.history(run)]
    assert types == ["call", "call", "await_signals"]
    assert len({c.idempotency_key for c in inventory.calls + payments.calls}) == 2


@pytest.mark.parametrize("language", LANGUAGES)
def test_a_declined_saga_compensates_through_the_store(language: str, make_env: Any) -> None:
    inventory = FakeService({"reserve": {"id": "res-9"}, "release": {"ok": True}})
    payments = FakeService({"charge": PermanentError("declined: insufficient funds")})
    env = make_env({"inventory": inventory, "payments": payments})
    env.deploy("order_saga", built_example(language, "order_saga"))
    run = env.run("order_saga", {"order_id": "C-3", "sku": "x", "qty": 1, "amount_cents": 1})
    info = env.describe(run)
    assert (info["status"], info["error_code"]) == (RunStatus.FAILED, "permanent")
    assert info["error"] == "order C-3: payment failed: declined: insufficient funds"
    assert inventory.ops() == ["reserve", "release"]
    assert inventory.calls[1].request == {"reservation_id": "res-9"}
