"""What only the Django store has, end to end through it and the executor: lost fences,
delivery of durable sends, retry from the dead-letter queue, and the finalize's PostgreSQL
fast path against its general path. The scenarios both environments share (retries,
timers, signals, children, continue-as-new, locks, ...) are in test_lifecycle_scenarios.py.
Runs on every database the suite is pointed at (SQLite by default; PostgreSQL as the
RLS-bound application role; MariaDB)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures import FakeService
from tests.fixtures.wat import Ref, Wat
from tests.integration.test_lifecycle_scenarios import (
    call_or_fail,
    call_sleep_call,
    lock_holder,
    signal_waiter,
)
from workflows.models import RunStatus, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def make_env(tenant: Any) -> Iterator[Any]:
    made: list[DatabaseWorkflowEnvironment] = []

    def make(services: dict[str, Any] | None = None) -> DatabaseWorkflowEnvironment:
        env = DatabaseWorkflowEnvironment(tenant, services)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def types(env: DatabaseWorkflowEnvironment, run: str) -> list[str]:
    return [e.TYPE.value for e in env.history(run)]


def test_fence_lost_writes_nothing(make_env: Any) -> None:
    """A segment whose claim was reaped and re-claimed by another worker writes nothing:
    its finalize is fenced out and the new owner's history stands."""
    from datetime import timedelta

    from engine.errors import FenceLost
    from engine.session import RunInfo
    from workflows.executor import get_runtime, get_services
    from workflows.store.lifecycle import (
        claim_ready_instances,
        finalize_segment,
        load_run,
        reap_expired_leases,
    )
    from workflows.store.storage import DjangoStorage

    env = make_env({"pay": FakeService({"charge": 1, "receipt": 2})})
    env.deploy("order", call_sleep_call().wasm())
    run = env.start("order", {})
    [claim] = claim_ready_instances("stalled", ["default"], 1, env.clock.now())
    loaded = load_run(claim, "stalled")
    assert loaded is not None
    # The stalled worker's lease expires and the run is reaped (generation bumped).
    assert reap_expired_leases(timedelta(seconds=0), env.clock.now() + timedelta(seconds=1)) == 1
    info = RunInfo(
        ref=loaded.ref,
        definition="order",
        version=1,
        input="{}",
        start_ms=int(loaded.instance.created_at.timestamp() * 1000),
    )
    module = get_runtime().load(call_sleep_call().wasm())
    with pytest.raises(FenceLost):
        result = get_runtime().run_segment(
            module, info, [], DjangoStorage(claim.tenant_id), get_services()
        )
        finalize_segment(loaded.ref, result)
    assert env.stored_history(run) == []
    assert env.status(run) == RunStatus.READY
    env.advance(seconds=2)  # the reap made it due one second after the reap time
    assert env.describe(run)["events"] == 1


__all__ = ["Ref"]


def test_durable_send_is_delivered_by_the_worker_with_the_steps_key(make_env: Any) -> None:
    """durable_send queues the call with the run; the worker delivers it (at least once) with
    the idempotency key of the step, and a failing delivery is retried later."""
    from workflows.models import Invocation
    from workflows.worker import Worker, WorkerOptions

    answers: list[Any] = [RuntimeError("down"), {"sent": True}]
    mail = FakeService({"send": answers})
    env = make_env({"mail": mail})
    w = Wat()
    send = f"(call $durable_send {w.s('mail')} {w.s('send')} {w.js({'to': 'ada'})})"
    w.run(f"(call $rec {send}) (call $finish)")
    env.deploy("notify", w.wasm())
    run = env.run("notify")
    assert env.result(run) == [[0, ""]]
    Worker(WorkerOptions(worker_id="w1", burst=True, concurrency=1)).run()
    with tenant_context(env.tenant.id):
        [row] = Invocation.objects.all()
    assert (row.status, row.attempts) == ("pending", 1)
    assert "down" in row.last_error
    with tenant_context(env.tenant.id):
        Invocation.objects.filter(id=row.id).update(deliver_at=row.deliver_at.replace(year=2000))
    Worker(WorkerOptions(worker_id="w1", burst=True, concurrency=1)).run()
    with tenant_context(env.tenant.id):
        row.refresh_from_db()
    assert (row.status, row.attempts) == ("delivered", 2)
    assert [c.operation for c in mail.calls] == ["send", "send"]
    assert len({c.idempotency_key for c in mail.calls}) == 1
    assert mail.calls[0].idempotency_key == row.idempotency_key


def test_retry_from_the_dead_letter_queue_makes_the_failed_call_again(make_env: Any) -> None:
    from workflows import services as svc
    from workflows.models import WorkflowDefinition

    flaky = FakeService({"go": [RuntimeError("down"), {"ok": True}]})
    env = make_env({"flaky": flaky})
    env.deploy("flaky", call_or_fail().wasm())
    with tenant_context(env.tenant.id):
        WorkflowDefinition.objects.filter(name="flaky").update(retry_max_attempts=1)
    run = env.run("flaky")
    assert env.describe(run)["status"] == "dead_lettered"
    assert env.describe(run)["events"] == 1  # kept for the operator to see
    svc.retry_workflow(env.tenant, run, operator="ops", reason="service is back")
    env.run_until_idle()
    assert env.result(run) == [[0, '{"ok":true}']]
    assert flaky.ops() == ["go", "go"]
    assert [e.TYPE.value for e in env.history(run)] == ["admin_action", "call"]


def test_a_retry_from_the_dead_letter_queue_takes_the_runs_locks_again(make_env: Any) -> None:
    """The run's end released its lock; its replay answers ``acquire_lock`` from the history,
    so the retry must hold the lock again before the run replays, or refuse while another
    workflow has it (nothing changes then)."""
    from workflows import services as svc
    from workflows.models import ConcurrencyKey, WorkflowDefinition

    env = make_env()
    env.deploy("holder", lock_holder("fails retryably").wasm())
    with tenant_context(env.tenant.id):
        WorkflowDefinition.objects.filter(name="holder").update(retry_max_attempts=1)
    run = env.run("holder")
    env.signal(run, "go")
    env.run_until_idle()
    assert env.describe(run)["status"] == "dead_lettered"

    def locks() -> dict[str, str]:
        with tenant_context(env.tenant.id):
            return dict(ConcurrencyKey.objects.values_list("key", "holder"))

    assert locks() == {}
    with tenant_context(env.tenant.id):
        ConcurrencyKey.objects.create(tenant=env.tenant, key="k", holder="someone-else")
    with pytest.raises(svc.Conflict, match=r"lock .k.*held by workflow someone-else"):
        svc.retry_workflow(env.tenant, run, operator="ops")
    assert env.describe(run)["status"] == "dead_lettered"
    assert locks() == {"k": "someone-else"}

    with tenant_context(env.tenant.id):
        ConcurrencyKey.objects.all().delete()
    svc.retry_workflow(env.tenant, run, operator="ops")
    assert env.describe(run)["status"] == "ready"
    assert locks() == {"k": run}
    env.run_until_idle()  # it replays holding the lock, fails again, and its end releases it
    assert env.describe(run)["status"] == "dead_lettered"
    assert locks() == {}


# --- the finalize's fast path and its fallbacks ------------------------------------------------
# On PostgreSQL a plain completion is finalized in one statement; anything it does not cover
# (an open child, a lost fence) must take the general path. These run on every database.


def segment_by_hand(env: DatabaseWorkflowEnvironment, wasm: bytes, worker_id: str) -> Any:
    """Claim the due run and execute its segment, without finalizing: (loaded, result)."""

    from engine.session import RunInfo
    from workflows.executor import get_runtime, get_services
    from workflows.store.lifecycle import claim_ready_instances, load_run
    from workflows.store.storage import DjangoStorage

    [claim] = claim_ready_instances(worker_id, ["default"], 1, env.clock.now())
    loaded = load_run(claim, worker_id)
    assert loaded is not None
    instance = loaded.instance
    info = RunInfo(
        ref=loaded.ref,
        definition=instance.definition_name,
        version=instance.definition_version,
        input=instance.input,
        start_ms=int(instance.created_at.timestamp() * 1000),
    )
    result = get_runtime().run_segment(
        get_runtime().load(wasm),
        info,
        loaded.history,
        DjangoStorage(claim.tenant_id),
        get_services(),
    )
    return loaded, result


def test_a_completing_parent_closes_its_open_child(make_env: Any) -> None:
    """A parent that completes while its child still waits terminates the child (its
    parent-close policy): the one-statement completion must not skip that."""
    parent = Wat()
    parent.run(f"(drop (call $child_workflow {parent.s('waiter')} {parent.js({})})) (call $finish)")
    env = make_env()
    env.deploy("parent", parent.wasm())
    env.deploy("waiter", signal_waiter().wasm())
    run = env.run("parent")
    assert env.result(run) == []
    with tenant_context(env.tenant.id):
        child = WorkflowInstance.objects.get(parent_id=run)
    assert (child.status, child.error_code) == (RunStatus.TERMINATED, "terminated")
    assert child.generation == 1  # fenced by the close; never claimed


def test_an_update_still_pending_when_the_run_completes_is_failed(make_env: Any) -> None:
    """An update that arrives while the last segment runs (the run has no handler left to
    answer it) is failed by the finalize, with the run's final status."""
    from workflows.models import UpdateRequest
    from workflows.store.lifecycle import finalize_segment

    w = Wat()
    w.run(
        f"(call $rec (call $durable_call {w.s('pay')} {w.s('charge')} {w.input()})) (call $finish)"
    )
    env = make_env({"pay": FakeService({"charge": {"ok": 1}})})
    env.deploy("pay", w.wasm())
    run = env.start("pay", {"amount": 5})
    loaded, result = segment_by_hand(env, w.wasm(), "w-update")
    update_id = env.update(run, "bump", {"by": 1})
    finalize_segment(loaded.ref, result)
    assert env.result(run) == [[0, '{"ok":1}']]
    assert env.describe(run)["events"] == 1
    with tenant_context(env.tenant.id):
        update = UpdateRequest.objects.get(id=update_id)
    assert update.status == "failed"
    assert update.result == "the run ended (done) before answering"
    assert update.completed_at is not None


def test_a_completion_whose_claim_moved_on_writes_nothing(make_env: Any) -> None:
    """A segment that completed after its lease was reaped and the run claimed again -- by a
    worker with the same id, so only the generation tells them apart -- is fenced out at the
    finalize: the new claim stands, without a result."""
    from datetime import timedelta

    from engine.errors import FenceLost
    from workflows.store.lifecycle import (
        claim_ready_instances,
        finalize_segment,
        reap_expired_leases,
    )

    w = Wat()
    w.run("(call $finish)")
    env = make_env()
    env.deploy("quick", w.wasm())
    run = env.start("quick", {})
    loaded, result = segment_by_hand(env, w.wasm(), "stalled")
    later = env.clock.now() + timedelta(seconds=1)
    assert reap_expired_leases(timedelta(seconds=0), later) == 1
    [again] = claim_ready_instances("stalled", ["default"], 1, later)
    assert again.generation == loaded.claim.generation + 2
    with pytest.raises(FenceLost):
        finalize_segment(loaded.ref, result)
    info = env.describe(run)
    assert (info["status"], info["result"], info["events"]) == (RunStatus.RUNNING, None, 0)


def test_the_one_message_completion_releases_the_workflows_locks(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that takes a lock and completes in one plain segment gives the lock back; on
    PostgreSQL that completion is the one-message fast path, elsewhere the general path."""
    from django.db import connection

    from workflows.models import ConcurrencyKey
    from workflows.store import lifecycle

    taken: list[bool] = []
    fast = lifecycle._complete_in_one_message

    def spy(*args: Any) -> bool:
        taken.append(fast(*args))
        return taken[-1]

    monkeypatch.setattr(lifecycle, "_complete_in_one_message", spy)
    w = Wat()
    w.run(f"(call $recn (call $acquire_lock {w.s('k')} (i64.const 0))) (call $finish)")
    env = make_env()
    env.deploy("locker", w.wasm())
    with tenant_context(env.tenant.id):
        ConcurrencyKey.objects.create(tenant=env.tenant, key="other", holder="someone else")
    run = env.run("locker")
    assert env.result(run) == [1]
    assert taken == [connection.vendor == "postgresql"]
    with tenant_context(env.tenant.id):
        assert list(ConcurrencyKey.objects.values_list("key", "holder")) == [
            ("other", "someone else")
        ]


@pytest.mark.postgres_only
def test_postgres_runs_a_plain_segment_in_three_messages_with_the_general_paths_outcome(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim with the load (one message), the first call's event before the second call
    goes out (one message), the completion with the second call's event (one message); the
    rows it leaves are those the general path (a transaction per part) leaves."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workflows.store import lifecycle

    w = Wat()
    w.run(
        f"""
    (drop (call $set_query_state {w.s("stage")} {w.js("paid")}))
    (call $rec (call $durable_call {w.s("pay")} {w.s("charge")} {w.input()}))
    (call $rec (call $durable_call {w.s("pay")} {w.s("receipt")} {w.input()}))
    (call $finish)"""
    )
    env = make_env(
        {"pay": FakeService({"charge": lambda r: {"charged": r}, "receipt": lambda r: {}})}
    )
    env.deploy("pay", w.wasm())
    fast = env.start("pay", {"amount": 5})
    with CaptureQueriesContext(connection) as queries:
        assert env.step()
    assert len(queries) == 3, [q["sql"][:80] for q in queries]
    assert "load_claimed_histories" in queries[0]["sql"]
    assert "append_events" in queries[1]["sql"]
    assert "finalize_done" in queries[2]["sql"]

    monkeypatch.setattr(lifecycle, "_claim_and_load", lambda *a: None)
    monkeypatch.setattr(lifecycle, "_load_in_one_message", lambda *a: (False, None))
    monkeypatch.setattr(lifecycle, "_complete_in_one_message", lambda *a: False)
    slow = env.start("pay", {"amount": 5})
    with CaptureQueriesContext(connection) as queries:
        assert env.step()
    assert len(queries) > 4

    columns = [
        "status",
        "result",
        "error",
        "error_code",
        "event_count",
        "query_state",
        "assigned_to",
        "waiting_on",
        "next_wake_at",
        "attempt",
        "generation",
        "cancel_requested",
    ]
    with tenant_context(env.tenant.id):
        rows = {
            r.id: r for r in WorkflowInstance.objects.filter(id__in=[fast, slow]).order_by("id")
        }
    a, b = rows[uuid_of(fast)], rows[uuid_of(slow)]
    assert {c: getattr(a, c) for c in columns} == {c: getattr(b, c) for c in columns}
    assert a.status == RunStatus.DONE and a.query_state == {"stage": '"paid"'}
    for r in (a, b):
        assert r.completed_at and r.heartbeat_at and r.updated_at >= r.completed_at
    strip = [(e.step, e.type_code, e.payload) for e in env.stored_history(fast)]
    assert strip == [(e.step, e.type_code, e.payload) for e in env.stored_history(slow)]


def uuid_of(run: str) -> Any:
    import uuid

    return uuid.UUID(run)


@pytest.mark.postgres_only
def test_postgres_load_in_one_message_reads_what_the_orm_reads(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-message load returns the same instance (every column, JSON fields decoded),
    definition and history as the ORM's; a claim that moved on loads nothing."""

    from workflows.store import lifecycle

    pay = FakeService({"charge": {"ok": 1}, "receipt": lambda r: {"echo": r}})
    env = make_env({"pay": pay})
    env.deploy("order", call_sleep_call().wasm())
    run = env.start("order", {"amount": 5})
    env.run_until_idle()  # the call and the sleep are recorded; the run waits
    with tenant_context(env.tenant.id):
        WorkflowInstance.objects.filter(id=run).update(
            allowed_signals=["go", "stop"], query_state={"k": "v"}, next_wake_at=env.clock.now()
        )
    [claim] = lifecycle.claim_ready_instances("cmp", ["default"], 1, env.clock.now())
    done, quick = lifecycle._load_in_one_message(claim, "cmp")
    assert done and quick is not None
    monkeypatch.setattr(lifecycle, "_load_in_one_message", lambda *a: (False, None))
    orm = lifecycle.load_run(claim, "cmp")
    assert orm is not None
    fields = [f.attname for f in WorkflowInstance._meta.concrete_fields]
    assert {f: getattr(quick.instance, f) for f in fields} == {
        f: getattr(orm.instance, f) for f in fields
    }
    assert quick.instance.allowed_signals == ["go", "stop"]
    assert quick.instance.waiting_on["kind"] == orm.instance.waiting_on["kind"]
    assert (quick.definition_id, quick.sha256, quick.max_history_length) == (
        orm.definition_id,
        orm.sha256,
        orm.max_history_length,
    )
    assert quick.history == orm.history and len(quick.history) == 1
    monkeypatch.undo()
    moved_on = lifecycle.Claim(claim.id, claim.tenant_id, claim.generation + 1)
    assert lifecycle._load_in_one_message(moved_on, "cmp") == (True, None)


@pytest.mark.postgres_only
def test_postgres_claim_brings_when_the_next_run_it_left_falls_due(make_env: Any) -> None:
    """A claim that took fewer runs than it could reads, in its own message, what
    next_due_at would answer after it (the worker's sleep then asks nothing); a full claim
    does not ask (the loop claims again at once)."""
    from datetime import timedelta

    from workflows.store import lifecycle

    env = make_env({"pay": FakeService({"charge": {"ok": 1}})})
    env.deploy("pay", call_sleep_call().wasm())
    now = env.clock.now()
    later = env.start("pay", {"amount": 1})
    first, second = env.start("pay", {"amount": 2}), env.start("pay", {"amount": 3})
    with tenant_context(env.tenant.id):
        WorkflowInstance.objects.filter(id=later).update(next_wake_at=now + timedelta(hours=1))
        WorkflowInstance.objects.filter(id__in=[first, second]).update(next_wake_at=now)

    full = lifecycle.claim_ready_instances("w", ["default"], 1, now, load=True)
    assert len(full) == 1 and not full.next_due_known
    rest = lifecycle.claim_ready_instances("w", ["default"], 5, now, load=True)
    assert len(rest) == 1
    assert rest.next_due_known and rest.next_due == now + timedelta(hours=1)
    assert rest.next_due == lifecycle.next_due_at(["default"])
    empty = lifecycle.claim_ready_instances("w", ["other"], 5, now, load=True)
    assert empty == [] and empty.next_due_known and empty.next_due is None
    assert {str(c.id) for c in [*full, *rest]} == {first, second}


def test_next_due_at_answers_for_the_queues_and_the_tenant_asked(
    make_env: Any, other_tenant: Any
) -> None:
    """When the next ready run falls due: the earliest of every tenant's in the queues asked,
    or of one tenant's only; a run of another queue, a running or finished run, and a queue
    with no ready run do not count (None)."""
    from datetime import timedelta

    from workflows.store import lifecycle

    pay = FakeService({"charge": {"ok": 1}})
    env = make_env({"pay": pay})
    other = DatabaseWorkflowEnvironment(other_tenant, {"pay": pay})
    try:
        now = env.clock.now()
        due: dict[str, Any] = {}
        for e, minutes in ((env, 30), (other, 10)):
            e.deploy("pay", call_sleep_call().wasm())
            run, elsewhere, running = (e.start("pay", {"amount": n}) for n in range(3))
            with tenant_context(e.tenant.id):
                rows = WorkflowInstance.objects.filter
                rows(id=run).update(next_wake_at=now + timedelta(minutes=minutes))
                rows(id=elsewhere).update(task_queue="elsewhere", next_wake_at=now)
                rows(id=running).update(status=RunStatus.RUNNING, next_wake_at=now)
            due[e.tenant.id] = now + timedelta(minutes=minutes)
        assert lifecycle.next_due_at(["default"]) == due[other.tenant.id]
        assert lifecycle.next_due_at(["default"], env.tenant.id) == due[env.tenant.id]
        assert lifecycle.next_due_at(["default"], other.tenant.id) == due[other.tenant.id]
        assert lifecycle.next_due_at(["elsewhere", "default"], env.tenant.id) == now
        assert lifecycle.next_due_at(["nothing"]) is None
        assert lifecycle.next_due_at(["nothing"], env.tenant.id) is None
    finally:
        other.close()


@pytest.mark.postgres_only
def test_postgres_claim_commits_without_waiting_for_its_wal_and_nothing_after_it_does(
    make_env: Any,
) -> None:
    """The claim's message commits asynchronously: right after it, the server's WAL is
    written past what it flushed (a synchronous commit returns only once its WAL is
    flushed). The setting is the transaction's own: the finalize after it, and a claim that
    took nothing, wait for their flush as every other commit does."""
    from django.db import connection

    from workflows.store import lifecycle

    env = make_env({"pay": FakeService({"charge": {"ok": 1}})})
    env.deploy("pay", call_sleep_call().wasm())
    now = env.clock.now()
    runs = [env.start("pay", {"amount": n}) for n in range(12)]
    with tenant_context(env.tenant.id):
        WorkflowInstance.objects.filter(id__in=runs).update(next_wake_at=now)

    def unflushed() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()")
            return bool(cursor.fetchone()[0])

    claimed, after_claims = [], 0
    for _ in runs:
        claims = lifecycle.claim_ready_instances("w", ["default"], 1, now, load=True)
        claimed += claims
        after_claims += unflushed()
    assert {str(c.id) for c in claimed} == set(runs)
    # The WAL writer flushes on its own every wal_writer_delay (200 ms): a claim it happened
    # to follow at once is flushed already; most are not.
    assert after_claims >= len(runs) // 2, after_claims
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"

    after_others = 0
    for claim in claimed:
        with tenant_context(env.tenant.id):
            WorkflowInstance.objects.filter(id=claim.id).update(heartbeat_at=now)
        after_others += unflushed()
        assert lifecycle.claim_ready_instances("w", ["default"], 1, now, load=True) == []
        after_others += unflushed()
    assert after_others <= 2, after_others  # only another backend's WAL could show here


@pytest.mark.postgres_only
def test_postgres_a_loads_columns_are_read_by_name_and_a_missing_one_is_named() -> None:
    """A load's first statement brings the run's row whole, in the table's column order:
    it is read in the model's order by the columns' names, whatever order they come in; a
    column the result lacks (a table that disagrees with the model) is an error naming it."""
    from django.db import DatabaseError, connection

    from workflows.store import lifecycle

    names = [name.decode() for name in lifecycle._LOADED_NAMES]
    backwards = ", ".join(f'{i} AS "{name}"' for i, name in reversed(list(enumerate(names))))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {backwards} UNION ALL SELECT {backwards}")
        rows = lifecycle._in_model_order(cursor, cursor.fetchall())
        assert rows == [tuple(range(len(names)))] * 2
        cursor.execute('SELECT 1 AS "id", 2 AS "sha256"')
        with pytest.raises(DatabaseError, match="no column tenant_id, workflow_id"):
            lifecycle._in_model_order(cursor, cursor.fetchall())


@pytest.mark.postgres_only
def test_postgres_claim_with_its_loads_reads_what_each_load_reads(
    make_env: Any, other_tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's message brings every claimed run's load, across tenants (each read as its
    own tenant, under RLS): the same instance, definition, history and interrupts as the
    run's own one-message load. A preload older than PRELOAD_FRESH_S is read again. The
    functions read only the runs the claim named, each as the tenant named with it, and put
    the caller's tenant setting back."""
    import dataclasses
    import json

    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from workflows.store import lifecycle
    from workflows.tenancy import TENANT_SETTING

    pay = FakeService({"charge": {"ok": 1}, "receipt": lambda r: {"echo": r}})
    env = make_env({"pay": pay})
    other = DatabaseWorkflowEnvironment(other_tenant, {"pay": pay})
    try:
        runs = {}
        for e in (env, other):
            e.deploy("order", call_sleep_call().wasm())
            for amount in (5, 6):
                runs[e.start("order", {"amount": amount})] = e
            e.run_until_idle()  # the call and the sleep are recorded; the runs wait
        waiting = next(r for r, e in runs.items() if e is env)
        update = env.update(waiting, "bump", {"by": 1})
        env.cancel(waiting, "enough")
        for e in (env, other):
            with tenant_context(e.tenant.id):
                WorkflowInstance.objects.filter(id__in=list(runs)).update(
                    query_state={"k": "v"}, next_wake_at=env.clock.now()
                )
        claims = lifecycle.claim_ready_instances("cmp", ["default"], 10, env.clock.now(), load=True)
        assert sorted(str(c.id) for c in claims) == sorted(runs)
        for claim in claims:
            assert claim.preloaded is not None and claim.preloaded.row is not None
            with CaptureQueriesContext(connection) as statements:
                pre = lifecycle.load_run(claim, "cmp")
            assert len(statements) == 0 and pre is not None
            done, own = lifecycle._load_in_one_message(
                dataclasses.replace(claim, preloaded=None), "cmp"
            )
            assert done and own is not None
            fields = [f.attname for f in WorkflowInstance._meta.concrete_fields]
            assert {f: getattr(pre.instance, f) for f in fields} == {
                f: getattr(own.instance, f) for f in fields
            }
            assert pre.instance.tenant_id == runs[str(claim.id)].tenant.id
            assert (pre.sha256, pre.max_history_length, pre.min_version) == (
                own.sha256,
                own.max_history_length,
                own.min_version,
            )
            assert pre.history == own.history and len(pre.history) == 1
            assert pre.interrupts is not None and own.interrupts is not None
            assert pre.interrupts.rows == own.interrupts.rows
        [cancelled] = [c for c in claims if str(c.id) == waiting]
        assert cancelled.preloaded is not None
        assert cancelled.preloaded.interrupts == [
            (True, "enough", uuid_of(update), "bump", '{"by":1}')
        ]

        monkeypatch.setattr(lifecycle, "PRELOAD_FRESH_S", -1.0)
        with CaptureQueriesContext(connection) as statements:
            assert lifecycle.load_run(claims[0], "cmp") is not None
        assert len(statements) == 1  # too old: its own load

        mine = next(c for c in claims if runs[str(c.id)] is other)
        named = [{"id": str(mine.id), "tenant": str(env.tenant.id), "generation": mine.generation}]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, %s, true)", [TENANT_SETTING, "caller"])
            cursor.execute("SELECT count(*) FROM cleat.load_claimed_instances('cmp')")
            assert cursor.fetchone()[0] == 0  # nothing claimed in this transaction
            cursor.execute("SELECT set_config('cleat.claimed', %s, true)", [json.dumps(named)])
            for function in ("load_claimed_instances('cmp')", "load_claimed_histories('cmp')"):
                cursor.execute(f"SELECT count(*) FROM cleat.{function}")
                assert cursor.fetchone()[0] == 0  # another tenant's run, named as this one's
            named[0]["tenant"] = str(other.tenant.id)
            cursor.execute("SELECT set_config('cleat.claimed', %s, true)", [json.dumps(named)])
            cursor.execute("SELECT count(*) FROM cleat.load_claimed_histories('cmp')")
            assert cursor.fetchone()[0] == 1
            cursor.execute("SELECT count(*) FROM cleat.load_claimed_histories('someone')")
            assert cursor.fetchone()[0] == 0  # fenced: another worker's claim
            cursor.execute("SELECT current_setting(%s)", [TENANT_SETTING])
            assert cursor.fetchone()[0] == "caller"
    finally:
        other.close()


@pytest.mark.postgres_only
def test_postgres_blocking_read_in_one_call_reads_what_the_orm_reads(make_env: Any) -> None:
    """``cleat.run_interrupts`` returns the cancellation and the pending updates (oldest
    first, payloads opened) that the two ORM reads return; ``exclude`` leaves applied ones
    out; a run that is gone reads as nothing; and the function puts the caller's tenant
    setting back."""
    from django.db import connection, transaction

    from engine.storage import Interrupts, RunRef
    from workflows.store.storage import DjangoStorage
    from workflows.tenancy import TENANT_SETTING

    env = make_env()
    w = Wat()
    w.run("(call $recn (call $durable_sleep (i64.const 60000))) (call $finish)")
    env.deploy("sleeper", w.wasm())
    run = env.start("sleeper")
    first, second = env.update(run, "bump", {"by": 1}), env.update(run, "bump", {"by": 2})
    env.cancel(run, "no longer needed")
    storage = DjangoStorage(env.tenant.id)
    ref = RunRef(str(env.tenant.id), "", run, "reader", 0)

    quick = storage.interrupts(ref, set())
    with transaction.atomic():  # inside a transaction: the ORM's two reads
        slow = storage.interrupts(ref, set())
    assert quick == slow
    assert quick.cancellation == "no longer needed"
    assert [(u.update_id, u.payload) for u in quick.updates] == [
        (first, '{"by":1}'),
        (second, '{"by":2}'),
    ]
    assert [u.update_id for u in storage.interrupts(ref, {first}).updates] == [second]
    gone = RunRef(str(env.tenant.id), "", str(uuid_of("0" * 32)), "reader", 0)
    assert storage.interrupts(gone, set()) == Interrupts(None, [])

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, %s, true)", [TENANT_SETTING, "caller"])
        cursor.execute("SELECT count(*) FROM cleat.run_interrupts(%s, %s)", [ref.tenant_id, run])
        assert cursor.fetchone()[0] == 2
        cursor.execute("SELECT current_setting(%s)", [TENANT_SETTING])
        assert cursor.fetchone()[0] == "caller"


@pytest.mark.postgres_only
def test_postgres_first_blocking_call_takes_the_interrupts_read_with_the_load(
    make_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's message brings the run's interrupts: the storage's first blocking read
    takes them without a statement, the next one reads again, and a load older than
    PREFETCH_FRESH_S is read again too. A cancellation requested after the load is not lost:
    the first segment's sleep does not see it and suspends, the finalize finds it and wakes
    the run, and the next segment's sleep returns CANCELLED."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from engine.events import SideEffectEvent
    from workflows import executor
    from workflows.store import lifecycle, storage
    from workflows.store.storage import DjangoStorage

    env = make_env()
    w = Wat()
    w.run("(call $recn (call $durable_sleep (i64.const 60000))) (call $finish)")
    env.deploy("sleeper", w.wasm())

    run = env.start("sleeper")
    first = env.update(run, "bump", {"by": 1})
    [claim] = lifecycle.claim_ready_instances("cmp", ["default"], 1, env.clock.now())
    loaded = lifecycle.load_run(claim, "cmp")
    assert loaded is not None and loaded.interrupts is not None
    second = env.update(run, "bump", {"by": 2})  # after the load
    reader = DjangoStorage(env.tenant.id, interrupts=loaded.interrupts)
    with CaptureQueriesContext(connection) as statements:
        taken = reader.interrupts(loaded.ref, set())
    assert [u.update_id for u in taken.updates] == [first] and len(statements) == 0
    assert [u.update_id for u in reader.interrupts(loaded.ref, set()).updates] == [first, second]
    reader = DjangoStorage(env.tenant.id, interrupts=loaded.interrupts)
    monkeypatch.setattr(storage, "PREFETCH_FRESH_S", 0.0)
    assert len(reader.interrupts(loaded.ref, set()).updates) == 2  # too old: read again
    monkeypatch.undo()
    writer = DjangoStorage(env.tenant.id, interrupts=loaded.interrupts)
    writer.append_events(loaded.ref, [SideEffectEvent(step=0, ts=1, value="1")])
    with CaptureQueriesContext(connection) as statements:
        after_write = writer.interrupts(loaded.ref, set())
    assert len(after_write.updates) == 2 and len(statements) == 1  # a write: read again
    lifecycle.release(loaded.ref)
    env.terminate(run)

    late = env.start("sleeper")
    load = executor.load_run
    interrupts = DjangoStorage.interrupts
    loads: list[str] = []
    seen: list[str | None] = []

    def load_then_cancel(claim: Any, worker_id: str) -> Any:
        found = load(claim, worker_id)
        loads.append(str(claim.id))
        if loads == [late]:
            env.cancel(late, "too late for the load")
        return found

    def watched(self: DjangoStorage, ref: Any, exclude: Any) -> Any:
        found = interrupts(self, ref, exclude)
        seen.append(found.cancellation)
        return found

    monkeypatch.setattr(executor, "load_run", load_then_cancel)
    monkeypatch.setattr(DjangoStorage, "interrupts", watched)
    monkeypatch.setattr(storage, "PREFETCH_FRESH_S", 60.0)  # a slow machine keeps the rows
    env.run_until_idle()
    assert loads == [late, late]
    assert seen == [None, "too late for the load"]  # the load's view, then the next load's
    assert env.result(late) == [5]
