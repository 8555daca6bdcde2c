"""Fault injection (issue 19): real ``manage.py runworker`` processes that crash at named
points, talk to their database through a network that misbehaves, run on clocks 60 s
apart, or lose their database to a restart -- and after every scenario the checker
(``support.faults.check``) finds every run done, every history contiguous and checksummed
and replaying to its row's end, every idempotent effect applied exactly once, and every
schedule instant fired exactly once.

The workload (``support.faults.Workload``) passes every crash point: ledger calls and their
appends, a child start, a continue-as-new, finalizes, schedule firings; a scenario of its own
crashes between a child's end (a signal's) and its wake of the waiting run (``before_wake``).
Crash points run on PostgreSQL and MariaDB; the proxy, the skew and the restart on
PostgreSQL (``postgres_only``). The SQLite pass leaves the module out (``server_db``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from engine import faults
from tests.fixtures.wat import Wat
from tests.integration.support.faults import Workload, check, unfinished
from tests.integration.support.ledger import Ledger
from tests.integration.support.netproxy import FaultyProxy
from tests.integration.support.processes import (
    WorkerProcess,
    command_env,
    database_url,
    wait_until,
)
from workflows.models import Tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.server_db]

JOBS = 4
# Long enough that a worker on a loaded machine does not reap its own runs; short enough that
# a crashed worker's runs come back within seconds.
LEASE_S = 3.0
RECHECK_S = "5"


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with Ledger().serving() as served:
        yield served


@pytest.fixture
def workload(tenant: Tenant) -> Workload:
    if connection.vendor not in ("postgresql", "mysql"):
        pytest.fail(
            "the fault scenarios race worker processes on a database server: run them with "
            "CLEAT_TEST_DB=postgres or CLEAT_TEST_DB=mariadb"
        )
    return Workload(tenant)


def worker(
    tmp_path: Path, name: str, ledger: Ledger, *args: str, url: str | None = None, **env: str
) -> WorkerProcess:
    extra = {"DATABASE_URL": url} if url else {}
    # A waiting run is looked at again after this long even if no wake-up came. A worker that
    # dies between a child's (or a signal's) commit and its wake of the waiting run -- a crash
    # point in another thread, a kill -- leaves that run to this re-check (an hour by default):
    # short here, so the scenarios see the recovery they rely on.
    extra["CLEAT_WAIT_RECHECK_SECONDS"] = env.pop("CLEAT_WAIT_RECHECK_SECONDS", RECHECK_S)
    return WorkerProcess(
        tmp_path / f"{name}.log",
        ["--worker-id", name, "--poll-interval", "0.2", "--lease", str(LEASE_S), *args],
        command_env({"ledger": ledger.url}, **extra, **env),
    )


def finish_and_check(
    workload: Workload,
    ledger: Ledger,
    tmp_path: Path,
    schedules: list[str] = (),  # type: ignore[assignment]
    timeout: float = 60,
    **env: str,
) -> Any:
    """A healthy worker finishes whatever is left; then the checker must find nothing."""
    with worker(tmp_path, "healer", ledger, **env) as healer:
        wait_until(lambda: unfinished(workload.tenant) == 0, timeout, "every run done", 0.2)
        healer.terminate()
        assert healer.wait(timeout=30) == 0, healer.log()[-3000:]
    return assert_clean(workload, ledger, schedules)


def assert_clean(workload: Workload, ledger: Ledger, schedules: list[str] = ()) -> Any:  # type: ignore[assignment]
    report = check(workload.tenant, ledger, schedules)
    print(f"\nchecker: {report.summary()}")
    assert not report.violations, "\n".join(report.violations[:20])
    return report


# --- crash points ----------------------------------------------------------------------------

# point -> the hit to crash on (later hits leave some work done before the crash), in the
# order the scenario visits them.
CRASHES = {
    "after_call": 3,
    "after_append": 4,
    "finalize": 3,
    "continue_as_new": 2,
    "child_start": 2,
    "schedule_fire": 2,
}


def test_workers_crashing_at_every_point_in_turn_lose_nothing_and_double_nothing(
    workload: Workload, ledger: Ledger, tmp_path: Path
) -> None:
    """For each crash point in turn: new runs (and, for the firing, new schedules) are
    started, and a worker armed for that point is started and dies there (exit code and log
    line prove it reached the point). The next worker inherits what the dead one held once
    its lease runs out (reaped, replayed); after the last crash a healthy worker finishes
    everything and the checker finds nothing. One process per crash; the runs each crash
    interrupts are at every stage, since earlier runs are still being carried on."""
    schedules: list[str] = []
    started = time.monotonic()
    for point, hit in CRASHES.items():
        workload.start_jobs(2)
        if point == "schedule_fire":
            schedules = workload.create_schedules(3, timezone.now())
        spec = f"{point}:{hit}"
        with worker(tmp_path, f"doomed-{point}", ledger, CLEAT_TEST_CRASH_AT=spec) as doomed:
            code = doomed.wait(timeout=60)
            assert code == faults.EXIT_CODE, f"exit {code}, not a crash at {spec}:\n{doomed.log()}"
            assert f"event=crash_point point={point}" in doomed.log()
    crashed_s = time.monotonic() - started
    report = finish_and_check(workload, ledger, tmp_path, schedules)
    print(
        f"{len(CRASHES)} crashes in {crashed_s:.1f}s, healed in {time.monotonic() - started:.1f}s"
    )
    assert report.runs >= 3 * 2 * len(CRASHES)  # each job: two chain runs and a child
    assert report.firings >= 3
    # The crashes were real: calls were re-sent after them (and the key kept them single).
    assert ledger.repeated_keys(), "no call was sent twice: no crash interrupted a call"


# --- a wake-up lost with its process -------------------------------------------------------

# Long, as in production (an hour by default): the runs must not owe their recovery to it.
LONG_RECHECK_S = "600"
# What "within seconds" means here, on a loaded machine (the sweep runs every 3 s).
SWEEP_DEADLINE_S = 15.0


def test_a_wake_up_lost_with_a_crashed_worker_is_found_by_the_sweep_in_seconds(
    tenant: Tenant, ledger: Ledger, tmp_path: Path
) -> None:
    """A worker dies between the commit of a child's end and its wake of the parent; another
    between the commit of a signal and its wake of the run waiting for it (``before_wake``).
    With the re-check ten minutes away, the healthy worker's wake sweep wakes each within
    seconds (it says so in its log) and they finish: the first on the sweep's first pass
    (the healthy worker started after the crash), the second on a later one (it was
    running when the crash happened)."""
    from workflows import definitions, services
    from workflows.models import RunStatus, WorkflowInstance
    from workflows.tenancy import tenant_context

    if connection.vendor not in ("postgresql", "mysql"):
        pytest.fail("this scenario runs worker processes: CLEAT_TEST_DB=postgres or mariadb")
    w = Wat()
    w.run("(call $finish)")
    definitions.deploy_definition(tenant, "leaf", w.wasm())
    w = Wat()
    w.run(
        f"""(local.set $c (call $child_workflow {w.s("leaf")} {w.js({})}))
        (call $rec (call $await_child {w.payload("c")})) (call $finish)""",
        locals="$c i64",
    )
    definitions.deploy_definition(tenant, "parent", w.wasm())
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1))) (call $finish)")
    definitions.deploy_definition(tenant, "waiter", w.wasm())
    w = Wat()
    w.run(
        f"(call $rec (call $signal_workflow {w.input_string()} {w.s('go')} {w.js({})}))"
        " (call $finish)"
    )
    definitions.deploy_definition(tenant, "sender", w.wasm())

    def status(run_id: str) -> tuple[str, Any]:
        with tenant_context(tenant.id):
            return (
                WorkflowInstance.objects.filter(id=run_id)
                .values_list("status", "next_wake_at")
                .get()
            )

    parent = str(services.start_workflow(tenant, "parent")[0].id)
    waiter = str(services.start_workflow(tenant, "waiter")[0].id)
    # One segment at a time: the parent's finalize commits before its child runs (so the
    # child's end is the parent's only wake-up).
    doomed = ["--concurrency", "1"]
    recheck = {"CLEAT_WAIT_RECHECK_SECONDS": LONG_RECHECK_S, "CLEAT_TEST_CRASH_AT": "before_wake"}
    with worker(tmp_path, "doomed-child", ledger, *doomed, **recheck) as a:
        code = a.wait(timeout=60)
        assert code == faults.EXIT_CODE, f"exit {code}, not a crash at before_wake:\n{a.log()}"
        assert "event=crash_point point=before_wake" in a.log()
    now = timezone.now()
    for run_id in (parent, waiter):  # both asleep until the re-check, ten minutes away
        state, wake_at = status(run_id)
        assert state == RunStatus.READY and wake_at > now + timedelta(minutes=5), (run_id, wake_at)

    healthy = {"CLEAT_WAIT_RECHECK_SECONDS": LONG_RECHECK_S}
    with worker(tmp_path, "healer", ledger, "--queues", "default", **healthy) as healer:
        started = time.monotonic()
        wait_until(lambda: status(parent)[0] == RunStatus.DONE, 60, "the parent done", 0.2)
        parent_s = time.monotonic() - started
        assert f"event=wake_swept run={parent}" in healer.log(), healer.log()[-3000:]
        assert status(waiter)[0] == RunStatus.READY  # still waiting for its signal
        # A run on a queue only the doomed worker serves signals the waiter, and its worker
        # dies after the signal's commit, before its wake.
        services.start_workflow(tenant, "sender", json.dumps(waiter), task_queue="doomed")
        with worker(tmp_path, "doomed-signal", ledger, "--queues", "doomed", **recheck) as b:
            code = b.wait(timeout=60)
            assert code == faults.EXIT_CODE, f"exit {code}, not a crash at before_wake:\n{b.log()}"
            assert "event=crash_point point=before_wake" in b.log()
        crashed = time.monotonic()
        wait_until(lambda: status(waiter)[0] == RunStatus.DONE, 60, "the waiter done", 0.2)
        waiter_s = time.monotonic() - crashed
        assert f"event=wake_swept run={waiter}" in healer.log(), healer.log()[-3000:]
        healer.terminate()
        assert healer.wait(timeout=30) == 0, healer.log()[-3000:]
    print(
        f"\nparent done {parent_s:.1f}s after the healer started, "
        f"waiter {waiter_s:.1f}s after the crash"
    )
    assert parent_s < SWEEP_DEADLINE_S, f"the parent took {parent_s:.1f}s"
    assert waiter_s < SWEEP_DEADLINE_S, f"the waiter took {waiter_s:.1f}s"


# --- a misbehaving network (PostgreSQL) --------------------------------------------------------


@pytest.fixture
def proxy() -> Iterator[FaultyProxy]:
    if connection.vendor != "postgresql":
        pytest.fail("the network scenarios run on PostgreSQL: CLEAT_TEST_DB=postgres")
    db = connection.settings_dict
    with FaultyProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).serving() as served:
        yield served


def proxied_url(proxy: FaultyProxy) -> str:
    db = connection.settings_dict
    return database_url().replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/")


@pytest.mark.postgres_only
@pytest.mark.parametrize("mode", ["delay", "drop", "cut"])
def test_a_slow_or_broken_network_loses_nothing(
    mode: str, workload: Workload, ledger: Ledger, proxy: FaultyProxy, tmp_path: Path
) -> None:
    """Two workers reach the database through the proxy: every chunk delayed 20 ms, new
    connections refused for a while after the old ones are cut, or every connection cut
    again and again -- and the runs all finish, once."""
    workload.start_jobs(JOBS if mode == "delay" else 2 * JOBS)
    url = proxied_url(proxy)
    with (
        worker(tmp_path, "net-a", ledger, url=url) as a,
        worker(tmp_path, "net-b", ledger, url=url) as b,
    ):
        for w in (a, b):  # past start-up (a worker that cannot start exits, by design)
            w.wait_for_log("event=worker_started", 60)
        if mode == "delay":
            proxy.delay(0.01)
        else:
            wait_until(lambda: proxy.open_connections >= 4, 30, "the workers connected")
            for _ in range(2 if mode == "drop" else 5):
                time.sleep(0.5)
                proxy.cut()
                if mode == "drop":
                    proxy.drop(True)
                    time.sleep(1.5)
                    proxy.drop(False)
        wait_until(lambda: unfinished(workload.tenant) == 0, 90, "every run done", 0.2)
        for w in (a, b):
            w.terminate()
            assert w.wait(timeout=30) == 0, w.log()[-3000:]
            assert "Traceback" not in w.log() or mode != "delay", w.log()[-3000:]
    assert_clean(workload, ledger)
    if mode == "delay":
        assert proxy.stats.cut == 0
    else:
        assert proxy.stats.cut >= 2, proxy.stats
    if mode == "drop":
        assert proxy.stats.dropped >= 1, proxy.stats


@pytest.mark.postgres_only
def test_a_partitioned_worker_is_fenced_out_when_it_comes_back(
    workload: Workload, ledger: Ledger, proxy: FaultyProxy, tmp_path: Path
) -> None:
    """A worker behind the proxy is cut off (a partition: its connections stay open, no byte
    crosses) while its runs sit in slow ledger calls; a second worker, reaching the database
    directly, reaps them after the lease and finishes them. When the partition heals, the
    first worker's late writes are refused by the fence: nothing of its stale segments lands."""
    workload.start_jobs(JOBS)
    ledger.hold(30)
    with worker(tmp_path, "island", ledger, url=proxied_url(proxy)) as island:
        island.wait_for_log("event=worker_started", 60)
        wait_until(lambda: ledger.held >= 1, 30, "a ledger call in flight")
        proxy.pause()
        ledger.release()
        with worker(tmp_path, "mainland", ledger) as mainland:
            wait_until(lambda: unfinished(workload.tenant) == 0, 90, "every run done", 0.2)
            proxy.resume()
            # The island's answers come back to runs that are no longer its own.
            island.wait_for_log("event=fence_lost", 30)
            time.sleep(1.0)
            for w in (island, mainland):
                w.terminate()
                assert w.wait(timeout=30) == 0, w.log()[-3000:]
    assert "event=reaped" in mainland.log()
    assert_clean(workload, ledger)


# --- clock skew (PostgreSQL) ---------------------------------------------------------------------


@pytest.mark.postgres_only
def test_two_workers_sixty_seconds_apart_race_on_runs_schedules_and_leases(
    workload: Workload, ledger: Ledger, tmp_path: Path
) -> None:
    """One worker's clock runs 30 s ahead, the other's 30 s behind; both race over the same
    runs (due a minute ago, so both can claim them at once), schedules and leases. Each
    follows the database's clock (it says so in its log), so neither takes the other's
    heartbeats for expired: no lease is reaped (nobody died), both do work, and nothing is
    lost or done twice. On their own clocks, the one ahead reaped every lease of the one
    behind (its heartbeats looked a minute old), and the one behind saw nothing due."""
    if connection.vendor != "postgresql":
        pytest.fail("the skew scenario runs on PostgreSQL: CLEAT_TEST_DB=postgres")
    from workflows.models import WorkflowInstance
    from workflows.tenancy import tenant_context

    runs = workload.start_jobs(3 * JOBS)
    with tenant_context(workload.tenant.id):
        WorkflowInstance.objects.filter(id__in=runs).update(
            next_wake_at=timezone.now() - timedelta(minutes=1)
        )
    schedules = workload.create_schedules(3, timezone.now())
    with (
        worker(tmp_path, "ahead", ledger, CLEAT_TEST_CLOCK_OFFSET_SECONDS="30") as ahead,
        worker(tmp_path, "behind", ledger, CLEAT_TEST_CLOCK_OFFSET_SECONDS="-30") as behind,
    ):
        wait_until(lambda: unfinished(workload.tenant) == 0, 90, "every run done", 0.2)
        for w in (ahead, behind):
            w.terminate()
            assert w.wait(timeout=30) == 0, w.log()[-3000:]
    for w, expected in ((ahead, -30.0), (behind, 30.0)):
        log = w.log()
        assert "event=clock_skewed" in log, log[-2000:]
        measured = [float(v) for v in re.findall(r"event=clock_offset offset_s=(\S+)", log)]
        assert measured and abs(measured[0] - expected) < 1.0, log[-2000:]
        assert "event=reaped" not in log, f"{w.args[1]} reaped a live worker's leases:\n{log}"
        assert w.segments(), f"{w.args[1]} did no work:\n{log[-3000:]}"
    assert_clean(workload, ledger, schedules)


# --- a database restart (a throwaway PostgreSQL cluster) ------------------------------------------


@pytest.fixture
def own_cluster(transactional_db: Any) -> Iterator[Any]:
    """A PostgreSQL cluster of this test's own, migrated, with the test's connection switched
    to it (as the application role) for the test and back before the suite's flush."""
    import subprocess
    import sys

    from tests.integration.support.pgcluster import throwaway_cluster
    from tests.integration.support.processes import MANAGE
    from workflows.rls import app_role

    if connection.vendor != "postgresql":
        pytest.fail("the restart scenario runs on PostgreSQL: CLEAT_TEST_DB=postgres")
    with throwaway_cluster() as cluster:
        env = command_env(DATABASE_URL=cluster.url())
        migrated = subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "--noinput", "-v0"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        saved = dict(connection.settings_dict)
        connection.close()
        connection.settings_dict.update(
            HOST="127.0.0.1", PORT=str(cluster.port), NAME="cleat", USER=app_role()
        )
        try:
            yield cluster
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)


@pytest.mark.postgres_only
def test_the_database_restarting_mid_run_loses_nothing(
    own_cluster: Any, ledger: Ledger, tmp_path: Path
) -> None:
    """Two workers on a cluster of the test's own; it is restarted twice while runs are in
    flight (once fast, once as a crash: ``-m immediate``), down for a second each time. The
    workers reconnect and every run finishes once."""
    from workflows.models import DEFAULT_TENANT_ID

    tenant = Tenant.objects.get(id=DEFAULT_TENANT_ID)
    workload = Workload(tenant)
    workload.start_jobs(2 * JOBS)
    schedules = workload.create_schedules(2, timezone.now())
    url = database_url()
    with (
        worker(tmp_path, "restart-a", ledger, url=url) as a,
        worker(tmp_path, "restart-b", ledger, url=url) as b,
    ):
        for w in (a, b):  # past start-up (a worker that cannot start exits, by design)
            w.wait_for_log("event=worker_started", 60)
        wait_until(lambda: len(ledger.entries) >= 2, 30, "the first calls made")
        connection.close()
        own_cluster.restart(down_s=1.0, mode="fast")
        time.sleep(1.0)
        connection.close()
        own_cluster.restart(down_s=1.0, mode="immediate")
        wait_until(lambda: _unfinished_retrying(tenant) == 0, 90, "every run done", 0.3)
        for w in (a, b):
            w.terminate()
            assert w.wait(timeout=30) == 0, w.log()[-3000:]
    assert own_cluster.restarts == 2
    assert_clean(workload, ledger, schedules)


def _unfinished_retrying(tenant: Tenant) -> int:
    from django.db import OperationalError

    try:
        return unfinished(tenant)
    except OperationalError:
        connection.close()
        return -1


def test_schedules_created_a_minute_back_are_due_at_once(workload: Workload) -> None:
    """The workload's schedules are due when created (so a scenario needs no minute's wait)."""
    from schedules.models import Schedule
    from workflows.tenancy import tenant_context

    now = timezone.now()
    workload.create_schedules(1, now, prefix="due")
    with tenant_context(workload.tenant.id):
        schedule = Schedule.objects.get(name="due-000")
    assert schedule.next_run_at is not None
    assert now - timedelta(seconds=60) < schedule.next_run_at <= now
