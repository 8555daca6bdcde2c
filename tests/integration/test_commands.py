"""The companion management commands, end to end and on bad input, on every database.

In process (``call_command``) the commands must raise ``CommandError`` whose message names
the problem; as real processes (``manage.py`` on the production settings, pointed at the
test database with ``DATABASE_URL``) they must exit non-zero with that message and no
traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from tests.fixtures.wat import Wat
from tests.integration.support.processes import WorkerProcess, wait_until
from workflows.models import RunStatus, Signal, Tenant, WorkflowDefinition, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def approval_wat() -> str:
    """Waits up to an hour for ``go``; completes with what the await returned."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 3600000)))
    (call $finish)"""
    )
    return w.source()


def quick_wat() -> str:
    w = Wat()
    w.run(f"(call $note {w.s('quick')}) (call $finish)")
    return w.source()


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """``runworker`` installs SIGTERM/SIGINT handlers in the main thread; give pytest its
    own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    import wasmtime

    made = {
        "approval.wasm": bytes(wasmtime.wat2wasm(approval_wat())),
        "approval.wat": approval_wat().encode(),
        "garbage.wasm": b"\0asm\x01\0\0\0\x05",  # a truncated section: wasmtime's parse error
        "text.wasm": b"hello, not a module",
        "broken.wat": b"(module (func $f (result i32)",
    }
    for name, data in made.items():
        (tmp_path / name).write_bytes(data)
    paths = {name: tmp_path / name for name in made}
    paths["missing.wasm"] = tmp_path / "missing.wasm"
    return paths


def run(*args: str) -> tuple[str, str]:
    """``manage.py ARGS`` in process; returns (stdout, stderr)."""
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def show(run_id: str, *extra: str) -> dict[str, Any]:
    out, _ = run("show_workflow", run_id, *extra)
    summary = json.loads(out)
    assert isinstance(summary, dict)
    return summary


def database_url() -> str:
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    port = settings["PORT"] or {"postgresql": 5432, "mysql": 3306}[connection.vendor]
    user = quote(settings["USER"])
    if settings["PASSWORD"]:
        user += ":" + quote(settings["PASSWORD"])
    return f"{scheme}://{user}@{settings['HOST'] or '127.0.0.1'}:{port}/{settings['NAME']}"


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` as a separate process on the production settings, connected to
    the test database (as the same user as the suite)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DEBUG="1", DATABASE_URL=database_url())
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


# --- end to end ----------------------------------------------------------------------------------


def test_deploy_start_work_signal_work_show(tenant: Tenant, files: dict[str, Path]) -> None:
    """The companion commands in process: deploy (binary and WAT), start with input and an
    idempotency key, run the worker until idle, signal, run it again, and show the run as
    JSON at each stage."""
    out, _ = run("deploy_workflow", "approval", str(files["approval.wasm"]))
    assert out.strip() == "1"
    out, _ = run("deploy_workflow", "approval", str(files["approval.wat"]))
    assert out.strip() == "2"

    args = ("--version", "1", "--input", '{"order": 7}', "--idempotency-key", "order-7")
    out, err = run("start_workflow", "approval", *args)
    run_id = last_line(out)
    assert err == ""
    summary = show(run_id)
    assert {k: summary[k] for k in ("id", "status", "version", "events")} == {
        "id": run_id,
        "status": "ready",
        "version": 1,
        "events": 0,
    }

    out, _ = run("runworker", "--burst", "--concurrency", "1")
    assert last_line(out) == "processed 1 segment(s)"
    summary = show(run_id)
    assert summary["status"] == "ready"
    assert summary["waiting_on"].startswith("signals go")
    assert (summary["result"], summary["error"], summary["error_code"]) == (None, None, None)

    again, err = run("start_workflow", "approval", *args)
    assert last_line(again) == run_id
    assert "idempotency key" in err

    out, _ = run("signal_workflow", run_id, "go", "--payload", '{"ok": true}')
    assert run_id in out
    out, _ = run("runworker", "--burst")
    assert last_line(out) == "processed 1 segment(s)"

    summary = show(run_id)
    assert summary["id"] == run_id
    assert summary["status"] == "done"
    assert summary["result"] == [[0, '{"name":"go","payload":{"ok":true}}']]
    assert (summary["error"], summary["error_code"], summary["waiting_on"]) == (None, None, None)
    with tenant_context(tenant.id):
        assert WorkflowInstance.objects.get(id=run_id).definition_version == 1


def test_input_and_payload_as_arguments_as_the_docs_show(
    tenant: Tenant, files: dict[str, Path]
) -> None:
    """``start_workflow NAME '{json}'`` and ``signal_workflow RUN SIGNAL '{json}'``, as
    docs/python-workflows.md and the examples write them; giving both forms is refused."""
    run("deploy_workflow", "approval", str(files["approval.wasm"]))
    run_id = last_line(run("start_workflow", "approval", '{"sku": "book"}')[0])
    with tenant_context(tenant.id):
        assert json.loads(WorkflowInstance.objects.get(id=run_id).input) == {"sku": "book"}
    with pytest.raises(CommandError, match="not both"):
        run("start_workflow", "approval", "[1]", "--input", "[2]")
    run("runworker", "--burst", "--concurrency", "1")
    out, _ = run("signal_workflow", run_id, "go", '{"carrier": "ups"}')
    assert run_id in out
    with pytest.raises(CommandError, match="not both"):
        run("signal_workflow", run_id, "go", "1", "--payload", "2")
    run("runworker", "--burst", "--concurrency", "1")
    summary = show(run_id)
    assert summary["status"] == "done"
    assert summary["result"] == [[0, '{"name":"go","payload":{"carrier":"ups"}}']]


def test_show_workflow_prints_json_values_not_json_strings(tenant: Tenant) -> None:
    """The result and the query state print as JSON values (no ``"{\"status\": ...}"``)."""
    w = Wat()
    w.run(
        f"""
    (drop (call $set_query_state {w.s("stage")} {w.js("done")}))
    {w.reply(0, json.dumps({"status": "shipped"}))}"""
    )
    import wasmtime

    from workflows.definitions import deploy_definition

    deploy_definition(tenant, "shipper", wasmtime.wat2wasm(w.source()))
    run_id = last_line(run("start_workflow", "shipper")[0])
    run("runworker", "--burst", "--concurrency", "1")
    out, _ = run("show_workflow", run_id)
    summary = json.loads(out)
    assert summary["status"] == "done", summary
    assert summary["result"] == {"status": "shipped"}
    assert summary["query_state"] == {"stage": "done"}
    assert '\\"' not in out and '"{' not in out


def test_the_commands_as_processes(tenant: Tenant, files: dict[str, Path]) -> None:
    """The same journey through ``manage.py`` processes sharing the database."""
    deployed = manage("deploy_workflow", "approval", str(files["approval.wasm"]))
    assert (deployed.returncode, deployed.stdout.strip()) == (0, "1"), deployed.stderr
    started = manage("start_workflow", "approval", "--input", "[1, 2]")
    assert started.returncode == 0, started.stderr
    run_id = last_line(started.stdout)
    worked = manage("runworker", "--burst", "--concurrency", "1")
    assert worked.returncode == 0, worked.stderr
    assert "processed 1 segment(s)" in worked.stdout
    signalled = manage("signal_workflow", run_id, "go", "--payload", '"yes"')
    assert signalled.returncode == 0, signalled.stderr
    worked = manage("runworker", "--burst", "--concurrency", "1")
    assert worked.returncode == 0, worked.stderr
    shown = manage("show_workflow", run_id)
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert (summary["id"], summary["status"], summary["error"]) == (run_id, "done", None)
    assert summary["result"] == [[0, '{"name":"go","payload":"yes"}']]
    for process in (deployed, started, worked, signalled, shown):
        assert "Traceback" not in process.stderr


def test_runworker_threads_follow_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads per CPU the process may use, at most 32; one on SQLite. A worker
    started without --concurrency says how many it took."""
    from workflows.management.commands import runworker

    for cpus, threads in ((1, 8), (2, 16), (3, 24), (4, 32), (8, 32), (64, 32)):
        monkeypatch.setattr(runworker, "usable_cpus", lambda cpus=cpus: cpus)
        assert runworker.default_concurrency("postgresql") == threads
        assert runworker.default_concurrency("mysql") == threads
        assert runworker.default_concurrency("sqlite") == 1
    monkeypatch.undo()
    assert runworker.usable_cpus() == len(os.sched_getaffinity(0))
    worked = manage("runworker", "--burst")
    assert worked.returncode == 0, worked.stderr
    expected = runworker.default_concurrency(connection.vendor)
    assert f"concurrency={expected} " in worked.stderr, worked.stderr
    # The help says the default as it is (it once said 4 per CPU after the default became 8).
    helped = manage("runworker", "--help")
    assert "default 8 per CPU, 4 to 32; 1 on SQLite" in " ".join(helped.stdout.split())


def test_runworker_processes_are_forked_and_share_the_work(tenant: Tenant) -> None:
    """``runworker --processes 2``: the supervisor forks two workers (named after its
    ``--worker-id``), each opens its own connection and claims its share, and the
    supervisor exits 0 when both have."""
    env = DatabaseWorkflowEnvironment(tenant)
    try:
        env.deploy("quick", Wat().run("(call $finish)").wasm())
        runs = [env.start("quick") for _ in range(8)]
    finally:
        env.close()
    worked = manage(
        "runworker", "--processes", "2", "--burst", "--concurrency", "1", "--worker-id", "pair"
    )
    assert worked.returncode == 0, worked.stderr
    assert "event=workers_started processes=2 started_as=fork" in worked.stderr
    for name in ("pair-0", "pair-1"):
        assert f"event=worker_started worker={name} " in worked.stderr, worked.stderr
    processed = [int(n) for n in re.findall(r"processed (\d+) segment", worked.stdout)]
    assert len(processed) == 2 and sum(processed) == len(runs), worked.stdout
    assert "Traceback" not in worked.stderr
    with tenant_context(tenant.id):
        statuses = set(
            WorkflowInstance.objects.filter(id__in=runs).values_list("status", flat=True)
        )
    assert statuses == {RunStatus.DONE}


def _supervisor(log_path: Path) -> WorkerProcess:
    """``runworker --processes 2`` (forked workers of one thread each), its output in
    ``log_path``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(DEBUG="1", DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")
    return WorkerProcess(
        log_path, ["--processes", "2", "--concurrency", "1", "--poll-interval", "0.2"], env
    )


def _wait_for_starts(supervisor: WorkerProcess, count: int, interval: float) -> None:
    """Until ``count`` forked workers logged their start (fails at once if the supervisor
    exits first)."""

    def started() -> bool:
        assert supervisor.proc.poll() is None, supervisor.log()
        return supervisor.log().count("event=worker_started") >= count

    wait_until(started, 60, f"{count} worker(s) started", interval)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    """A process not exited (a zombie its new parent has not reaped yet counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_all(pids: list[int]) -> None:
    """Whatever failed, no worker is left behind to work on the test database."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _stopped_cleanly(supervisor: WorkerProcess) -> None:
    """SIGTERM to the supervisor: it exits 0 once both workers stopped cleanly."""
    forked = _children(supervisor.pid)
    try:
        supervisor.terminate()
        forked += _children(supervisor.pid)
        assert supervisor.wait(timeout=60) == 0, supervisor.log()
    finally:
        supervisor.close()
        _kill_all(forked)
    text = supervisor.log()
    assert text.count("event=worker_stopped") == 2, text
    assert "started_as=fork" in text and "Traceback" not in text
    assert not [pid for pid in forked if _alive(pid)], "a worker outlived it"


def test_runworker_forwards_sigterm_to_its_forked_workers(tmp_path: Path) -> None:
    """SIGTERM to the supervisor the moment its first forked worker says it started (in CI
    that once came before the supervisor's handler: it died of the signal and left both
    workers running on the test database): both stop cleanly, the supervisor exits 0 and
    no worker outlives it."""
    with _supervisor(tmp_path / "supervisor.log") as supervisor:
        _wait_for_starts(supervisor, 1, 0.005)
        _stopped_cleanly(supervisor)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_forked_workers_stop_cleanly_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """SIGKILL to the supervisor (nothing forwarded): each forked worker is sent SIGTERM by
    the kernel (``PR_SET_PDEATHSIG``), stops cleanly and exits, instead of running on."""
    forked: list[int] = []
    with _supervisor(tmp_path / "supervisor.log") as supervisor:
        try:
            _wait_for_starts(supervisor, 2, 0.05)
            forked = _children(supervisor.pid)
            assert len(forked) == 2, forked
            supervisor.kill()
            wait_until(
                lambda: not [pid for pid in forked if _alive(pid)], 30, "both workers exited"
            )
        finally:
            _kill_all(forked)
    text = supervisor.log()
    assert text.count("event=worker_stopped") == 2, text
    assert "Traceback" not in text


class _FakeChild:
    """A worker that ends once it is told to stop (or, never told, after ``GIVE_UP_S``)."""

    GIVE_UP_S = 5.0

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.signals: list[int] = []
        self.give_up_at = time.monotonic() + self.GIVE_UP_S

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)

    def poll(self) -> int | None:
        return 0 if self.signals or time.monotonic() > self.give_up_at else None


@pytest.mark.parametrize("started_as", ["fork", "new_process"])
def test_a_stop_signal_while_the_supervisor_starts_its_workers_reaches_every_one(
    monkeypatch: pytest.MonkeyPatch, started_as: str
) -> None:
    """The supervisor's handler is in place before it starts its first worker; while it
    forks, the stop signals are also blocked (a forked worker inherits the mask, and
    unblocks it once its own worker's handler is in place). A SIGTERM that arrives while
    the first worker starts reaches every worker once they are all started. The starts are
    faked: the signal is sent to this process from inside the first one."""
    from workflows.management.commands import runworker
    from workflows.worker import WorkerOptions

    received: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: received.append(signum))
    made: list[_FakeChild] = []
    masks: list[set[int]] = []

    def start(n: int) -> list[_FakeChild]:
        if not made:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at once unless blocked
            masks.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        started = [_FakeChild(len(made) + i + 1) for i in range(n)]
        made.extend(started)
        return started

    monkeypatch.setattr(runworker.Command, "_fork_workers", lambda self, o, w: start(2))
    monkeypatch.setattr(runworker.Command, "_spawn_worker", lambda self, o, w: start(1)[0])
    monkeypatch.setattr(threading, "active_count", lambda: 1 if started_as == "fork" else 2)
    runworker.Command()._supervise({"processes": 2}, WorkerOptions(worker_id="w"))
    assert received == [], "the signal reached the handler in place before the supervisor's"
    assert [c.signals for c in made] == [[signal.SIGTERM], [signal.SIGTERM]]
    blocked = {signal.SIGTERM, signal.SIGINT} <= masks[0]
    assert blocked == (started_as == "fork"), masks
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, []), "left blocked"


def test_the_supervisor_freezes_what_is_alive_before_it_forks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gc.freeze()`` before the forks: each worker starts without a full collection of its
    own, and the collector never writes to the objects it inherited, so their pages stay
    shared (a forked worker's private memory: 32 MB before, 9 MB after; bench/README.md,
    twentieth pass). The fork itself is faked: this process is the supervisor."""
    import gc

    from workflows import worker
    from workflows.management.commands import runworker
    from workflows.worker import WorkerOptions

    gc.unfreeze()
    monkeypatch.setattr(worker, "_gc_frozen", False)
    forked_with: list[int] = []
    monkeypatch.setattr(os, "fork", lambda: forked_with.append(gc.get_freeze_count()) or 4242)
    children = runworker.Command()._fork_workers({"processes": 2}, WorkerOptions(worker_id="w"))
    assert [child.pid for child in children] == [4242, 4242]
    assert forked_with and all(count > 1000 for count in forked_with), forked_with
    assert worker._gc_frozen  # a forked worker's own call does nothing more


def test_a_stop_signal_another_thread_took_is_forwarded_while_the_supervisor_waits() -> None:
    """The kernel may hand a process's stop signal to any of its threads that does not
    block it (a supervisor with tracing on has an exporter's thread), and CPython runs the
    handler on the main thread only once that thread runs Python again. A supervisor
    blocked in ``waitpid`` until a worker ended never forwarded it: here the signal goes to
    another thread on purpose, and the worker (a real process that runs until it is told to
    stop) must be told within a few of the supervisor's looks at it."""
    from workflows.management.commands import runworker

    child = subprocess.Popen(["sleep", "30"])
    forward = runworker._StopForwarder()
    previous = signal.signal(signal.SIGTERM, forward)
    try:
        forward.started([child])

        def take_it() -> None:
            time.sleep(0.3)  # the supervisor waits by then
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

        other = threading.Thread(target=take_it)
        other.start()
        began = time.monotonic()
        codes = runworker._wait_for([child])
        waited = time.monotonic() - began
        other.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert forward.told == signal.SIGTERM
    assert codes == [-signal.SIGTERM], codes
    assert waited < 0.3 + 10 * runworker.WAIT_POLL_S, f"forwarded after {waited:.1f} s"


def test_create_tenant_and_work_in_it(tenant: Tenant, files: dict[str, Path]) -> None:
    """A tenant created by the command gets its own definitions and runs; the default
    tenant does not see them."""
    out, _ = run("create_tenant", "acme")
    acme = Tenant.objects.get(id=last_line(out))
    assert acme.name == "acme"
    out, _ = run("deploy_workflow", "approval", str(files["approval.wasm"]), "--tenant", "acme")
    assert out.strip() == "1"
    out, _ = run("start_workflow", "approval", "--tenant", str(acme.id))
    run_id = last_line(out)
    assert show(run_id, "--tenant", "acme")["status"] == "ready"
    with pytest.raises(CommandError, match=f"no workflow run {run_id}"):
        run("show_workflow", run_id)
    with pytest.raises(CommandError, match="no workflow definition named 'approval'"):
        run("start_workflow", "approval")
    with tenant_context(tenant.id):
        assert not WorkflowDefinition.objects.filter(tenant_id=tenant.id).exists()


# --- bad input -----------------------------------------------------------------------------------


@pytest.fixture
def world(tenant: Tenant, other_tenant: Tenant, files: dict[str, Path]) -> dict[str, str]:
    """``approval`` v1 deployed; a finished run; a run of the other tenant."""
    env = DatabaseWorkflowEnvironment(tenant)
    other = DatabaseWorkflowEnvironment(other_tenant)
    try:
        env.deploy("approval", files["approval.wasm"].read_bytes())
        env.deploy("quick", Wat().run("(call $finish)").wasm())
        done = env.run("quick")
        assert env.status(done) == RunStatus.DONE
        other.deploy("approval", files["approval.wasm"].read_bytes())
        theirs = other.start("approval")
    finally:
        env.close()
        other.close()
    names = {name.replace(".", "_"): str(path) for name, path in files.items()}
    return {**names, "done": done, "theirs": theirs, "unknown": str(uuid.uuid4())}


BAD_INPUT: dict[str, tuple[tuple[str, ...], str]] = {
    "unknown definition": (("start_workflow", "nope"), "no workflow definition named 'nope'"),
    "unknown version": (
        ("start_workflow", "approval", "--version", "9"),
        "approval has no version 9",
    ),
    "input not JSON": (
        ("start_workflow", "approval", "--input", "[1, 2"),
        "--input is not valid JSON",
    ),
    "input nested too deeply": (
        ("start_workflow", "approval", "--input", "[" * 5000 + "]" * 5000),
        "--input is nested too deeply to be read",
    ),
    "input with a lone surrogate": (
        ("start_workflow", "approval", "--input", '["\\ud800"]'),
        "--input contains a lone UTF-16 surrogate",
    ),
    "unknown tenant (start)": (
        ("start_workflow", "approval", "--tenant", "ghost"),
        "unknown tenant 'ghost'",
    ),
    "unknown tenant (deploy)": (
        ("deploy_workflow", "approval", "{approval_wasm}", "--tenant", "ghost"),
        "unknown tenant 'ghost'",
    ),
    "unknown tenant (signal)": (
        ("signal_workflow", "{done}", "go", "--tenant", "ghost"),
        "unknown tenant 'ghost'",
    ),
    "unknown tenant (show)": (("show_workflow", "{done}", "--tenant", "ghost"), "ghost"),
    "invalid wasm": (
        ("deploy_workflow", "approval", "{garbage_wasm}"),
        "failed to parse WebAssembly module",
    ),
    "not wasm at all": (
        ("deploy_workflow", "approval", "{text_wasm}"),
        "not a WebAssembly binary",
    ),
    "invalid wat": (("deploy_workflow", "approval", "{broken_wat}"), "is not valid WAT"),
    "missing file": (
        ("deploy_workflow", "approval", "{missing_wasm}"),
        "cannot read {missing_wasm}: No such file or directory",
    ),
    "duplicate version": (
        ("deploy_workflow", "approval", "{approval_wasm}", "--version", "1"),
        "approval version 1 is already deployed (version)",
    ),
    "bad definition name": (
        ("deploy_workflow", "no spaces allowed", "{approval_wasm}"),
        "name 'no spaces allowed' is not a valid name",
    ),
    "signal a finished run": (
        ("signal_workflow", "{done}", "go"),
        "run {done} is done; it cannot receive signals",
    ),
    "signal payload not JSON": (
        ("signal_workflow", "{done}", "go", "--payload", "yes"),
        "--payload is not valid JSON",
    ),
    "signal payload with a lone surrogate": (
        ("signal_workflow", "{done}", "go", "--payload", '"\\udc00"'),
        "--payload contains a lone UTF-16 surrogate",
    ),
    "signal an unknown run": (("signal_workflow", "{unknown}", "go"), "no workflow run {unknown}"),
    "signal another tenant's run": (
        ("signal_workflow", "{theirs}", "go"),
        "no workflow run {theirs}",
    ),
    "show an unknown run": (("show_workflow", "{unknown}"), "no workflow run {unknown}"),
    "show an invalid run id": (("show_workflow", "not-a-uuid"), "no workflow run 'not-a-uuid'"),
    "show another tenant's run": (("show_workflow", "{theirs}"), "no workflow run {theirs}"),
    "duplicate tenant": (("create_tenant", "other"), "Tenant with this Name already exists"),
    "bad tenant name": (("create_tenant", "no spaces"), "name:"),
    "worker without queues": (("runworker", "--burst", "--queues", ","), "--queues needs"),
    "worker without threads": (
        ("runworker", "--burst", "--concurrency", "0"),
        "--concurrency must be at least 1",
    ),
    "worker claiming a negative number ahead": (
        ("runworker", "--burst", "--claim-ahead", "-1"),
        "--claim-ahead must be 0 or more",
    ),
    "worker claiming ahead by a word": (
        ("runworker", "--burst", "--claim-ahead", "lots"),
        "--claim-ahead must be 0 or more, or auto (got 'lots')",
    ),
}


def test_bad_input_is_a_command_error_naming_the_problem(
    tenant: Tenant, world: dict[str, str], subtests: pytest.Subtests
) -> None:
    """Each case raises CommandError naming the problem; afterwards nothing was stored: no
    version deployed, no run started, no signal delivered."""
    for case, (args, expected) in BAD_INPUT.items():
        with subtests.test(case):
            with pytest.raises(CommandError) as caught:
                run(*(a.format(**world) for a in args))
            assert expected.format(**world) in str(caught.value)
    with tenant_context(tenant.id):
        versions = WorkflowDefinition.objects.filter(tenant_id=tenant.id).values_list(
            "name", "version"
        )
        assert sorted(versions) == [("approval", 1), ("quick", 1)]
        runs = WorkflowInstance.objects.filter(tenant_id=tenant.id).values_list("id", flat=True)
        assert list(runs) == [uuid.UUID(world["done"])]
        assert not Signal.objects.exists()
    assert sorted(Tenant.objects.values_list("name", flat=True)) == ["default", "other"]


SUBPROCESS_CASES = (
    "input not JSON",
    "input nested too deeply",
    "unknown tenant (start)",
    "invalid wasm",
    "signal a finished run",
    "show an invalid run id",
)


def test_bad_input_exits_non_zero_without_a_traceback(world: dict[str, str]) -> None:
    for case in SUBPROCESS_CASES:
        args, expected = BAD_INPUT[case]
        done = manage(*(a.format(**world) for a in args))
        assert done.returncode != 0, case
        assert expected.format(**world) in done.stderr, (case, done.stderr)
        assert "Traceback" not in done.stderr, (case, done.stderr)
        assert done.stderr.startswith("CommandError: "), (case, done.stderr)


def test_a_fetch_allow_list_entry_that_cannot_be_interpreted_fails_the_checks() -> None:
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    from workflows.apps import check_fetch_allow_list

    with override_settings(CLEAT_FETCH_ALLOW=["https://api.example.com/", "ftp://files/"]):
        [error] = check_fetch_allow_list()
        assert error.id == "workflows.E001" and "ftp://files/" in error.msg
        with pytest.raises(SystemCheckError, match="only http"):
            call_command("check")
    with override_settings(CLEAT_FETCH_ALLOW=["https://api.example.com/v1"]):
        assert check_fetch_allow_list() == []


def test_deploy_reads_no_more_than_the_module_size_limit(tenant: Tenant, tmp_path: Path) -> None:
    """A file over the limit is refused after reading one byte more than the limit, however
    large it is (a device never ends); as a process, with the limit from the environment."""
    big = tmp_path / "big.wasm"
    big.write_bytes(b"\0asm" + b"\0" * 2048)
    with override_settings(CLEAT_API_MAX_MODULE_BYTES=1024):
        for path in (str(big), "/dev/zero"):
            with pytest.raises(CommandError, match=f"{path} is larger than 1024 bytes"):
                run("deploy_workflow", "approval", path)
    os.environ["CLEAT_API_MAX_MODULE_BYTES"] = "1024"
    try:
        done = manage("deploy_workflow", "approval", "/dev/zero")
    finally:
        del os.environ["CLEAT_API_MAX_MODULE_BYTES"]
    assert done.returncode != 0
    assert done.stderr.startswith("CommandError: /dev/zero is larger than 1024 bytes"), done.stderr
