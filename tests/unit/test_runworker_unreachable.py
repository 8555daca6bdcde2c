"""``runworker`` started while its database is down exits non-zero with the reason, not a
traceback (found by the fault-injection soak: a worker restarted during a database restart)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def test_a_worker_that_cannot_reach_its_database_says_so() -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEAT_TEST_")}
    env.update(
        DJANGO_SETTINGS_MODULE="cleat_project.settings",
        DATABASE_URL=f"postgres://nobody@127.0.0.1:{port}/cleat",
        DEBUG="1",
    )
    done = subprocess.run(
        [sys.executable, str(MANAGE), "runworker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot reach the database: connection failed" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
