"""A throwaway PostgreSQL cluster that a test creates, stops and starts at will.

``initdb`` into a temporary directory, a port of its own, a socket directory of its own:
nothing the machine's shared server (or another test) uses is touched, so the test can stop
this one mid-run -- fast (``-m fast``: connections are closed, as by a restart) or
``immediate`` (a crash: the next start replays the WAL). Run as root, the server runs as the
``postgres`` system user (PostgreSQL refuses root).

Commits are durable across a crash of the server (``synchronous_commit`` stays on: an
``immediate`` stop must not lose what a worker was told had committed); only ``fsync`` is off,
which matters to a machine that loses power, not to a server that is killed.

The binaries come from ``CLEAT_PG_BIN`` (default ``/usr/lib/postgresql/15/bin``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG_BIN = Path(os.environ.get("CLEAT_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayCluster:
    """``password``: the ``postgres`` role's, and connections over TCP must give one
    (scram-sha-256); the socket in ``root`` stays trusted (``psql`` below uses it)."""

    def __init__(self, password: str | None = None) -> None:
        self.password = password
        if not (PG_BIN / "initdb").exists():
            raise AssertionError(
                f"no initdb in {PG_BIN}: install PostgreSQL's server binaries or set CLEAT_PG_BIN"
            )
        self.root = Path(tempfile.mkdtemp(prefix="cleat-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.restarts = 0

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise AssertionError(
                f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stdout}{done.stderr}\n"
                f"{self.server_log()}"
            )
        return done

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-4000:]
        return ""

    def init(self) -> None:
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.root / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as_postgres:
                user = pwd.getpwnam("postgres")
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", *auth, "-E", "UTF8")

    def psql(self, sql: str, database: str = "cleat") -> str:
        """Run ``sql`` as ``postgres`` over the (trusted) socket."""
        done = self._run(
            "psql",
            "-h",
            str(self.root),
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-tAc",
            sql,
        )
        return done.stdout.strip()

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float = 0.0, mode: str = "fast") -> None:
        self.stop(mode)
        time.sleep(down_s)
        self.start()
        self.restarts += 1

    def url(self, user: str = "postgres", database: str = "cleat", password: str = "") -> str:
        if user == "postgres" and not password and self.password is not None:
            password = self.password
        auth = f"{user}:{password}" if password else user
        return f"postgres://{auth}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str = "cleat") -> None:
        self._run("createdb", "-h", str(self.root), "-p", str(self.port), "-U", "postgres", name)

    def destroy(self) -> None:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def throwaway_cluster(password: str | None = None) -> Iterator[ThrowawayCluster]:
    cluster = ThrowawayCluster(password)
    try:
        cluster.init()
        cluster.start()
        cluster.create_database()
        yield cluster
    finally:
        cluster.destroy()
