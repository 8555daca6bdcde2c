"""Run ``manage.py`` commands (above all ``runworker``) as real subprocesses against the
database the test is using, and read what they logged.

The subprocess gets the production settings module with ``DATABASE_URL`` built from the
test connection (on PostgreSQL as the application role, so row-level security applies to
it exactly as in production), ``DEBUG=1`` and whatever else the test passes. Its output goes
to a file, never to a pipe nobody drains.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from django.db import connection

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"

_SEGMENT = re.compile(r"event=segment run=(\S+) outcome=(\S+) status=(\S*) ")


def database_url(user: str | None = None) -> str:
    """A ``DATABASE_URL`` for the database the test runs on (the test database), connecting
    as ``user`` (default: on PostgreSQL the application role, else the test's own user)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(db['NAME']).resolve()}"
    host, port, name = db["HOST"] or "127.0.0.1", db["PORT"], db["NAME"]
    if connection.vendor == "postgresql":
        from workflows.rls import app_role

        return f"postgres://{quote(user or app_role())}@{host}:{port or 5432}/{name}"
    if connection.vendor == "mysql":
        password = db.get("PASSWORD") or ""
        auth = quote(user or db["USER"]) + (f":{quote(password)}" if password else "")
        return f"mysql://{auth}@{host}:{port or 3306}/{name}"
    raise AssertionError(f"no DATABASE_URL for {connection.vendor}")


def command_env(
    services: Mapping[str, str] | None = None, db_user: str | None = None, **extra: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLEAT_TEST_")}
    env.update(
        DJANGO_SETTINGS_MODULE="cleat_project.settings",
        DATABASE_URL=database_url(db_user),
        DEBUG="1",
        CLEAT_SERVICES=json.dumps(dict(services or {})),
        CLEAT_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def manage(
    args: Sequence[str], env: Mapping[str, str], timeout: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """Run one ``manage.py`` command to completion (killed after ``timeout`` seconds)."""
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env=dict(env),
        cwd=MANAGE.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass(frozen=True)
class SegmentLine:
    run_id: str
    outcome: str
    status: str


class WorkerProcess:
    """One ``manage.py runworker`` subprocess, its output in ``log_path``."""

    def __init__(self, log_path: Path, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.log_path = log_path
        self.args = list(args)
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "runworker", *args],
            env=dict(env),
            cwd=MANAGE.parent,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float) -> int:
        """The exit code; kills the process and fails if it outlives ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(
                f"runworker {' '.join(self.args)} still running after {timeout}s:\n{self.log()}"
            ) from None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, like a machine that dies."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        os.kill(self.proc.pid, signal.SIGTERM)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def segments(self) -> list[SegmentLine]:
        return [SegmentLine(*m.groups()) for m in _SEGMENT.finditer(self.log())]

    def wait_for_log(self, needle: str, timeout: float) -> None:
        wait_until(lambda: needle in self.log(), timeout, f"{needle!r} in the worker's log")

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned) or fail after
    ``timeout`` seconds, saying what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
