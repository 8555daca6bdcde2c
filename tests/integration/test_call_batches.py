"""Several durable calls at once (the ABI v1 extension ``durable_call_many``): the calls are
in flight together, recorded one call event each in the given order, answered from the
history on replay, made again after a crash only where their events were not written yet
(same idempotency keys), kept by the finalize when the write before the next call fails, and
each call has its own outcome. Calls that need the single-call rules (task calls,
write-ahead calls) are made one at a time in their place. Each scenario runs against both
environments (in memory, and the Django store with its executor)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.determinism import idempotency_key
from engine.errors import PermanentError
from engine.events import CallEvent
from engine.status import AbiStatus
from tests.fixtures import FakeService
from tests.fixtures.wat import Wat
from tests.integration.support.environments import MemoryEnvironment, database_environment
from tests.integration.test_task_calls import FakeTasks

# A call that waits for its partners gives up after this long: a test whose calls were not
# in flight together fails with BrokenBarrierError instead of hanging.
MEET_TIMEOUT_S = 20


def batch_module() -> bytes:
    """``run`` passes its input (the requests) to durable_call_many and returns the answer."""
    w = Wat()
    w.run(f"(call $rec (call $durable_call_many {w.input()}))\n(call $finish)")
    return w.wasm()


def requests(*calls: tuple[str, str, Any]) -> list[dict[str, str]]:
    return [
        {"service": s, "operation": o, "request": json.dumps(r, separators=(",", ":"))}
        for s, o, r in calls
    ]


def answers(env: Any, run: str) -> list[list[Any]]:
    """The batch's answers as [status, payload] pairs."""
    [[status, payload]] = env.result(run)
    assert status == AbiStatus.OK
    return [[a["status"], a["payload"]] for a in json.loads(payload)]


def calls_of(env: Any, run: str) -> list[tuple[int, str, str]]:
    return [(e.step, e.operation, e.request) for e in env.history(run) if isinstance(e, CallEvent)]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def kind(request: pytest.FixtureRequest) -> Iterator[Any]:
    def make(services: dict[str, Any], config: EngineConfig | None = None) -> Any:
        if request.param == "memory":
            env: Any = MemoryEnvironment(services, config=config)
        else:
            if config is not None:
                from engine.runtime import WasmRuntime
                from workflows import executor

                runtime = WasmRuntime(config)
                runtimes.append(runtime)
                request.getfixturevalue("monkeypatch").setattr(executor, "_runtime", runtime)
            env = database_environment(request.getfixturevalue("tenant"), services)
        made.append(env)
        env.deploy("batch", batch_module())
        return env

    made: list[Any] = []
    runtimes: list[Any] = []
    yield make
    for env in made:
        if getattr(env, "kind", "") == "database":
            env.close()
        else:
            env.runtime.close()
    for runtime in runtimes:
        runtime.close()


def replays_quietly(env: Any, run: str, fakes: list[FakeService]) -> None:
    """Replay the finished run from its whole history: the same result, no service call,
    no new call event."""
    result, calls = env.result(run), calls_of(env, run)
    before = [len(f.calls) for f in fakes]
    if getattr(env, "kind", "") == "database":
        from workflows import services as svc

        svc.re_replay(env.tenant, run, None, "test")
        env.run_until_idle()
    else:
        env.assert_replays(run)
    assert env.result(run) == result
    assert calls_of(env, run) == calls  # (re_replay adds an annotation of its own)
    assert [len(f.calls) for f in fakes] == before, "replay called a service"


def test_the_calls_are_in_flight_together(kind: Any) -> None:
    """Each call waits on a barrier of three parties: it can only pass when all three are
    in flight at once. Replaying the run answers them from the history."""
    barrier = threading.Barrier(3, timeout=MEET_TIMEOUT_S)

    def meet(request: Any) -> Any:
        barrier.wait()
        return {"met": request["n"]}

    shop = FakeService({"meet": meet})
    env = kind({"shop": shop})
    run = env.run("batch", requests(*(("shop", "meet", {"n": n}) for n in range(3))))

    assert answers(env, run) == [[0, f'{{"met":{n}}}'] for n in range(3)]
    assert sorted(c.step for c in shop.calls) == [0, 1, 2]
    replays_quietly(env, run, [shop])


def test_events_are_recorded_in_request_order_whatever_finishes_first(kind: Any) -> None:
    """The last call answers first and the first one last; the history still holds the
    calls at steps 0, 1, 2 in the order given, each with its own step's idempotency key."""
    second_done, third_done = threading.Event(), threading.Event()
    answered: list[str] = []

    def first(request: Any) -> Any:
        assert second_done.wait(MEET_TIMEOUT_S), "the second call never finished"
        answered.append("first")
        return "first"

    def second(request: Any) -> Any:
        assert third_done.wait(MEET_TIMEOUT_S), "the third call never finished"
        answered.append("second")
        second_done.set()
        return "second"

    def third(request: Any) -> Any:
        answered.append("third")
        third_done.set()
        return "third"

    shop = FakeService({"first": first, "second": second, "third": third})
    env = kind({"shop": shop})
    run = env.run(
        "batch", requests(("shop", "first", 1), ("shop", "second", 2), ("shop", "third", 3))
    )

    assert answers(env, run) == [[0, '"first"'], [0, '"second"'], [0, '"third"']]
    assert answered == ["third", "second", "first"]
    assert calls_of(env, run) == [(0, "first", "1"), (1, "second", "2"), (2, "third", "3")]
    keys = {c.operation: c.idempotency_key for c in shop.calls}
    assert keys == {
        op: idempotency_key(run, run, step) for step, op in enumerate(("first", "second", "third"))
    }


def test_each_call_has_its_own_outcome(kind: Any) -> None:
    """One PERMANENT and one ERROR among OKs: every call is made and answered in its place;
    an unknown service is PERMANENT for that call only."""
    shop = FakeService(
        {"ok": {"fine": True}, "refuse": PermanentError("out of stock"), "boom": OSError("503")}
    )
    env = kind({"shop": shop})
    run = env.run(
        "batch",
        requests(
            ("shop", "ok", 1),
            ("shop", "refuse", 2),
            ("shop", "ok", 3),
            ("shop", "boom", 4),
            ("nowhere", "op", 5),
        ),
    )

    got = answers(env, run)
    assert got[:4] == [
        [0, '{"fine":true}'],
        [2, "out of stock"],
        [0, '{"fine":true}'],
        [1, "OSError: 503"],
    ]
    assert got[4][0] == AbiStatus.PERMANENT and "unknown service 'nowhere'" in got[4][1]
    assert [e.status for e in env.history(run) if isinstance(e, CallEvent)] == [0, 2, 0, 1, 2]
    replays_quietly(env, run, [shop])


def test_a_failed_write_after_a_batch_loses_none_of_its_calls(
    kind: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call, a batch of two, a call. The first call is written before the batch goes out;
    the batch's events are written before the last call goes out, and that write fails (the
    database is gone for it): the last call is not made, and the segment's failure is
    finalized with the batch's events, so the retry answers the first three calls from the
    history and makes only the last, at its step and with its idempotency key."""
    shop = FakeService({"pay": lambda request: {"paid": request["n"]}})
    env = kind({"shop": shop})
    w = Wat()
    w.run(
        f"""(call $rec (call $durable_call {w.s("shop")} {w.s("pay")} {w.js({"n": 0})}))
        (call $rec (call $durable_call_many {w.input()}))
        (call $rec (call $durable_call {w.s("shop")} {w.s("pay")} {w.js({"n": 3})}))
        (call $finish)"""
    )
    env.deploy("around", w.wasm())
    storage_class = (
        __import__("workflows.store.storage", fromlist=["DjangoStorage"]).DjangoStorage
        if getattr(env, "kind", "") == "database"
        else type(env.storage)
    )
    appends: list[list[int]] = []
    original = storage_class.append_events

    def fails_at_the_second_append(self: Any, run_ref: Any, events: Any) -> None:
        appends.append([e.step for e in events])
        if len(appends) == 2:
            raise ConnectionError("the worker lost its database")
        original(self, run_ref, events)

    monkeypatch.setattr(storage_class, "append_events", fails_at_the_second_append)
    run = env.start("around", requests(*(("shop", "pay", {"n": n}) for n in (1, 2))))
    env.run_until_idle()
    assert appends == [[0], [1, 2]]
    assert sorted(c.step for c in shop.calls) == [0, 1, 2]
    assert [step for step, _, _ in calls_of(env, run)] == [0, 1, 2]

    env.advance(seconds=60)  # past the retry backoff of the failed segment
    [first, batch, last] = env.result(run)
    assert (first, last) == ([0, '{"paid":0}'], [0, '{"paid":3}'])
    assert [[a["status"], a["payload"]] for a in json.loads(batch[1])] == [
        [0, '{"paid":1}'],
        [0, '{"paid":2}'],
    ]
    assert [c.step for c in shop.calls] == [0, 1, 2, 3]
    assert shop.calls[3].idempotency_key == idempotency_key(run, run, 3)
    assert [step for step, _, _ in calls_of(env, run)] == [0, 1, 2, 3]


def test_task_calls_in_a_batch_are_made_one_at_a_time(kind: Any) -> None:
    """A service bound to tasks (Celery) suspends the run on each task in turn: the second
    task is sent only when the first has its outcome; the plain calls before them ran
    together, and nothing is called twice."""
    tasks = FakeTasks()
    shop = FakeService({"price": 5})
    env = kind({"billing": tasks, "shop": shop})
    run = env.start(
        "batch",
        requests(
            ("shop", "price", 1),
            ("billing", "charge", 2),
            ("billing", "receipt", 3),
            ("shop", "price", 4),
        ),
    )
    env.run_until_idle()
    assert [c.context.operation for c in tasks.sent] == ["charge"]
    assert shop.ops() == ["price"]
    first = tasks.sent[0]
    env.report_task_outcome(first.task_id, first.token, AbiStatus.OK, '{"charged":1}')
    env.run_until_idle()
    assert [c.context.operation for c in tasks.sent] == ["charge", "receipt"]
    second = tasks.sent[1]
    assert second.context.step == 2
    env.report_task_outcome(second.task_id, second.token, AbiStatus.PERMANENT, "no printer")
    env.run_until_idle()

    assert answers(env, run) == [[0, "5"], [0, '{"charged":1}'], [2, "no printer"], [0, "5"]]
    assert shop.ops() == ["price", "price"]
    assert [op for _, op, _ in calls_of(env, run)] == ["price", "charge", "receipt", "price"]
    assert len(tasks.sent) == 2


def test_a_write_ahead_call_in_a_batch_records_its_intent_first(kind: Any) -> None:
    """A write-ahead call is made alone, after the calls before it are recorded: its intent
    is in storage while it runs, and it is completed in place."""
    seen: list[list[tuple[int, bool]]] = []
    env_box: list[Any] = []

    def transfer(request: Any) -> Any:
        env = env_box[0]
        seen.append([(e.step, bool(getattr(e, "pending", False))) for e in env.history(run)])
        return {"ok": True}

    bank = FakeService({"transfer": transfer, "balance": 900})
    env = kind({"bank": bank}, EngineConfig(write_ahead_ops=frozenset({"bank.transfer"})))
    env_box.append(env)
    run = env.start(
        "batch",
        requests(("bank", "balance", 1), ("bank", "balance", 2), ("bank", "transfer", 3)),
    )
    env.run_until_idle()

    assert answers(env, run) == [[0, "900"], [0, "900"], [0, '{"ok":true}']]
    assert seen == [[(0, False), (1, False), (2, True)]]
    assert [e.pending for e in env.history(run) if isinstance(e, CallEvent)] == [False] * 3


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{}", "must be a JSON array"),
        ('[{"service":"shop","operation":"ok"}]', "call 0: 'request' must be a string"),
        ('[{"service":"shop","operation":"ok","request":{}}]', "'request' must be a string"),
        ("[1]", "call 0 must be an object"),
        (json.dumps([{"service": "s", "operation": "o", "request": "1"}] * 101), "at most 100"),
    ],
)
def test_malformed_requests_are_permanent_and_call_nothing(text: str, reason: str) -> None:
    shop = FakeService({"ok": 1})
    env = MemoryEnvironment({"shop": shop, "s": shop})
    try:
        env.deploy("batch", batch_module())
        run = env.run("batch", json.loads(text))
        [[status, message]] = env.result(run)
        assert status == AbiStatus.PERMANENT
        assert reason in message and message.startswith("durable_call_many: ")
        assert shop.calls == [] and env.history(run) == []
    finally:
        env.runtime.close()


def test_no_threads_for_a_batch_is_refused_with_the_settings_name(settings: Any) -> None:
    """CLEAT_MAX_PARALLEL_CALLS below 1 stops start-up with the setting's reason."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.conf import cleat_settings

    settings.CLEAT_MAX_PARALLEL_CALLS = 0
    cleat_settings.cache_clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="max_parallel_calls must be at least 1"):
            cleat_settings()
    finally:
        cleat_settings.cache_clear()


def test_one_thread_makes_the_batch_one_call_after_another() -> None:
    """With max_parallel_calls=1 the calls of a batch are made on one thread, in the given
    order, each with its own step and answer."""
    threads: set[int] = set()

    def track(request: Any) -> Any:
        threads.add(threading.get_ident())
        return request

    shop = FakeService({"track": track})
    env = MemoryEnvironment({"shop": shop}, config=EngineConfig(max_parallel_calls=1))
    try:
        env.deploy("batch", batch_module())
        run = env.run("batch", requests(*(("shop", "track", n) for n in range(4))))
        assert answers(env, run) == [[0, str(n)] for n in range(4)]
        assert len(threads) == 1 and threading.get_ident() not in threads
        assert [(c.step, c.request) for c in shop.calls] == [(n, n) for n in range(4)]
    finally:
        env.runtime.close()
