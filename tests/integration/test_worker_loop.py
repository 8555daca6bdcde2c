"""The dispatch worker's loop survives what it meets: workflows that trap or fail, a
definition whose stored bytes are garbage, a database error in the loop itself; it stops
gracefully (a running segment finishes first); ``runworker --burst`` exits 0 when nothing
is due; ``--require-rls`` refuses a connection that bypasses row-level security.

The in-process tests run :class:`workflows.worker.Worker` on every database the suite is
pointed at; the command tests run ``manage.py runworker`` as a subprocess against the same
test database.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.utils import timezone
from prometheus_client import REGISTRY

from engine.errors import ErrorCode
from engine.services import Services
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from tests.integration.support.processes import command_env, manage
from workflows import definitions, services, worker
from workflows.executor import set_services
from workflows.models import RunStatus, Tenant, WorkflowDefinition, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.worker import Worker, WorkerOptions

pytestmark = pytest.mark.django_db(transaction=True)


def call_once() -> bytes:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("svc")} {w.s("echo")} {w.input()}))
    (call $finish)"""
    )
    return w.wasm()


def traps() -> bytes:
    w = Wat()
    w.run("unreachable")
    return w.wasm()


def fails_permanently() -> bytes:
    w = Wat()
    w.run(w.reply(2, "the order was refused"))
    return w.wasm()


@pytest.fixture
def echo() -> Iterator[FakeService]:
    service = FakeService({"echo": lambda request: {"echo": request}})
    set_services(Services.from_settings({"svc": service}))
    yield service
    set_services(None)


def options(**kw: Any) -> WorkerOptions:
    # SQLite has one writer: the supported set-up there is a single segment at a time.
    defaults: dict[str, Any] = {
        "worker_id": "loop-test",
        "concurrency": 1 if connection.vendor == "sqlite" else 2,
        "poll_interval_s": 0.1,
        "burst": True,
    }
    defaults.update(kw)
    return WorkerOptions(**defaults)


def run_burst(**kw: Any) -> int:
    """Run a burst worker in a thread with a deadline, so a wedged loop fails the test
    instead of hanging it."""
    w = Worker(options(**kw))
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["processed"] = w.run()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="burst-worker")
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        w.stop()
        thread.join(timeout=30)
        raise AssertionError("the burst worker did not finish within 60s")
    if "error" in outcome:
        raise AssertionError(f"the worker loop raised {outcome['error']!r}")
    return int(outcome["processed"])


def start(tenant: Tenant, name: str, input: Any = None) -> str:
    instance, _ = services.start_workflow(tenant, name, json.dumps(input))
    return str(instance.id)


def row(tenant: Tenant, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id)


def result(tenant: Tenant, run_id: str) -> Any:
    found = row(tenant, run_id)
    assert found.status == RunStatus.DONE, f"{found.status}: {found.error_code} {found.error}"
    return json.loads(found.result)


def test_trapping_and_failing_workflows_do_not_stop_the_loop(
    tenant: Tenant, echo: FakeService
) -> None:
    """A guest trap and an entry point returning PERMANENT fail their own runs (with their
    codes); the runs queued around them complete."""
    definitions.deploy_definition(tenant, "good", call_once())
    definitions.deploy_definition(tenant, "trap", traps(), retry_max_attempts=1)
    definitions.deploy_definition(tenant, "refuse", fails_permanently())
    before = start(tenant, "good", {"n": 1})
    trapped = start(tenant, "trap")
    refused = start(tenant, "refuse")
    after = [start(tenant, "good", {"n": n}) for n in (2, 3)]

    assert run_burst() == 5
    for n, run in enumerate([before, *after], start=1):
        assert result(tenant, run) == [[0, json.dumps({"echo": {"n": n}}, separators=(",", ":"))]]
    trap_row = row(tenant, trapped)
    # A trap may succeed on another attempt; with one attempt allowed it is dead-lettered.
    assert (trap_row.status, trap_row.error_code) == (RunStatus.DEAD_LETTERED, ErrorCode.PANIC)
    assert "unreachable" in trap_row.error
    refused_row = row(tenant, refused)
    assert (refused_row.status, refused_row.error_code) == (RunStatus.FAILED, ErrorCode.PERMANENT)
    assert refused_row.error == "the order was refused"
    assert echo.ops() == ["echo"] * 3


def test_garbage_module_bytes_fail_that_run_without_stopping_the_loop(
    tenant: Tenant, echo: FakeService
) -> None:
    """A definition row whose stored bytes were corrupted after deployment (and so are in
    no module cache) fails its run with ``invalid_module``; other runs complete."""
    definitions.deploy_definition(tenant, "victim", call_once())
    definitions.deploy_definition(tenant, "good", fails_permanently())
    garbage = b"\x00asm\x01\x00\x00\x00 this is not a module"
    with tenant_context(tenant.id):
        WorkflowDefinition.objects.filter(tenant_id=tenant.id, name="victim").update(
            wasm=garbage, sha256=hashlib.sha256(garbage).hexdigest()
        )
    victim = start(tenant, "victim", {"n": 1})
    other = start(tenant, "good")

    assert run_burst() == 2
    found = row(tenant, victim)
    assert (found.status, found.error_code) == (RunStatus.FAILED, ErrorCode.INVALID_MODULE)
    assert found.error
    assert row(tenant, other).error_code == ErrorCode.PERMANENT
    assert echo.calls == []


def test_a_database_error_in_the_loop_is_logged_and_the_loop_recovers(
    tenant: Tenant, echo: FakeService, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    calls = []
    real_claim = worker.claim_ready_instances

    def flaky_claim(*args: Any, **kw: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real_claim(*args, **kw)

    monkeypatch.setattr(worker, "claim_ready_instances", flaky_claim)
    definitions.deploy_definition(tenant, "good", call_once())
    run = start(tenant, "good", {"n": 7})
    errors_before = REGISTRY.get_sample_value("cleat_worker_loop_errors_total") or 0.0

    with caplog.at_level(logging.INFO, logger="cleat.worker"):
        assert run_burst() == 1
    assert result(tenant, run) == [[0, '{"echo":{"n":7}}']]
    assert len(calls) >= 2
    loop_errors = [r for r in caplog.records if "event=worker_loop_error" in r.getMessage()]
    assert len(loop_errors) == 1
    assert loop_errors[0].exc_info is not None
    assert "server closed the connection" in str(loop_errors[0].exc_info[1])
    assert REGISTRY.get_sample_value("cleat_worker_loop_errors_total") == errors_before + 1


def test_stop_while_a_segment_runs_lets_it_finish_then_exits(tenant: Tenant) -> None:
    """``stop()`` (what SIGTERM calls) while a segment is inside a slow call: no new claim,
    the segment completes and is persisted, then ``run()`` returns."""
    entered, go = threading.Event(), threading.Event()

    def slow(request: Any) -> Any:
        entered.set()
        assert go.wait(timeout=30), "the test never let the call finish"
        return {"slow": request}

    set_services(Services.from_settings({"svc": FakeService({"echo": slow})}))
    try:
        definitions.deploy_definition(tenant, "good", call_once())
        first = start(tenant, "good", {"n": 1})
        second = start(tenant, "good", {"n": 2})
        # No run claimed ahead (test_claim_ahead covers those): the second is never claimed.
        w = Worker(options(concurrency=1, burst=False, claim_ahead=0))
        returned: list[int] = []
        thread = threading.Thread(target=lambda: returned.append(w.run()), name="stop-worker")
        thread.start()
        try:
            assert entered.wait(timeout=30), "the worker never started the segment"
            w.stop()
            time.sleep(0.5)
            assert thread.is_alive(), "run() returned under a running segment"
        finally:
            go.set()
            thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not exit after its segment finished"
    finally:
        set_services(None)
    assert returned == [1]
    assert result(tenant, first) == [[0, '{"slow":{"n":1}}']]
    untouched = row(tenant, second)
    assert (untouched.status, untouched.generation) == (RunStatus.READY, 0)


def test_runworker_burst_exits_zero_when_nothing_is_due(tenant: Tenant) -> None:
    """Nothing due (one run due in an hour, one on a queue the worker does not serve): the
    burst worker exits 0 at once and touches neither."""
    definitions.deploy_definition(tenant, "good", call_once())
    later = start(tenant, "good")
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=later).update(
            next_wake_at=timezone.now() + timedelta(hours=1)
        )
    elsewhere, _ = services.start_workflow(tenant, "good", "null", task_queue="elsewhere")

    started = time.monotonic()
    done = manage(["runworker", "--burst"], command_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "processed 0 segment(s)" in done.stdout
    assert time.monotonic() - started < 30
    for run in (later, str(elsewhere.id)):
        found = row(tenant, run)
        assert (found.status, found.generation) == (RunStatus.READY, 0)


@pytest.mark.postgres_only
def test_require_rls_refuses_the_superuser_and_starts_as_the_app_role(tenant: Tenant) -> None:
    assert connection.vendor == "postgresql", "run with CLEAT_TEST_DB=postgres"
    # The suite migrates as the server's superuser ``postgres`` (CLEAT_TEST_POSTGRES_URL).
    refused = manage(
        ["runworker", "--burst", "--require-rls"], command_env(db_user="postgres"), timeout=60
    )
    assert refused.returncode != 0
    assert "superuser" in refused.stderr, refused.stderr
    assert "worker_started" not in refused.stderr

    accepted = manage(["runworker", "--burst", "--require-rls"], command_env(), timeout=60)
    assert accepted.returncode == 0, accepted.stderr
    assert "event=worker_started" in accepted.stderr
    assert "superuser" not in accepted.stderr
    assert "processed 0 segment(s)" in accepted.stdout


# --- waking up (PostgreSQL LISTEN/NOTIFY) ---------------------------------------------------
# A poll interval of 30 s: a run these tests start is claimed within the bound only if a NOTIFY
# (or the listener's catch-up after a reconnection) woke the loop.

WAKE_BOUND_S = 10.0


def call_op(operation: str) -> bytes:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("svc")} {w.s(operation)} {w.input()}))
    (call $finish)"""
    )
    return w.wasm()


def wait_for(predicate: Any, timeout: float, what: str) -> float:
    """Seconds until ``predicate()`` held; fails the test after ``timeout``."""
    began = time.monotonic()
    while not predicate():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what} not within {timeout:.0f}s")
        time.sleep(0.01)
    return time.monotonic() - began


@contextlib.contextmanager
def listening_worker(**kw: Any) -> Iterator[Worker]:
    """A long-running worker (poll interval 30 s) in a thread, once its listener is
    connected and its first passes are over; stopped at the end."""
    w = Worker(options(burst=False, poll_interval_s=30.0, **kw))
    thread = threading.Thread(target=w.run, name="listening-worker")
    thread.start()
    try:
        wait_for(
            lambda: w._listener is not None and w._listener.connected.is_set(),
            30,
            "the listener connected",
        )
        time.sleep(0.5)  # the catch-up pass after connecting is over: the loop sleeps
        yield w
    finally:
        w.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop"


def status_of(tenant: Tenant, run_id: str) -> str:
    return row(tenant, run_id).status


@pytest.mark.postgres_only
def test_a_notify_wakes_an_idle_worker_long_before_its_poll_interval(tenant: Tenant) -> None:
    set_services(Services.from_settings({"svc": FakeService({"echo": {"ok": True}})}))
    try:
        definitions.deploy_definition(tenant, "fast", call_op("echo"))
        with listening_worker():
            run = start(tenant, "fast", {"n": 1})
            wait_for(lambda: status_of(tenant, run) == RunStatus.DONE, WAKE_BOUND_S, "done")
    finally:
        set_services(None)


@pytest.mark.postgres_only
def test_a_start_is_its_insert_and_commit_and_its_notify_is_delivered_by_the_commit(
    tenant: Tenant,
) -> None:
    """A start without an idempotency key takes no savepoint and sends no NOTIFY statement:
    its insert's trigger sends it inside the transaction, so a listener hears a committed
    start once, and never a rolled-back one. The insert of a run that is not ready (here a
    finished one) wakes nobody."""
    import psycopg
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from workflows.store.wake import NOTIFY_CHANNEL

    definitions.deploy_definition(tenant, "fast", call_op("echo"))
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")

        def heard() -> int:
            return len(list(listener.notifies(timeout=0.5)))

        with contextlib.suppress(RuntimeError), transaction.atomic():
            services.start_workflow(tenant, "fast", {"n": 1})
            raise RuntimeError("rolled back")
        assert heard() == 0
        statements: list[tuple[str, bool]] = []  # and whether a transaction was open

        def record(execute: Any, sql: str, *args: Any) -> Any:
            statements.append((sql, connection.in_atomic_block))
            return execute(sql, *args)

        with connection.execute_wrapper(record):
            run, created = services.start_workflow(tenant, "fast", {"n": 2})
        assert created
        assert not [q for q, _ in statements if "SAVEPOINT" in q], statements
        assert [q for q, _ in statements if q.startswith("INSERT")], statements
        assert not [q for q, _ in statements if "pg_notify" in q], statements
        assert heard() == 1
        with tenant_context(tenant.id):
            done = WorkflowInstance.objects.get(id=run.id)
            done.pk, done.workflow_id, done.status = uuid.uuid4(), "copy", RunStatus.DONE
            done.save(force_insert=True)
        assert heard() == 0
        # With a key the start keeps its savepoint: a collision reads the run that won.
        with CaptureQueriesContext(connection) as seen:
            keyed, _ = services.start_workflow(tenant, "fast", {}, idempotency_key="k")
            again, created = services.start_workflow(tenant, "fast", {}, idempotency_key="k")
        assert again.id == keyed.id and not created
        assert any("SAVEPOINT" in q["sql"] for q in seen.captured_queries)
        assert heard() == 1  # the first keyed start's; the repeat started nothing
    assert status_of(tenant, str(run.id)) == RunStatus.READY


@pytest.mark.postgres_only
def test_a_run_started_while_a_segment_runs_is_claimed_at_once(tenant: Tenant) -> None:
    """The loop sleeps on NOTIFY and on its segments at the same time: a start is claimed
    while another segment is still inside a slow call (it used to wait for that segment or
    the poll interval)."""
    entered, go = threading.Event(), threading.Event()

    def slow(request: Any) -> Any:
        entered.set()
        assert go.wait(timeout=60), "the test never let the call finish"
        return {"slow": request}

    set_services(Services.from_settings({"svc": FakeService({"slow": slow, "echo": {"ok": True}})}))
    try:
        definitions.deploy_definition(tenant, "slow", call_op("slow"))
        definitions.deploy_definition(tenant, "fast", call_op("echo"))
        with listening_worker(concurrency=2):
            blocked = start(tenant, "slow", {"n": 1})
            assert entered.wait(timeout=WAKE_BOUND_S), "the slow segment never started"
            time.sleep(0.2)  # the loop is asleep again, with a segment in flight
            quick = start(tenant, "fast", {"n": 2})
            try:
                wait_for(lambda: status_of(tenant, quick) == RunStatus.DONE, WAKE_BOUND_S, "done")
                assert status_of(tenant, blocked) == RunStatus.RUNNING
            finally:
                go.set()
            wait_for(lambda: status_of(tenant, blocked) == RunStatus.DONE, 30, "the slow run done")
    finally:
        go.set()
        set_services(None)


@pytest.mark.postgres_only
def test_the_listener_reconnects_and_catches_up_with_what_it_missed(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's connection is killed; a run started while nobody listens (its NOTIFY
    is lost) is claimed right after the listener is back, not at the next poll."""
    monkeypatch.setattr(worker._PgListener, "BACKOFF_S", (2.0, 30.0))
    set_services(Services.from_settings({"svc": FakeService({"echo": {"ok": True}})}))
    try:
        definitions.deploy_definition(tenant, "fast", call_op("echo"))
        with listening_worker() as w:
            listener = w._listener
            assert listener is not None
            first_pid = listener._conn.info.backend_pid
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [first_pid])
                assert cursor.fetchone()[0] is True
            wait_for(lambda: not listener.connected.is_set(), 10, "the listener noticed")
            run = start(tenant, "fast", {"n": 1})  # notified to nobody
            wait_for(lambda: status_of(tenant, run) == RunStatus.DONE, WAKE_BOUND_S, "done")
            assert listener.connected.is_set()
            assert listener._conn.info.backend_pid != first_pid
    finally:
        set_services(None)


@pytest.mark.postgres_only
def test_a_segment_whose_idle_connection_died_reads_again_on_a_new_one(
    tenant: Tenant, echo: FakeService
) -> None:
    """The worker skips the health check of a connection that answered a moment ago; when
    that connection died meanwhile, the segment's load (a read) runs again on a new one."""
    from workflows.executor import execute_claim
    from workflows.store.lifecycle import claim_ready_instances

    definitions.deploy_definition(tenant, "good", call_once())
    run = start(tenant, "good", {"n": 3})
    [claim] = claim_ready_instances("w-dead", ["default"], 1, timezone.now())
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid

    def kill() -> None:  # from another thread, so on another connection
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
        finally:
            connection.close()

    killer = threading.Thread(target=kill)
    killer.start()
    killer.join(timeout=30)
    connection.health_check_done = True  # as the worker marks a connection that just answered
    report = execute_claim(claim, "w-dead")
    assert report.outcome == "completed", report
    assert connection.connection.info.backend_pid != pid
    assert result(tenant, run) == [[0, '{"echo":{"n":3}}']]


def test_the_worker_moves_what_is_alive_at_its_start_out_of_the_collectors_way(
    tenant: Tenant, echo: FakeService
) -> None:
    """Full garbage collections over Django's and wasmtime's objects paused segments for tens
    of milliseconds: the first worker of a process freezes them (``gc.freeze``)."""
    import gc

    definitions.deploy_definition(tenant, "good", call_once())
    run = start(tenant, "good", {"n": 1})
    assert run_burst() == 1
    assert gc.get_freeze_count() > 0
    assert result(tenant, run) == [[0, '{"echo":{"n":1}}']]


def test_a_deadlocked_finalize_is_run_again_without_remaking_the_segment(
    tenant: Tenant, echo: FakeService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadlock victim's transaction was rolled back whole: the finalize runs again at
    once, so the run completes in its first segment, its call made once, no attempt spent."""
    from django.db import OperationalError

    from workflows import executor

    real = executor.finalize_segment
    deadlocks = []

    def deadlocking(*args: Any, **kw: Any) -> Any:
        if not deadlocks:
            deadlocks.append(args)
            raise OperationalError(1213, "Deadlock found when trying to get lock")
        return real(*args, **kw)

    monkeypatch.setattr(executor, "finalize_segment", deadlocking)
    definitions.deploy_definition(tenant, "good", call_once())
    run = start(tenant, "good", {"n": 1})
    assert run_burst() == 1
    assert len(deadlocks) == 1
    assert result(tenant, run) == [[0, json.dumps({"echo": {"n": 1}}, separators=(",", ":"))]]
    assert row(tenant, run).attempt == 1
    assert echo.ops() == ["echo"]


def test_only_deadlocks_count_as_deadlocks() -> None:
    from django.db import OperationalError

    from workflows.executor import is_deadlock

    class Cause(Exception):
        sqlstate = "40P01"

    pg = OperationalError("deadlock detected")
    pg.__cause__ = Cause()
    assert is_deadlock(OperationalError(1213, "Deadlock found"))
    assert is_deadlock(pg)
    assert not is_deadlock(OperationalError(2006, "MySQL server has gone away"))
    assert not is_deadlock(OperationalError("the connection is closed"))
