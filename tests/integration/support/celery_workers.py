"""Real Celery workers (``celery -A cleat_project worker``) for the Celery tests, on the
shared RabbitMQ or Redis, or on a private Redis the test starts on its own port (a broker
a test may restart: never the shared one)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[3]
RABBITMQ_URL = os.environ.get("CLEAT_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("CLEAT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TASKS_MODULE = "tests.integration.support.celery_tasks"
# Threads of a CeleryWorker by default.
THREADS = 4


def broker_reachable(url: str) -> str | None:
    """None when the broker answers, else why not (the tests fail with it, not skip)."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"the broker {url} does not answer: {exc}"
    return None


def unique_queue() -> str:
    return f"cleat-test-{uuid.uuid4().hex[:10]}"


class CeleryWorker:
    """One ``celery worker`` subprocess in its own session (``kill()`` takes its pool too,
    like a machine that dies), output in ``log_path``."""

    def __init__(
        self,
        log_path: Path,
        name: str,
        queue: str,
        env: Mapping[str, str],
        *,
        concurrency: int = THREADS,
        pool: str = "threads",
    ) -> None:
        self.log_path = log_path
        self.name = name
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "cleat_project",
                "worker",
                "-Q",
                queue,
                "-n",
                f"{name}@%h",
                "-P",
                pool,
                "-c",
                str(concurrency),
                "-I",
                TASKS_MODULE,
                "--without-gossip",
                "--without-mingle",
                "-l",
                "INFO",
            ],
            env=dict(env),
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            with _suppress():
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while "ready." not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"celery worker {self.name} did not start:\n{self.log()}")
            time.sleep(0.2)

    def __enter__(self) -> CeleryWorker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CeleryBeat:
    """``celery -A cleat_project beat`` in its own session, its schedule file and output in
    ``directory``."""

    def __init__(self, directory: Path, env: Mapping[str, str]) -> None:
        self.log_path = directory / "beat.log"
        self._log: IO[bytes] = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "cleat_project",
                "beat",
                "-s",
                str(directory / "beat-schedule"),
                "--pidfile=",
                "-l",
                "INFO",
            ],
            env=dict(env),
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            with _suppress():
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A redis-server of the test's own (its port, its directory, append-only file on so a
    restart keeps the queues), which the test may stop and start again."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while broker_reachable(self.url) is not None:
            if time.monotonic() > deadline:
                raise AssertionError(f"the private redis on {self.port} did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


class PrivateRabbit:
    """A RabbitMQ node of the test's own (its node name, ports, data and log directories,
    no plugins), which the test may stop and start again; its queues and unacknowledged
    messages are kept on disk across the restart. The machine's shared node is untouched.
    Run as root, rabbitmq-server runs as the ``rabbitmq`` user, which owns the directory."""

    def __init__(self) -> None:
        binary = shutil.which("rabbitmq-server")
        if binary is None:
            raise AssertionError(
                "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
            )
        # Not under pytest's tmp_path: the rabbitmq user must be able to reach it.
        self.directory = Path(tempfile.mkdtemp(prefix="cleat-rabbit-"))
        self.port = free_port()
        self.node = f"cleattest{self.port}@localhost"
        (self.directory / "mnesia").mkdir(parents=True, exist_ok=True)
        (self.directory / "log").mkdir(exist_ok=True)
        (self.directory / "plugins").write_text("[].\n")
        (self.directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
        )
        if os.geteuid() == 0:
            for path in [self.directory, *self.directory.rglob("*")]:
                shutil.chown(path, "rabbitmq", "rabbitmq")
        self.env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.directory / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.directory / "log"),
            "RABBITMQ_PID_FILE": str(self.directory / "pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.directory / "plugins"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.directory / "feature_flags"),
            "RABBITMQ_CONFIG_FILE": str(self.directory / "rabbitmq"),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["rabbitmq-server"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 90
        while broker_reachable(self.url) is not None:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(
                    f"the private RabbitMQ node {self.node} did not start (logs in "
                    f"{self.directory / 'log'})"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None:
            return
        subprocess.run(
            ["rabbitmqctl", "-n", self.node, "stop"],
            env=self.env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=10)
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
