"""Dispatch on the broker, in process, on every database: what a wake-up publishes and when,
the claim of one named run, and the sweep (``workflows/dispatch.py``). The publisher is a
recorder (``support.dispatch``); ``test_dispatch_celery.py`` runs the same on real brokers
with real Celery workers.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from tests.fixtures.wat import Wat
from tests.integration.support.dispatch import RECORDER, RECORDER_PATH
from tests.integration.support.processes import command_env, manage
from workflows import definitions, dispatch, services
from workflows.models import RunStatus, Tenant, WorkflowInstance
from workflows.store.lifecycle import claim_ready_instances
from workflows.tenancy import tenant_context

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "hunter2-do-not-show"


@pytest.fixture
def on_broker() -> Iterator[None]:
    RECORDER.clear()
    with override_settings(CLEAT_DISPATCH="celery", CLEAT_CELERY_APP=RECORDER_PATH):
        yield
    RECORDER.clear()


def napper() -> bytes:
    """One 1 s timer, then done."""
    w = Wat()
    w.run("(call $recn (call $durable_sleep (i64.const 1000))) (call $finish)")
    return w.wasm()


def parent_of_one() -> bytes:
    """Starts a `napper` child and waits for it."""
    w = Wat()
    w.run(
        f"""
    (local.set $c (call $child_workflow {w.s("napper")} {w.js({"k": 1})}))
    (call $rec (call $await_child {w.payload("c")}))
    (call $finish)""",
        locals="$c i64",
    )
    return w.wasm()


def timer_due(tenant: Tenant, run: uuid.UUID | str) -> datetime:
    """Wait until the run's timer is due; returns the instant."""
    due = row(tenant, run).next_wake_at
    assert due is not None
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.01)
    return timezone.now()


def row(tenant: Tenant, run: uuid.UUID | str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run)


def test_a_start_publishes_its_run_after_the_commit_with_ids_only(
    tenant: Tenant, on_broker: None
) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    run, _ = services.start_workflow(
        tenant, "napper", json.dumps({"password": SECRET}), priority=100, task_queue="batch"
    )
    assert len(RECORDER.sent) == 1
    sent = RECORDER.sent[0]
    assert sent.name == "cleat.run_segment"
    assert sent.args == [str(tenant.id), str(run.id)]
    assert sent.kwargs == {"task_queue": "batch"}
    assert sent.options["queue"] == "cleat.batch"
    assert sent.options["priority"] == 9  # the highest run priority, RabbitMQ's highest
    assert SECRET not in repr(sent)
    assert row(tenant, run.id).dispatched_at is not None


def test_a_start_that_rolls_back_publishes_nothing(tenant: Tenant, on_broker: None) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    with pytest.raises(RuntimeError), transaction.atomic():
        services.start_workflow(tenant, "napper", "null")
        assert RECORDER.sent == []  # not inside the transaction either
        raise RuntimeError("rolled back")
    assert RECORDER.sent == []
    with tenant_context(tenant.id):
        assert not WorkflowInstance.objects.exists()


def test_poll_mode_publishes_nothing(tenant: Tenant) -> None:
    RECORDER.clear()
    definitions.deploy_definition(tenant, "napper", napper())
    with override_settings(CLEAT_CELERY_APP=RECORDER_PATH):
        run, _ = services.start_workflow(tenant, "napper", "null")
        assert dispatch.sweep(timezone.now()) == 0
    assert RECORDER.sent == []
    assert row(tenant, run.id).dispatched_at is None


def test_the_named_claim_takes_that_run_only_and_a_duplicate_claims_nothing(
    tenant: Tenant,
) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    first, _ = services.start_workflow(tenant, "napper", "null")
    second, _ = services.start_workflow(tenant, "napper", "null")
    now = timezone.now()
    claims = claim_ready_instances("w1", ["default"], 1, now, tenant.id, run=second.id)
    assert [c.id for c in claims] == [second.id]
    assert claim_ready_instances("w2", ["default"], 1, now, tenant.id, run=second.id) == []
    # Another task queue, or another tenant's id, claims nothing either.
    assert claim_ready_instances("w2", ["other"], 1, now, tenant.id, run=first.id) == []
    assert claim_ready_instances("w2", ["default"], 1, now, uuid.uuid4(), run=first.id) == []
    assert row(tenant, first.id).status == RunStatus.READY
    assert row(tenant, second.id).assigned_to == "w1"


def test_a_message_runs_its_segment_once_and_the_sweep_publishes_the_timer(
    tenant: Tenant, on_broker: None
) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    run, _ = services.start_workflow(tenant, "napper", "null")
    RECORDER.clear()
    assert dispatch.run_ready(tenant.id, run.id, "default") == "suspended"
    assert dispatch.run_ready(tenant.id, run.id, "default") == "nothing"  # a duplicate
    waiting = row(tenant, run.id)
    assert waiting.status == RunStatus.READY and waiting.next_wake_at is not None
    assert dispatch.sweep(waiting.next_wake_at - timedelta(milliseconds=1)) == 0  # not due
    due = timer_due(tenant, run.id)
    assert dispatch.sweep(due) == 1
    assert RECORDER.runs() == [str(run.id)]
    assert dispatch.sweep(due + timedelta(seconds=1)) == 0  # published once
    assert dispatch.run_ready(tenant.id, run.id, "default") == "completed"
    assert row(tenant, run.id).status == RunStatus.DONE


def test_a_lost_message_is_published_again_after_the_redelivery_delay(
    tenant: Tenant, on_broker: None
) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    RECORDER.fail = True  # the broker is away when the run starts
    run, _ = services.start_workflow(tenant, "napper", "null")
    RECORDER.fail = False
    assert RECORDER.sent == []
    marked = row(tenant, run.id).dispatched_at
    assert marked is not None
    assert dispatch.sweep(marked + timedelta(seconds=1)) == 0  # might still be queued
    assert dispatch.sweep(marked + dispatch.redeliver_after()) == 1
    assert RECORDER.runs() == [str(run.id)]


def test_a_queue_with_a_backlog_is_not_given_duplicates(tenant: Tenant, on_broker: None) -> None:
    """A run still due after the redelivery delay is published again only once its queue
    holds no message: with a backlog its message is most likely still waiting."""
    definitions.deploy_definition(tenant, "napper", napper())
    run, _ = services.start_workflow(tenant, "napper", "null")
    RECORDER.clear()
    later = timezone.now() + dispatch.redeliver_after() + timedelta(seconds=1)
    RECORDER.depth = 40
    assert dispatch.sweep(later) == 0
    RECORDER.depth = 0
    assert dispatch.sweep(later) == 1
    assert RECORDER.runs() == [str(run.id)]


def test_a_child_done_wakes_its_parent_through_the_broker(tenant: Tenant, on_broker: None) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    definitions.deploy_definition(tenant, "parent", parent_of_one())
    parent, _ = services.start_workflow(tenant, "parent", "null")
    RECORDER.clear()
    assert dispatch.run_ready(tenant.id, parent.id, "default") == "suspended"
    with tenant_context(tenant.id):
        child = WorkflowInstance.objects.get(parent_id=parent.id)
    assert RECORDER.runs() == [str(child.id)]  # the child's start
    RECORDER.clear()
    assert dispatch.run_ready(tenant.id, child.id, "default") == "suspended"
    assert dispatch.sweep(timer_due(tenant, child.id)) == 1
    assert dispatch.run_ready(tenant.id, child.id, "default") == "completed"
    assert RECORDER.runs() == [str(child.id), str(parent.id)]  # the timer, the wake-up
    assert dispatch.run_ready(tenant.id, parent.id, "default") == "completed"
    assert row(tenant, parent.id).status == RunStatus.DONE


def test_an_inactive_tenant_s_run_is_not_claimed_from_its_message(
    tenant: Tenant, on_broker: None
) -> None:
    definitions.deploy_definition(tenant, "napper", napper())
    run, _ = services.start_workflow(tenant, "napper", "null")
    Tenant.objects.filter(id=tenant.id).update(is_active=False)
    assert dispatch.run_ready(tenant.id, run.id, "default") == "nothing"
    assert row(tenant, run.id).status == RunStatus.READY
    RECORDER.clear()
    assert dispatch.sweep(timezone.now() + timedelta(hours=1)) == 0  # nor swept


def test_broker_priorities_follow_each_broker_s_order() -> None:
    assert [dispatch.broker_priority(p, "amqp://h//") for p in (-100, 0, 100, 500)] == [0, 4, 9, 9]
    assert [dispatch.broker_priority(p, "redis://h/0") for p in (-100, 0, 100)] == [9, 5, 0]


def test_an_unknown_dispatch_mode_stops_the_commands_with_its_reason() -> None:
    for args in (["check"], ["runworker", "--burst"]):
        done: subprocess.CompletedProcess[str] = manage(
            args, command_env(CLEAT_DISPATCH="rabbit"), timeout=120
        )
        assert done.returncode != 0, done
        assert "CLEAT_DISPATCH='rabbit' is not a dispatch mode" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
