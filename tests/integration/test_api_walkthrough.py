"""The client walkthrough of docs/api.md, executed: every ```` ```sh walkthrough ```` block,
in order, in one bash process (curl and jq), against a live server (pytest-django's
``live_server``, in this process, on the test database) and a real ``manage.py runworker``
process -- deploy, start, wait, signal, wait for done, read the result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache

from tests.integration.support.processes import WorkerProcess, command_env
from tests.integration.test_api_support import key_for
from workflows.models import Role, Tenant

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```sh walkthrough\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def walkthrough_blocks() -> list[str]:
    blocks = BLOCK.findall(DOC.read_text())
    assert len(blocks) >= 5, "docs/api.md lost its walkthrough blocks"
    return blocks


def test_the_documented_walkthrough_runs(
    live_server: object, tenant: Tenant, tmp_path: Path
) -> None:
    cache.clear()
    key = key_for(tenant, Role.ADMIN, "walkthrough")
    script = "set -euo pipefail\n" + "\n".join(
        f"echo '--- block {n}'\n{block}" for n, block in enumerate(walkthrough_blocks(), 1)
    )
    env = {
        **os.environ,
        "CLEAT_URL": str(live_server.url),  # type: ignore[attr-defined]
        "CLEAT_KEY": key,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }
    worker = WorkerProcess(
        tmp_path / "worker.log",
        ["--worker-id", "walkthrough", "--poll-interval", "0.2", "--concurrency", "1"],
        command_env({"demo": "workflows.demo"}),
    )
    try:
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        worker.close()
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}\nworker:\n{worker.log()}"
    assert done.returncode == 0, report
    out = done.stdout
    assert '"name": "demo-order"' in out, report
    assert re.search(r"^run [0-9a-f-]{36}$", out, re.MULTILINE), report
    assert '{"name":"paid","payload":{"amount":12}}' in out, report
    assert re.search(r'\{"status":"done","result":\{"charged":12,"receipt":"[^"]+"\}\}', out), (
        report
    )
    assert "call(demo, reserve" in out and "await_signals" in out, report
    assert re.search(r'^\["2\d{3}-\d\d-\d\dT09:00:00\+0[01]:00",', out, re.MULTILINE), report
    assert '{"name":"morning-orders","enabled":false}' in out, report
    assert '"code":"conflict"' in out and "cannot receive signals" in out, report
