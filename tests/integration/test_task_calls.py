"""Durable calls that run as tasks elsewhere (engine.services.TaskService, e.g. Celery): the
run suspends while the task runs, the reported outcome becomes the call's reply, replay
never sends again; timeouts, cancellation, duplicates and stale outcomes. Each scenario
runs against both environments (in memory, and the Django store with its executor), as
the lifecycle scenarios do."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from engine.services import TaskCall
from engine.status import AbiStatus
from engine.task_calls import Disposition, disposition
from tests.fixtures.wat import Wat
from tests.integration.support.environments import (
    MemoryEnvironment,
    ScenarioEnvironment,
    database_environment,
)


class FakeTasks:
    """A task service that only remembers what it was asked to send and revoke."""

    def __init__(self, timeout_ms: int = 60_000, broken: bool = False) -> None:
        self.timeout_ms = timeout_ms
        self.sent: list[TaskCall] = []
        self.revoked: list[str] = []
        self.broken = broken

    def send_task_call(self, call: TaskCall) -> None:
        if self.broken:
            raise ConnectionError("broker away")
        self.sent.append(call)

    def revoke_task_call(self, task_id: str) -> None:
        self.revoked.append(task_id)


def two_calls() -> bytes:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_call {w.s("billing")} {w.s("charge")} {w.s('{"n":1}')}))
    (call $rec (call $durable_call {w.s("billing")} {w.s("refund")} {w.s('{"n":2}')}))
    (call $finish)"""
    )
    return w.wasm()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def kind(request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Any] = []

    def make(services: dict[str, Any]) -> ScenarioEnvironment:
        if request.param == "memory":
            env: Any = MemoryEnvironment(services)
        else:
            env = database_environment(request.getfixturevalue("tenant"), services)
            made.append(env)
        return env  # type: ignore[no-any-return]

    yield make
    for env in made:
        env.close()


@pytest.fixture
def env_with(kind: Any) -> Any:
    def make(tasks: FakeTasks) -> tuple[Any, str]:
        env = kind({"billing": tasks})
        env.deploy("pay", two_calls())
        run = env.start("pay")
        env.run_until_idle()
        return env, run

    return make


def test_the_run_suspends_on_the_task_and_its_outcome_is_the_reply(env_with: Any) -> None:
    tasks = FakeTasks()
    env, run = env_with(tasks)
    assert len(tasks.sent) == 1
    first = tasks.sent[0]
    assert first.context.operation == "charge" and json.loads(first.request) == {"n": 1}
    described = env.describe(run)
    assert described["status"] == "ready"
    assert described["waiting_on"].startswith(f"task billing.charge (task id {first.task_id})")
    # Nothing happens until the outcome arrives: no resend on a recheck.
    env.advance(seconds=10)
    assert len(tasks.sent) == 1

    assert env.report_task_outcome(first.task_id, first.token, AbiStatus.OK, '{"paid":1}') == (
        "recorded"
    )
    env.run_until_idle()
    assert len(tasks.sent) == 2
    second = tasks.sent[1]
    assert second.context.idempotency_key != first.context.idempotency_key
    env.report_task_outcome(second.task_id, second.token, AbiStatus.PERMANENT, "card declined")
    env.run_until_idle()
    assert env.result(run) == [[0, '{"paid":1}'], [2, "card declined"]]
    assert env.caller.calls == []  # no in-process call was made
    env.advance(seconds=120)  # past the calls' timeouts: nothing is sent or revoked
    assert len(tasks.sent) == 2 and tasks.revoked == []


def test_a_duplicate_outcome_records_nothing_twice_and_a_wrong_token_is_refused(
    env_with: Any,
) -> None:
    tasks = FakeTasks()
    env, run = env_with(tasks)
    call = tasks.sent[0]
    assert env.report_task_outcome(call.task_id, "forged", AbiStatus.OK, "1") == "refused"
    assert env.report_task_outcome(call.task_id, call.token, AbiStatus.OK, "1") == "recorded"
    assert env.report_task_outcome(call.task_id, call.token, AbiStatus.OK, "2") == "duplicate"
    env.run_until_idle()  # settles the first call, sends the second
    assert env.report_task_outcome(call.task_id, call.token, AbiStatus.OK, "3") == "duplicate"
    assert env.describe(run)["waiting_on"].startswith("task billing.refund")


def test_no_outcome_within_the_timeout_is_timeout_and_the_task_is_revoked(env_with: Any) -> None:
    tasks = FakeTasks(timeout_ms=5_000)
    env, run = env_with(tasks)
    call = tasks.sent[0]
    env.advance(seconds=6)
    assert tasks.revoked == [call.task_id]
    # The late outcome of the timed-out call is dropped.
    assert env.report_task_outcome(call.task_id, call.token, AbiStatus.OK, "1") == "stale"
    history = env.history(run)
    assert history[0].status == AbiStatus.TIMEOUT and not history[0].pending


def test_cancelling_the_run_revokes_the_task_and_the_call_returns_cancelled(env_with: Any) -> None:
    tasks = FakeTasks()
    env, run = env_with(tasks)
    call = tasks.sent[0]
    env.cancel(run)
    env.run_until_idle()
    assert tasks.revoked == [call.task_id]
    assert env.history(run)[0].status == AbiStatus.CANCELLED


def test_a_terminated_run_drops_the_outcome_as_stale(env_with: Any) -> None:
    tasks = FakeTasks()
    env, run = env_with(tasks)
    call = tasks.sent[0]
    env.terminate(run)
    assert env.report_task_outcome(call.task_id, call.token, AbiStatus.OK, "1") == "stale"


def test_a_task_that_could_not_be_sent_is_sent_by_a_later_segment(env_with: Any) -> None:
    tasks = FakeTasks(broken=True)
    env, run = env_with(tasks)
    assert tasks.sent == [] and env.describe(run)["status"] == "ready"
    tasks.broken = False
    env.advance(seconds=3)
    assert len(tasks.sent) == 1
    env.advance(seconds=3)
    assert len(tasks.sent) == 1  # sent once it went out


def test_the_disposition_rule() -> None:
    def rule(state: Any, token: bool = True, had: bool = False, ended: bool = False) -> Any:
        return disposition(state, token, had_outcome=had, run_ended=ended)

    assert rule("pending") is Disposition.RECORDED
    assert rule("pending", ended=True) is Disposition.STALE
    assert rule("pending", token=False) is Disposition.REFUSED
    assert rule("reported", had=True) is Disposition.DUPLICATE
    assert rule("settled", had=True) is Disposition.DUPLICATE
    assert rule("settled") is Disposition.STALE
    assert rule("abandoned") is Disposition.STALE
    assert rule(None) is Disposition.STALE


@pytest.mark.django_db(transaction=True)
def test_the_callback_endpoint_records_an_outcome_with_the_calls_token(tenant: Any) -> None:
    """A Celery worker outside the project posts the outcome with the call's token: a
    missing or wrong token is refused, a bad body is a 400 naming the field, a duplicate
    records nothing twice, and the run goes on with the outcome."""
    from django.test import Client

    tasks = FakeTasks()
    env = database_environment(tenant, {"billing": tasks})
    try:
        env.deploy("pay", two_calls())
        run = env.start("pay")
        env.run_until_idle()
        call = tasks.sent[0]
        url = f"/api/v1/task-calls/{tenant.id}/{call.task_id}/outcome"
        client = Client()

        def post(body: Any, token: str | None = call.token) -> Any:
            headers = {"HTTP_X_CLEAT_TASK_TOKEN": token} if token is not None else {}
            return client.post(url, json.dumps(body), content_type="application/json", **headers)

        assert post({"status": "ok", "result": 1}, token=None).status_code == 401
        assert post({"status": "ok", "result": 1}, token="forged").status_code == 403
        bad = post({"status": "maybe"})
        assert bad.status_code == 400 and bad.json()["error"]["field"] == "status"
        assert post({"status": "error"}).json()["error"]["field"] == "error"
        assert post({"status": "ok", "result": {"paid": True}}).json() == {"outcome": "recorded"}
        assert post({"status": "ok", "result": {"paid": False}}).json() == {"outcome": "duplicate"}
        env.run_until_idle()
        second = tasks.sent[1]
        url = f"/api/v1/task-calls/{tenant.id}/{second.task_id}/outcome"
        assert post({"status": "permanent", "error": "no"}, token=second.token).json() == {
            "outcome": "recorded"
        }
        env.run_until_idle()
        assert env.result(run) == [[0, '{"paid":true}'], [2, "no"]]
    finally:
        env.close()
