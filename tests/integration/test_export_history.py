"""Exporting a run's history from the database (``manage.py export_history``, ``GET
/api/v1/workflows/{id}/history``) and replaying it with ``engine.testing.replay``: the export
carries what replay needs (ids, input, start time, events with their checksums, outcome), the
command and the API give the same document, and bad input is a clear error."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from engine.errors import NondeterminismError
from engine.outcomes import Completed
from engine.testing import replay
from tests.fixtures.wat import Wat
from tests.integration.test_api_support import Api, key_for
from workflows.models import Role, Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def approval(signal: str = "go") -> Wat:
    w = Wat()
    w.run(
        f"(call $rec (call $durable_await_signals {w.js([signal])} (i64.const 3600000))) "
        "(call $finish)"
    )
    return w


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_an_exported_run_replays_and_the_api_gives_the_same_document(
    tenant: Tenant, tmp_path: Path
) -> None:
    module = tmp_path / "approval.wasm"
    module.write_bytes(approval().wasm())
    run("deploy_workflow", "approval", str(module))
    run_id = run("start_workflow", "approval", "--input", '{"order": 7}').strip().splitlines()[-1]
    run("runworker", "--burst", "--concurrency", "1")
    run("signal_workflow", run_id, "go", "--payload", '"yes"')
    run("runworker", "--burst", "--concurrency", "1")

    exported = tmp_path / "run.json"
    out = run("export_history", run_id, "-o", str(exported))
    assert out.strip() == f"1 events of run {run_id} -> {exported}"
    document = json.loads(exported.read_text(encoding="utf-8"))
    assert document["format"] == "cleat-history/1"
    assert (document["run_id"], document["definition"], document["version"]) == (
        run_id,
        "approval",
        1,
    )
    assert (document["input"], document["status"]) == ('{"order": 7}', "done")
    assert [row["type"] for row in document["history"]] == ["await_signals"]

    result = replay(exported, approval().wasm())
    assert result.outcome == Completed(document["result"])
    with pytest.raises(NondeterminismError) as diverged:
        replay(document, approval("stop").wasm())
    assert diverged.value.step == 0

    assert json.loads(run("export_history", run_id)) == document
    response = Api(key_for(tenant)).get(f"/api/v1/workflows/{run_id}/history")
    assert response.status_code == 200
    assert response.json() == document


def test_exporting_an_unknown_run_is_a_clear_error(tenant: Tenant) -> None:
    with pytest.raises(CommandError, match="no workflow run 'nope' \\(run_id\\)"):
        run("export_history", "nope")
    response = Api(key_for(tenant, Role.ADMIN)).get(
        "/api/v1/workflows/00000000-0000-0000-0000-00000000abcd/history"
    )
    assert response.status_code == 404
