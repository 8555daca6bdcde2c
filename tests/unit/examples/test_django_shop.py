"""docs/embedding.md and docs/changing-workflows.md, executed in examples/django_shop (an
existing Django project that added cleat), each block in one bash process.

embedding.md: migrate, build and deploy the checkout workflow, run the worker, then the
project's own test suite (``manage.py test shop``), in which a view starts a checkout run,
the worker carries it and a signal from another view completes it.

changing-workflows.md: a run recorded on the local database, exported with
``manage.py export_history`` and replayed against the current code by the project's replay
test (``shop.tests.test_replays``, ``cleat_workflow.testing.replay``).

The example uses its own settings and SQLite files (in the test's temporary directory), not
the suite's database, so it runs once, here, rather than in every database pass; the
workflow comes from the build cache (``cleat_workflow.build``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "embedding.md"
CHANGING = ROOT / "docs" / "changing-workflows.md"


def run_block(doc: Path, label: str, tmp_path: Path, **extra: str) -> tuple[str, str, str]:
    """Run ``doc``'s one ```` ```sh LABEL ```` block from the checkout's root, on the
    example's SQLite files in ``tmp_path``; returns (stdout, stderr, a failure report)."""
    blocks = re.findall(
        rf"^```sh {label}\n(.*?)^```$", doc.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL
    )
    assert len(blocks) == 1, f"{doc.name} lost its {label} block"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        SHOP_DB=str(tmp_path / "shop.sqlite3"),
        SHOP_TEST_DB=str(tmp_path / "test-shop.sqlite3"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        **extra,
    )
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + blocks[0]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    return done.stdout, done.stderr, report


def test_the_documented_embedding_runs_and_the_shop_checkout_completes(tmp_path: Path) -> None:
    stdout, stderr, report = run_block(DOC, "embedding", tmp_path)
    assert "Traceback" not in stderr, report
    assert stdout.count("Applying workflows.") >= 5, report
    assert re.search(r"^1$", stdout, re.MULTILINE), report  # the deployed version
    assert "Ran 5 tests" in stderr, report  # the checkout's four and the replay test
    assert re.search(r"^OK$", stderr, re.MULTILINE), report


def test_the_documented_replay_loop_exports_a_run_and_replays_it(tmp_path: Path) -> None:
    histories = tmp_path / "histories"
    histories.mkdir()
    stdout, stderr, report = run_block(
        CHANGING, "changing", tmp_path, SHOP_HISTORIES=str(histories)
    )
    exported = list(histories.glob("checkout-*.json"))
    assert len(exported) == 1, report
    document = json.loads(exported[0].read_text(encoding="utf-8"))
    assert document["format"] == "cleat-history/1", report
    assert (document["definition"], document["status"]) == ("checkout", "done"), report
    assert [row["type"] for row in document["history"]] == ["call", "call", "await_signals"]
    assert f"3 events of run {document['run_id']}" in stdout, report
    assert "Ran 1 test" in stderr and re.search(r"^OK$", stderr, re.MULTILINE), report
