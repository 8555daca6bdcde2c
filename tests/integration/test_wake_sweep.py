"""The wake sweep (``workflows/store/wake.py``, the ``wake_sweep`` duty): a waiting run whose
wake-up was lost -- the satisfying transaction committed, the process died before its wake
ran -- is woken by the next pass, whatever it waits for; a run whose wait is not satisfied
is left asleep; each pass looks only at what arrived since the previous one.

A lost wake-up is made here by replacing ``wake.after_commit`` (what every satisfying
transaction calls to wake the run after its commit) with one that does nothing, for the
satisfying call only; ``test_faults.py`` kills real workers at the crash point instead.
Runs on SQLite, PostgreSQL (as the application role, under row-level security: the sweep
crosses tenants through ``cleat.missed_wakes``) and MariaDB.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone
from prometheus_client import REGISTRY

from tests.fixtures.wat import Wat
from workflows import services
from workflows.apps import check_wake_sweep_setting
from workflows.duties import WorkerContext
from workflows.maintenance import WakeSweep, wake_sweep_duty, wake_sweep_seconds
from workflows.models import Promise, RunStatus, TaskCall, Tenant, WorkflowInstance
from workflows.store import wake
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def env(tenant: Tenant) -> Iterator[DatabaseWorkflowEnvironment]:
    environment = DatabaseWorkflowEnvironment(tenant)
    w = Wat()
    w.run("(call $finish)")
    environment.deploy("leaf", w.wasm())
    w = Wat()
    w.run(
        f"""(local.set $c (call $child_workflow {w.s("leaf")} {w.js({})}))
        (call $rec (call $await_child {w.payload("c")})) (call $finish)""",
        locals="$c i64",
    )
    environment.deploy("parent", w.wasm())
    w = Wat()
    w.run(
        f"""(local.set $d (call $run_detached {w.s("leaf")} {w.js({})}))
        (call $rec (call $await_child {w.payload("d")})) (call $finish)""",
        locals="$d i64",
    )
    environment.deploy("starter", w.wasm())
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1))) (call $finish)")
    environment.deploy("waiter", w.wasm())
    w = Wat()
    w.run(
        f"""(local.set $p (call $create_promise {w.s("p")}))
        (call $rec (call $await_promise {w.payload("p")} (i64.const -1))) (call $finish)""",
        locals="$p i64",
    )
    environment.deploy("promised", w.wasm())
    yield environment
    environment.close()


@pytest.fixture
def lost_wakes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """While active, every wake-up after a commit is lost (recorded, not run)."""
    lost: list[Any] = []
    monkeypatch.setattr(wake, "after_commit", lambda tenant, run_id: lost.append(run_id))
    yield lost
    monkeypatch.undo()


def row(tenant: Tenant, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id)


def asleep(tenant: Tenant, run_id: str, now: datetime) -> bool:
    """Waiting, and not due before the re-check (the state a lost wake-up leaves)."""
    found = row(tenant, run_id)
    return found.status == RunStatus.READY and (
        found.next_wake_at is None or found.next_wake_at > now + timedelta(seconds=60)
    )


def sweep(since: timedelta = timedelta(minutes=1)) -> int:
    now = timezone.now()
    return wake.sweep_missed_wakes(now - since, now)


def test_a_parent_whose_child_ended_without_waking_it_is_woken(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    lost: list[Any] = []
    monkeypatch.setattr(wake, "after_commit", lambda tenant, run_id: lost.append(run_id))
    parent = env.run("parent")
    monkeypatch.undo()
    assert lost == [uuid.UUID(parent)]  # the child ended; its wake of the parent was lost
    assert asleep(tenant, parent, timezone.now())
    assert sweep() == 1
    assert not asleep(tenant, parent, timezone.now())
    env.run_until_idle()
    assert env.status(parent) == RunStatus.DONE
    assert sweep() == 0  # nothing waits any more


def test_a_run_whose_detached_run_ended_without_waking_it_is_woken(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run that started a run with ``run_detached`` and awaits it: the detached run's end
    wakes it, and a lost wake-up is found by the sweep (through the index of detached runs
    that ended), as a parent's is."""
    lost: list[Any] = []
    monkeypatch.setattr(wake, "after_commit", lambda tenant, run_id: lost.append(run_id))
    starter = env.run("starter")
    monkeypatch.undo()
    assert lost == [uuid.UUID(starter)]  # the detached run ended; its wake was lost
    assert asleep(tenant, starter, timezone.now())
    assert sweep() == 1
    assert not asleep(tenant, starter, timezone.now())
    env.run_until_idle()
    assert env.status(starter) == RunStatus.DONE
    assert sweep() == 0


def test_signals_updates_promises_and_cancellations_whose_wake_was_lost_are_woken(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    signalled, updated, cancelled = env.start("waiter"), env.start("waiter"), env.start("waiter")
    promised, untouched = env.start("promised"), env.start("waiter")
    env.run_until_idle()
    now = timezone.now()
    assert all(asleep(tenant, r, now) for r in (signalled, updated, cancelled, promised))
    lost: list[Any] = []
    monkeypatch.setattr(wake, "after_commit", lambda tenant, run_id: lost.append(run_id))
    env.signal(signalled, "go", {"n": 1})
    env.signal(untouched, "other")  # arrived, but not what the run waits for
    services.send_update(tenant, updated, "bump")
    env.cancel(cancelled)
    with tenant_context(tenant.id):
        promise_id = Promise.objects.get(instance_id=promised).id
    env.resolve_promise(promise_id, {"v": 1})
    monkeypatch.undo()
    assert len(lost) == 5
    assert sweep() == 4
    now = timezone.now()
    for run_id in (signalled, updated, cancelled, promised):
        assert not asleep(tenant, run_id, now), run_id
    assert asleep(tenant, untouched, now)
    env.run_until_idle()
    assert env.status(signalled) == RunStatus.DONE
    assert env.status(promised) == RunStatus.DONE
    assert env.status(cancelled) in (RunStatus.DONE, RunStatus.FAILED)
    assert sweep() == 0


def test_a_reported_task_outcome_whose_wake_was_lost_wakes_its_run(
    env: DatabaseWorkflowEnvironment, tenant: Tenant
) -> None:
    waiting = env.start("waiter")
    env.run_until_idle()
    task_id = uuid.uuid4()
    later = timezone.now() + timedelta(minutes=5)
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=waiting).update(
            waiting_on={"kind": "task", "task_id": str(task_id), "signals": []},
            next_wake_at=later,
        )
        call = TaskCall.objects.create(
            id=task_id,
            tenant=tenant,
            instance_id=waiting,
            step=0,
            service="billing",
            operation="charge",
            idempotency_key="k",
            token="t",
        )
    assert sweep() == 0  # pending: nothing arrived
    with tenant_context(tenant.id):
        TaskCall.objects.filter(id=call.id).update(
            state=TaskCall.State.REPORTED, status=0, payload="{}", reported_at=timezone.now()
        )
    assert sweep() == 1
    assert row(tenant, waiting).next_wake_at <= timezone.now()


def test_runs_of_every_tenant_are_swept_in_one_pass(
    env: DatabaseWorkflowEnvironment,
    tenant: Tenant,
    other_tenant: Tenant,
    lost_wakes: list[Any],
) -> None:
    mine = env.start("waiter")
    env.run_until_idle()
    other = DatabaseWorkflowEnvironment(other_tenant, worker_id="other-worker")
    try:
        w = Wat()
        w.run(
            f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1)))"
            " (call $finish)"
        )
        other.deploy("waiter", w.wasm())
        theirs = other.start("waiter")
        other.run_until_idle()
        env.signal(mine, "go")
        other.signal(theirs, "go")
    finally:
        other.close()
    assert len(lost_wakes) == 2
    assert sweep() == 2
    now = timezone.now()
    assert not asleep(tenant, mine, now)
    assert not asleep(other_tenant, theirs, now)


def test_a_run_with_an_unreadable_wait_is_passed_over_and_the_others_still_woken(
    env: DatabaseWorkflowEnvironment,
    tenant: Tenant,
    lost_wakes: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken, fine = env.start("waiter"), env.start("waiter")
    env.run_until_idle()
    with tenant_context(tenant.id):
        WorkflowInstance.objects.filter(id=broken).update(waiting_on={"signals": 5})
    env.signal(broken, "go")
    env.signal(fine, "go")
    assert sweep() == 1
    now = timezone.now()
    assert asleep(tenant, broken, now)
    assert not asleep(tenant, fine, now)
    assert f"event=wake_sweep_error run={broken}" in caplog.text


def test_the_duty_looks_back_to_the_recheck_first_then_since_its_last_pass(
    env: DatabaseWorkflowEnvironment, tenant: Tenant, lost_wakes: list[Any]
) -> None:
    early, late, stale = env.start("waiter"), env.start("waiter"), env.start("waiter")
    env.run_until_idle()
    env.signal(early, "go")
    counted = REGISTRY.get_sample_value("cleat_wake_sweep_woken_total") or 0.0
    duty = WakeSweep(every_s=0.0)
    # The first pass of a process looks back as far as the re-check: it finds `early`.
    assert duty.run_due(timezone.now()) == 1
    assert REGISTRY.get_sample_value("cleat_wake_sweep_woken_total") == counted + 1
    assert duty.run_due(timezone.now()) == 0
    env.signal(late, "go")
    # An arrival stamped long before the last pass (its wake-up long overdue, for the
    # re-check): outside the window of the passes that follow.
    env.signal(stale, "go")
    with tenant_context(tenant.id):
        from workflows.models import Signal

        Signal.objects.filter(instance_id=stale).update(
            created_at=timezone.now() - timedelta(minutes=2)
        )
    assert duty.run_due(timezone.now()) == 1
    now = timezone.now()
    assert not asleep(tenant, late, now)
    assert asleep(tenant, stale, now)
    # A fresh duty (a new process) looks back to the re-check, and finds it.
    assert WakeSweep(every_s=0.0).run_due(timezone.now()) == 1
    assert not asleep(tenant, stale, timezone.now())


def test_the_duty_runs_every_interval_only() -> None:
    duty = WakeSweep(every_s=3600.0)
    now = timezone.now()
    assert duty.seconds_until_due(now) == 0.0
    duty.run_due(now)
    assert 3500 < duty.seconds_until_due(now) <= 3600


def test_the_setting_gives_the_interval_turns_it_off_and_refuses_nonsense() -> None:
    context = WorkerContext(worker_id="w", tenant=None, poll_interval_s=1.0)
    with override_settings(CLEAT_WAKE_SWEEP_SECONDS=7):
        duty = wake_sweep_duty(context)
        assert isinstance(duty, WakeSweep) and duty.every_s == 7.0
        assert check_wake_sweep_setting() == []
    with override_settings(CLEAT_WAKE_SWEEP_SECONDS=0):
        assert wake_sweep_duty(context) is None
    for bad in ("soon", -1, float("nan"), True):
        with override_settings(CLEAT_WAKE_SWEEP_SECONDS=bad):
            with pytest.raises(ImproperlyConfigured, match="CLEAT_WAKE_SWEEP_SECONDS"):
                wake_sweep_seconds()
            errors = check_wake_sweep_setting()
            assert [e.id for e in errors] == ["workflows.E004"], bad
            assert "CLEAT_WAKE_SWEEP_SECONDS" in errors[0].msg
