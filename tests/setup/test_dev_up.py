"""The README's first command on a fresh clone: ``python3 dev.py up`` leaves a git-ignored
``.env`` that makes the docs' ``manage.py`` commands work, prints a login that works, and
serves the admin with a worker beside it that completes a run.

The clone is a copy of the checkout's files (tracked and new, not ignored) in a temporary
folder, set up with this test's own virtual environment (``CLEAT_VENV``: nothing is
installed when the requirements match) and SQLite in that folder, as on a new machine."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def fresh_clone(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    subprocess.run(["git", "init", "-q"], cwd=target, check=True)
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plain_env(clone: Path) -> dict[str, str]:
    """A new user's shell: no Django settings module, database or secrets exported."""
    kept = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in kept}
    env["CLEAT_VENV"] = sys.prefix
    env["CLEAT_MODULE_CACHE_DIR"] = str(clone / "cache" / "modules")
    env["CLEAT_COMPONENT_CACHE"] = str(clone / "cache" / "components")
    return env


class DevUp:
    def __init__(self, clone: Path, port: int) -> None:
        self.clone, self.port = clone, port
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "dev.py", "up", "--port", str(port)],
            cwd=clone,
            env=plain_env(clone),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: the server, its reloader, the worker
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))
        except (OSError, ValueError):  # closed by stop()
            pass

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, limit_s: float = 300) -> re.Match[str]:
        deadline = time.monotonic() + limit_s
        while True:
            found = re.search(pattern, self.output())
            if found:
                return found
            assert self.process.poll() is None, f"dev.py up ended:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.output()}"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):  # anything of the group still alive
            os.killpg(self.process.pid, signal.SIGKILL)
        # The pipe is closed here, not by the collector in some later test (a ResourceWarning
        # there fails that test).
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def dev_up(tmp_path: Path) -> Iterator[DevUp]:
    running = DevUp(fresh_clone(tmp_path), free_port())
    try:
        yield running
    finally:
        running.stop()


def manage(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.prefix) / "bin" / "python"), "manage.py", *args],
        cwd=clone,
        env=plain_env(clone),
        capture_output=True,
        text=True,
        timeout=120,
    )


def log_in(base: str, user: str, password: str) -> urllib.request.OpenerDirector:
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            form = opener.open(f"{base}/admin/login/", timeout=10).read().decode()
            break
        except OSError:
            assert time.monotonic() < deadline, "the admin is not served"
            time.sleep(0.3)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
    assert token is not None, form[:500]
    body = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": token.group(1),
            "username": user,
            "password": password,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/", body, headers={"Referer": f"{base}/admin/login/"}
    )
    page = opener.open(request, timeout=30)
    assert page.geturl().rstrip("/").endswith("/admin"), f"login refused: {page.geturl()}"
    return opener


def start_from_the_admin(
    opener: urllib.request.OpenerDirector, admin: str, name: str, input_json: str
) -> str:
    """ "Start a run" on the definition's page; returns the run id its page redirects to."""
    listing = opener.open(f"{admin}workflows/workflowdefinition/", timeout=30).read().decode()
    link = re.search(r'href="(/admin/workflows/workflowdefinition/\d+/change/)">' + name, listing)
    assert link is not None, listing[:2000]
    page_url = urllib.parse.urljoin(admin, link.group(1))
    page = opener.open(page_url, timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token is not None and 'id="start-run-form"' in page
    body = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token.group(1), "op": "start", "input": input_json}
    ).encode()
    answer = opener.open(
        urllib.request.Request(page_url, body, headers={"Referer": page_url}), timeout=30
    )
    found = re.search(r"/workflowinstance/([0-9a-f-]{36})/change/", answer.geturl())
    assert found is not None, answer.geturl()
    return found.group(1)


def show(clone: Path, run_id: str) -> dict[str, Any]:
    shown = manage(clone, "show_workflow", run_id)
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert isinstance(summary, dict)
    return summary


def test_dev_up_on_a_fresh_clone_gives_a_login_a_worker_and_working_commands(
    dev_up: DevUp,
) -> None:
    clone = dev_up.clone
    found = dev_up.wait_for(r"log in at (\S+) as (\w+), password (\S+)")
    url, user, password = found.groups()
    assert url == f"http://127.0.0.1:{dev_up.port}/admin/"
    assert "starting a worker" in dev_up.output()

    # Point 2: a git-ignored .env with what the docs' commands need.
    dotenv = (clone / ".env").read_text()
    assert "SECRET_KEY=" in dotenv and f"CLEAT_ADMIN_PASSWORD={password}" in dotenv
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=clone)
    assert ignored.returncode == 0, ".env is not git-ignored"

    # Point 1: the printed login works.
    opener = log_in(f"http://127.0.0.1:{dev_up.port}", user, password)

    # A run started from the admin (the definition's page), the docs' commands with nothing
    # exported, and the worker beside the admin running the demo order to its end (it waits
    # for "paid", then sleeps 2 s).
    run_id = start_from_the_admin(opener, url, "demo-order", '{"customer": "bo"}')
    # At once: the demo waits 30 s for "paid" (a signal sent earlier waits for it).
    signalled = manage(clone, "signal_workflow", run_id, "paid", '{"amount": 3}')
    assert signalled.returncode == 0, signalled.stderr
    started = manage(clone, "start_workflow", "demo-order", '{"customer": "cy"}')
    assert started.returncode == 0, started.stderr
    assert "Traceback" not in started.stderr
    deadline = time.monotonic() + 120
    while (summary := show(clone, run_id))["status"] != "done":
        assert summary["status"] in ("ready", "running"), summary
        assert time.monotonic() < deadline, f"the worker did not finish {run_id}: {summary}"
        time.sleep(0.3)
    assert summary["result"]["charged"] == 12  # the demo charges 12

    # The admin shows it done.
    page = opener.open(f"{url}workflows/workflowinstance/{run_id}/change/", timeout=30)
    assert 'data-status="done"' in page.read().decode()
