"""Tenant isolation in the store and the services themselves, on every database.

MariaDB and SQLite have no row-level security: the explicit tenant filters of the store
(``DjangoStorage``) and of the service functions are the only thing keeping tenants apart
there. Each scenario puts something in tenant B and shows that tenant A -- through the
services, through a ``DjangoStorage`` for A, or through a workflow of A's calling the host
-- neither sees it nor changes it, with a positive control from B's side so a test cannot pass
by seeing nothing at all. On PostgreSQL the same scenarios also run under RLS (the suite is
connected as the application role).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone

from engine.errors import FenceLost
from engine.events import SleepEvent
from engine.status import AbiStatus
from engine.storage import RunRef
from schedules.models import Schedule
from tests.fixtures.wat import Wat
from workflows import services as svc
from workflows.models import (
    AuditLog,
    ConcurrencyKey,
    Promise,
    RunStatus,
    Signal,
    Tenant,
    UpdateRequest,
    WorkflowDefinition,
    WorkflowInstance,
    WorkflowState,
)
from workflows.store.lifecycle import claim_ready_instances
from workflows.store.storage import DjangoStorage
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


# --- workflows -----------------------------------------------------------------------------------


def signal_waiter() -> bytes:
    """Waits up to an hour for ``go``; records what the await returned."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 3600000)))
    (call $finish)"""
    )
    return w.wasm()


def pinger() -> bytes:
    """Signals the run whose id is the (JSON string) input; records the host's answer."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $signal_workflow {w.input_string()} {w.s("go")} {w.js({"from": "pinger"})}))
    (call $finish)"""
    )
    return w.wasm()


def promiser() -> bytes:
    """Creates a promise, publishes its id as query state ``promise``, awaits it."""
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("approval")}))
    (drop (call $set_query_state {w.s("promise")} {w.payload("p")}))
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    return w.wasm()


def promise_resolver() -> bytes:
    """Resolves the promise whose id is the (JSON string) input; records the answer."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $resolve_promise {w.input_string()} {w.js("from elsewhere")}))
    (call $finish)"""
    )
    return w.wasm()


def shared_counter() -> bytes:
    """In the object scope counter/shared: reads ``owner``, writes the input there, and
    increments ``n``."""
    w = Wat()
    w.run(
        f"""
    (drop (call $set_scope {w.s("counter")} {w.s("shared")}))
    (call $rec (call $get_state {w.s("owner")}))
    (drop (call $set_state {w.s("owner")} {w.input()}))
    (call $recn (call $incr_state {w.s("n")} (i64.const 1)))
    (call $finish)"""
    )
    return w.wasm()


def lock_holder() -> bytes:
    """Tries the lock ``L`` (no expiry), records 1/0, then waits for ``release``."""
    w = Wat()
    w.run(
        f"""
    (call $recn (call $acquire_lock {w.s("L")} (i64.const 0)))
    (drop (call $durable_await_signals {w.js(["release"])} (i64.const -1)))
    (call $finish)"""
    )
    return w.wasm()


def parent() -> bytes:
    """Starts a ``child`` and, when that worked, awaits it; records both answers."""
    w = Wat()
    w.run(
        f"""
    (local.set $c (call $child_workflow {w.s("child")} {w.js({})}))
    (call $rec (local.get $c))
    (if (i32.eqz (call $status (local.get $c)))
      (then (call $rec (call $await_child {w.payload("c")}))))
    (call $finish)""",
        locals="$c i64",
    )
    return w.wasm()


def note(text: str) -> bytes:
    """Completes at once with ``[text]``."""
    w = Wat()
    w.run(f"(call $note {w.s(text)}) (call $finish)")
    return w.wasm()


def scheduler() -> bytes:
    """Schedules ``target`` hourly and records the answer, then the tenant's schedules."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $schedule_cron {w.s("target")} {w.s("0 * * * *")} {w.s("UTC")} {w.js({})}))
    (call $rec (call $list_crons))
    (call $finish)"""
    )
    return w.wasm()


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def envs(tenant: Tenant, other_tenant: Tenant) -> Iterator[tuple[Any, Any]]:
    """(A, B): one in-process workflow environment per tenant."""
    a = DatabaseWorkflowEnvironment(tenant, worker_id="worker-a")
    b = DatabaseWorkflowEnvironment(other_tenant, worker_id="worker-b")
    yield a, b
    a.close()
    b.close()


def instance(tenant: Tenant, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(tenant_id=tenant.id, id=run_id)


def transcript(env: DatabaseWorkflowEnvironment, run_id: str) -> list[Any]:
    result = env.result(run_id)
    assert isinstance(result, list)
    return result


# --- runs and the operations on them -------------------------------------------------------------


OPERATIONS: dict[str, Callable[[Tenant, str], Any]] = {
    "get_instance": lambda t, r: _in_context(t, lambda: svc.get_instance(t, r)),
    "signal": lambda t, r: svc.signal_workflow(t, r, "go", {"x": 1}),
    "cancel": lambda t, r: svc.cancel_workflow(t, r, "from A"),
    "terminate": lambda t, r: svc.terminate_workflow(t, r, "from A"),
    "pause": lambda t, r: svc.pause_workflow(t, r),
    "resume": lambda t, r: svc.resume_workflow(t, r),
    "retry": lambda t, r: svc.retry_workflow(t, r),
    "force_complete": lambda t, r: svc.force_complete(t, r, None, {"forced": True}, "op"),
    "force_fail": lambda t, r: svc.force_fail(t, r, None, "forced", operator="op"),
    "re_replay": lambda t, r: svc.re_replay(t, r, None, "op"),
    "send_update": lambda t, r: svc.send_update(t, r, "bump", {}),
    "query_state": lambda t, r: svc.query_state(t, r),
}


def _in_context(tenant: Tenant, fn: Callable[[], Any]) -> Any:
    with tenant_context(tenant.id):
        return fn()


def test_a_run_of_tenant_b_does_not_exist_for_tenant_a(envs: Any, subtests: pytest.Subtests):
    """Every service operation addressed by run id answers NotFound for another tenant's
    run -- exactly what it answers for a run id that exists nowhere -- and changes
    nothing on it."""
    a, b = envs
    b.deploy("approval", signal_waiter())
    b_run = b.run("approval")
    before = instance(b.tenant, b_run)
    assert before.status == RunStatus.READY and before.waiting_on is not None

    for operation, call in OPERATIONS.items():
        with subtests.test(operation):
            with pytest.raises(svc.NotFound) as caught:
                call(a.tenant, b_run)
            assert caught.value.field == "run_id"
            assert b_run in caught.value.message
            with pytest.raises(svc.NotFound) as nowhere:
                call(a.tenant, str(uuid.uuid4()))
            assert nowhere.value.field == caught.value.field

    after = instance(b.tenant, b_run)
    assert (after.status, after.generation, after.cancel_requested, after.event_count) == (
        before.status,
        before.generation,
        before.cancel_requested,
        before.event_count,
    )
    with tenant_context(b.tenant.id):
        assert not Signal.objects.filter(instance_id=b_run).exists()
        assert not UpdateRequest.objects.filter(instance_id=b_run).exists()
        assert not AuditLog.objects.filter(instance_id=b_run).exists()
    # The owner still reaches it.
    svc.signal_workflow(b.tenant, b_run, "go", {"x": 1})
    b.run_until_idle()
    assert transcript(b, b_run) == [[0, '{"name":"go","payload":{"x":1}}']]


def test_definitions_and_versions_are_per_tenant(envs: Any) -> None:
    """Names and version numbers belong to a tenant: B's definition cannot be started from
    A, and each tenant numbers its own versions."""
    a, b = envs
    assert b.deploy("billing", note("b1")) == 1
    assert b.deploy("billing", note("b2")) == 2
    with pytest.raises(svc.NotFound) as caught:
        svc.start_workflow(a.tenant, "billing")
    assert caught.value.field == "definition" and "billing" in caught.value.message
    assert a.deploy("billing", note("a1")) == 1
    run = a.run("billing")
    assert transcript(a, run) == ["a1"]
    with pytest.raises(svc.NotFound):
        svc.start_workflow(a.tenant, "billing", version=2)


def test_start_idempotency_keys_are_per_tenant(envs: Any) -> None:
    a, b = envs
    a.deploy("job", note("a"))
    b.deploy("job", note("b"))
    run_a, created_a = svc.start_workflow(a.tenant, "job", idempotency_key="order-17")
    run_b, created_b = svc.start_workflow(b.tenant, "job", idempotency_key="order-17")
    assert created_a and created_b
    assert run_a.id != run_b.id
    again, created = svc.start_workflow(b.tenant, "job", idempotency_key="order-17")
    assert (again.id, created) == (run_b.id, False)


# --- the store -------------------------------------------------------------------------------


def test_the_store_reads_only_its_own_tenant(envs: Any) -> None:
    """A ``DjangoStorage`` for A reads none of B's signals, cancellation, promises, state,
    schedules, updates or children, while one for B reads them all."""
    a, b = envs
    b.deploy("promising", promiser())
    b.deploy("done", note("finished"))
    b_run = b.run("promising")
    done_run = b.run("done")
    promise_id = b.describe(b_run)["query_state"]["promise"]
    svc.signal_workflow(b.tenant, b_run, "unawaited", {"n": 1})
    svc.send_update(b.tenant, b_run, "bump", {"by": 1})
    svc.cancel_workflow(b.tenant, b_run, "stop it")
    scope = f"wf:{b_run}"
    with tenant_context(b.tenant.id):
        WorkflowState.objects.create(tenant=b.tenant, scope=scope, key="k1", value='"v"')
        Schedule.objects.create(
            tenant=b.tenant, name="hourly", workflow_name="done", cron="0 * * * *"
        )

    ref_b = RunRef(str(b.tenant.id), b_run, b_run, "w", 0)
    ref_a = RunRef(str(a.tenant.id), b_run, b_run, "w", 0)
    mine, theirs = DjangoStorage(b.tenant.id), DjangoStorage(a.tenant.id)

    message = mine.next_signal(ref_b, ["unawaited"], ())
    assert message is not None and json.loads(message.payload) == {"n": 1}
    assert theirs.next_signal(ref_a, ["unawaited"], ()) is None

    assert mine.cancellation(ref_b) == "stop it"
    assert theirs.cancellation(ref_a) is None

    promise = mine.promise_state(ref_b, promise_id)
    assert promise is not None and promise.status == "pending"
    assert theirs.promise_state(ref_a, promise_id) is None

    assert mine.get_state(ref_b, scope, "k1") == '"v"'
    assert theirs.get_state(ref_a, scope, "k1") is None
    assert mine.list_state(ref_b, scope, "k") == ["k1"]
    assert theirs.list_state(ref_a, scope, "k") == []

    assert [s["name"] for s in mine.list_schedules(ref_b)] == ["hourly"]
    assert theirs.list_schedules(ref_a) == []

    assert [u.name for u in mine.pending_updates(ref_b, ())] == ["bump"]
    assert theirs.pending_updates(ref_a, ()) == []

    [outcome] = mine.child_outcomes(ref_b, [done_run])
    assert outcome is not None and outcome.status == AbiStatus.OK
    [hidden] = theirs.child_outcomes(ref_a, [done_run])
    assert hidden is not None and hidden.status == AbiStatus.NOT_FOUND


def test_the_store_cannot_write_to_another_tenants_claimed_run(envs: Any) -> None:
    """B's run is claimed by a worker; A's storage, given the same worker id and generation,
    cannot heartbeat it or append to its history (the fence names the tenant too)."""
    a, b = envs
    b.deploy("approval", signal_waiter())
    b_run = b.start("approval")
    [claim] = claim_ready_instances("w", ["default"], 1, timezone.now(), b.tenant.id)
    assert str(claim.id) == b_run
    ref_a = RunRef(str(a.tenant.id), b_run, b_run, "w", claim.generation)
    ref_b = RunRef(str(b.tenant.id), b_run, b_run, "w", claim.generation)
    theirs, mine = DjangoStorage(a.tenant.id), DjangoStorage(b.tenant.id)
    event = SleepEvent(step=0, ts=1, duration_ms=1000, wake_at_ms=1001)

    before = instance(b.tenant, b_run).heartbeat_at
    assert theirs.heartbeat(ref_a) is False
    assert instance(b.tenant, b_run).heartbeat_at == before
    with pytest.raises(FenceLost):
        theirs.append_events(ref_a, [event])
    assert b.stored_history(b_run) == []

    assert mine.heartbeat(ref_b) is True
    mine.append_events(ref_b, [event])
    assert [e.step for e in b.stored_history(b_run)] == [0]


# --- signals, promises, state, locks, children and schedules ------------------------------


def test_a_workflow_cannot_signal_another_tenants_run(envs: Any) -> None:
    """``signal_workflow`` from a workflow of A to B's run answers NOT_FOUND and delivers
    nothing; the same call from a workflow of B wakes the run."""
    a, b = envs
    b.deploy("approval", signal_waiter())
    b_run = b.run("approval")
    a.deploy("pinger", pinger())
    b.deploy("pinger", pinger())

    from_a = a.run("pinger", json.dumps(b_run))
    assert transcript(a, from_a) == [[AbiStatus.NOT_FOUND, ""]]
    with tenant_context(b.tenant.id):
        assert not Signal.objects.filter(instance_id=b_run).exists()
    assert b.run_until_idle() == 0
    assert instance(b.tenant, b_run).status == RunStatus.READY

    from_b = b.run("pinger", json.dumps(b_run))
    assert transcript(b, from_b) == [[0, ""]]
    b.run_until_idle()
    assert transcript(b, b_run) == [[0, '{"name":"go","payload":{"from":"pinger"}}']]


def test_promises_are_settled_only_by_their_tenant(envs: Any) -> None:
    """``settle_promise`` from A (resolve or reject) and ``resolve_promise`` from a workflow
    of A do not find B's promise; B's resolution reaches its run."""
    a, b = envs
    b.deploy("promising", promiser())
    b_run = b.run("promising")
    promise_id = b.describe(b_run)["query_state"]["promise"]

    with pytest.raises(svc.NotFound) as caught:
        svc.settle_promise(a.tenant, promise_id, value={"approved": True})
    assert caught.value.field == "promise_id"
    with pytest.raises(svc.NotFound):
        svc.settle_promise(a.tenant, promise_id, error="no", reject=True)
    a.deploy("resolver", promise_resolver())
    resolver = a.run("resolver", json.dumps(promise_id))
    assert transcript(a, resolver)[0][0] == AbiStatus.NOT_FOUND

    with tenant_context(b.tenant.id):
        row = Promise.objects.get(id=promise_id)
    assert (row.status, row.value) == (Promise.State.PENDING, "")
    assert b.run_until_idle() == 0

    svc.settle_promise(b.tenant, promise_id, value={"approved": True})
    b.run_until_idle()
    assert transcript(b, b_run) == [[0, '{"approved":true}']]


def test_state_with_the_same_scope_and_key_is_separate_per_tenant(envs: Any) -> None:
    """Two tenants' workflows use the same object scope and keys: each tenant has its own
    value and its own counter."""
    a, b = envs
    a.deploy("counter", shared_counter())
    b.deploy("counter", shared_counter())
    first_b = b.run("counter", '"B"')
    first_a = a.run("counter", '"A"')
    second_a = a.run("counter", '"A2"')
    second_b = b.run("counter", '"B2"')
    assert transcript(b, first_b) == [[7, ""], 1]
    assert transcript(a, first_a) == [[7, ""], 1]
    assert transcript(a, second_a) == [[0, '"A"'], 2]
    assert transcript(b, second_b) == [[0, '"B"'], 2]
    for env, owner, count in ((a, '"A2"', "2"), (b, '"B2"', "2")):
        with tenant_context(env.tenant.id):
            rows = dict(
                WorkflowState.objects.filter(
                    tenant_id=env.tenant.id, scope="obj:counter:shared"
                ).values_list("key", "value")
            )
        assert rows == {"owner": owner, "n": count}


def test_locks_with_the_same_key_are_independent_per_tenant(envs: Any) -> None:
    """A's first run holds lock ``L``; A's second run is refused it; B's run takes its own
    ``L`` at the same time."""
    a, b = envs
    a.deploy("locker", lock_holder())
    b.deploy("locker", lock_holder())
    first = a.run("locker")
    second = a.run("locker")
    theirs = b.run("locker")
    with tenant_context(a.tenant.id):
        assert ConcurrencyKey.objects.get(tenant_id=a.tenant.id, key="L").holder == first
    with tenant_context(b.tenant.id):
        assert ConcurrencyKey.objects.get(tenant_id=b.tenant.id, key="L").holder == theirs
    for env, run in ((a, first), (a, second), (b, theirs)):
        env.signal(run, "release")
    a.run_until_idle()
    b.run_until_idle()
    assert transcript(a, first) == [1]
    assert transcript(a, second) == [0]
    assert transcript(b, theirs) == [1]


def test_a_child_definition_is_resolved_within_the_parents_tenant(envs: Any) -> None:
    """A parent in A cannot start ``child`` while only B has deployed it (NOT_FOUND, no run
    created anywhere); once A deploys its own ``child``, that is the one that runs."""
    a, b = envs
    b.deploy("child", note("child of B"))
    a.deploy("parent", parent())
    refused = a.run("parent")
    [[status, message]] = transcript(a, refused)
    assert status == AbiStatus.NOT_FOUND and "child" in message
    with tenant_context(a.tenant.id):
        assert not WorkflowInstance.objects.filter(parent_id=refused).exists()
    with tenant_context(b.tenant.id):
        assert not WorkflowInstance.objects.filter(tenant_id=b.tenant.id).exists()

    a.deploy("child", note("child of A"))
    run = a.run("parent")
    started, awaited = transcript(a, run)
    assert started[0] == AbiStatus.OK
    assert awaited == [0, '["child of A"]']
    child = instance(a.tenant, started[1])
    with tenant_context(a.tenant.id):
        definition = WorkflowDefinition.objects.get(id=child.definition_id)
    assert (child.tenant_id, definition.tenant_id) == (a.tenant.id, a.tenant.id)


def test_schedule_quota_and_listing_are_per_tenant(envs: Any) -> None:
    """Each tenant may hold one schedule: B's schedule does not use A's quota, A's second
    is DENIED, and ``list_crons`` shows a tenant only its own schedules. A schedule for a
    workflow only the other tenant deployed is NOT_FOUND."""
    a, b = envs
    Tenant.objects.filter(id__in=[a.tenant.id, b.tenant.id]).update(schedule_quota=1)
    for env in (a, b):
        env.deploy("scheduler", scheduler())

    missing = a.run("scheduler")
    assert transcript(a, missing)[0][0] == AbiStatus.NOT_FOUND
    b.deploy("target", note("t"))
    from_b = b.run("scheduler")
    a.deploy("target", note("t"))
    from_a = a.run("scheduler")
    again_a = a.run("scheduler")

    (b_status, b_id), b_list = transcript(b, from_b)
    (a_status, a_id), a_list = transcript(a, from_a)
    assert (b_status, a_status) == (AbiStatus.OK, AbiStatus.OK)
    assert [s["id"] for s in json.loads(b_list[1])] == [b_id]
    assert [s["id"] for s in json.loads(a_list[1])] == [a_id]
    (denied, reason), _ = transcript(a, again_a)
    assert denied == AbiStatus.DENIED and "quota" in reason
    for env, schedule_id in ((a, a_id), (b, b_id)):
        with tenant_context(env.tenant.id):
            assert list(
                Schedule.objects.filter(tenant_id=env.tenant.id).values_list("id", flat=True)
            ) == [uuid.UUID(schedule_id)]
