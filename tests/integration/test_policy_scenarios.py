"""The policy rules (``engine/policies.py``) through both stores: signal authorization
(the reference's ``WithRequireSignalAuth`` / ``GetAllowedSignalCallers``) and the quotas
(``WithMaxQuota*``), each scenario unchanged on the in-memory environment and the database
one (SQLite, or PostgreSQL / MariaDB with ``CLEAT_TEST_DB``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fixtures.wat import Wat
from tests.integration.support.environments import MemoryEnvironment, database_environment

MakeEnv = Callable[..., Any]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def make_env(request: pytest.FixtureRequest) -> Iterator[MakeEnv]:
    made: list[Any] = []

    def make(*, signal_auth: bool = False, **quotas: int) -> Any:
        if request.param == "memory":
            env: Any = MemoryEnvironment()
            env.storage.require_signal_auth = signal_auth
            env.storage.quotas = env.storage.quotas.overridden(quotas)
            return env
        settings = request.getfixturevalue("settings")
        settings.CLEAT_REQUIRE_SIGNAL_AUTH = signal_auth
        names = {"children": "CHILDREN_PER_RUN", "locks": "LOCKS_PER_RUN"}
        names["schedules"] = "SCHEDULES_PER_TENANT"
        for quota, value in quotas.items():
            setattr(settings, f"CLEAT_MAX_{names[quota]}", value)
        env = database_environment(request.getfixturevalue("tenant"), None)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def audit_reasons(env: Any) -> list[str]:
    """The reasons of the refusals kept in the audit (the memory store's list, the
    database's AuditLog rows)."""
    if env.kind == "memory":
        return [entry["reason"] for entry in env.storage.audit]
    from workflows.models import AuditLog
    from workflows.tenancy import tenant_context

    with tenant_context(env.tenant.id):
        return list(
            AuditLog.objects.filter(tenant_id=env.tenant.id, action="signal_denied")
            .order_by("id")
            .values_list("reason", flat=True)
        )


# --- signal authorization -------------------------------------------------------------------


def waiter() -> bytes:
    w = Wat()
    w.run(
        f"""
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (call $finish)"""
    )
    return w.wasm()


def signaller() -> bytes:
    """Signals the run whose id is its input (a JSON string), records the outcome."""
    w = Wat()
    w.run(
        f"""
    (call $rec (call $signal_workflow {w.input_string()} {w.s("go")} {w.js({"from": "x"})}))
    (call $finish)"""
    )
    return w.wasm()


def signal_from(env: Any, sender: str, target_run: str) -> list[Any]:
    run = env.run(sender, f'"{target_run}"')
    return env.result(run)  # type: ignore[no-any-return]


@pytest.mark.parametrize("auth", [False, True], ids=["auth-off", "auth-on"])
def test_an_empty_allow_list_means_anyone_with_auth_off_and_nobody_with_it_on(
    make_env: MakeEnv, auth: bool
) -> None:
    env = make_env(signal_auth=auth)
    env.deploy("target", waiter())  # declares no callers
    env.deploy("sender", signaller())
    target = env.run("target")
    outcome = signal_from(env, "sender", target)
    if not auth:
        assert outcome == [[0, ""]]
        env.run_until_idle()
        assert env.describe(target)["status"] == "done"
        assert audit_reasons(env) == []
        return
    message = (
        "signal authorization: workflow 'sender' may not signal runs of 'target' "
        "(allowed callers: none)"
    )
    assert outcome == [[8, ""]]  # DENIED (signal_workflow answers a status only)
    assert env.describe(target)["status"] == "ready"  # nothing delivered
    assert audit_reasons(env) == [message]


def test_with_auth_on_the_declared_callers_may_signal(make_env: MakeEnv) -> None:
    env = make_env(signal_auth=True)
    env.deploy("target", waiter(), allowed_signal_callers=["sender"])
    env.deploy("sender", signaller())
    env.deploy("stranger", signaller())
    target = env.run("target")
    assert signal_from(env, "stranger", target) == [[8, ""]]
    assert audit_reasons(env) == [
        "signal authorization: workflow 'stranger' may not signal runs of 'target' "
        "(allowed callers: sender)"
    ]
    assert signal_from(env, "sender", target) == [[0, ""]]
    env.run_until_idle()
    assert env.result(target) == [[0, '{"name":"go","payload":{"from":"x"}}']]


def test_external_signals_need_the_permission_when_auth_is_on(make_env: MakeEnv) -> None:
    env = make_env(signal_auth=True)
    env.deploy("target", waiter())
    target = env.run("target")
    with pytest.raises(Exception, match="signal authorization: test has no permission"):
        env.signal(target, "go", permitted=False)
    assert audit_reasons(env) == ["signal authorization: test has no permission to signal runs"]
    env.signal(target, "go", permitted=True)
    env.run_until_idle()
    assert env.describe(target)["status"] == "done"


def test_external_signals_need_no_permission_when_auth_is_off(make_env: MakeEnv) -> None:
    env = make_env(signal_auth=False)
    env.deploy("target", waiter())
    target = env.run("target")
    env.signal(target, "go", permitted=False)
    env.run_until_idle()
    assert env.describe(target)["status"] == "done"


# --- quotas ---------------------------------------------------------------------------------


def starts_children(count: int) -> bytes:
    """Starts ``count`` children (``leaf``), recording each start's outcome status."""
    w = Wat()
    starts = "".join(
        f"(call $recn (i64.extend_i32_u (call $status (call $child_workflow {w.s('leaf')} "
        f"{w.js(i)}))))"
        for i in range(count)
    )
    w.run(f"{starts} (call $finish)")
    return w.wasm()


def leaf() -> bytes:
    w = Wat()
    w.run("(call $finish)")
    return w.wasm()


def test_the_children_quota_denies_the_start_over_it_naming_the_quota(make_env: MakeEnv) -> None:
    env = make_env(children=2)
    env.deploy("leaf", leaf())
    w = Wat()
    w.run(
        f"""
    (drop (call $child_workflow {w.s("leaf")} {w.js(1)}))
    (drop (call $child_workflow {w.s("leaf")} {w.js(2)}))
    (call $rec (call $child_workflow {w.s("leaf")} {w.js(3)}))
    (call $finish)"""
    )
    env.deploy("parent", w.wasm())
    run = env.run("parent")
    assert env.result(run) == [[8, "quota children exceeded: at most 2 per run"]]
    assert len(env.children(run)) == 2


def test_quota_zero_is_unlimited(make_env: MakeEnv) -> None:
    env = make_env(children=0, locks=0, schedules=0)
    env.deploy("leaf", leaf())
    env.deploy("parent", starts_children(5))
    run = env.run("parent")
    assert env.result(run) == [0, 0, 0, 0, 0]
    env.deploy("locker", takes_locks(["a", "b", "c"]))
    assert env.result(env.run("locker")) == [1, 1, 1]
    env.deploy("planner", makes_schedules(3))
    assert [status for status, _ in env.result(env.run("planner"))] == [0, 0, 0]


def takes_locks(keys: list[str]) -> bytes:
    w = Wat()
    body = "".join(f"(call $recn (call $acquire_lock {w.s(k)} (i64.const 0)))" for k in keys)
    w.run(f"{body} (call $finish)")
    return w.wasm()


def test_the_locks_quota_fails_the_run_naming_the_quota(make_env: MakeEnv) -> None:
    """``acquire_lock`` answers a plain 1 or 0, so a run over the locks quota fails with
    ``denied`` and the quota's message; re-taking a lock it holds is not one more."""
    env = make_env(locks=2)
    env.deploy("locker", takes_locks(["a", "a", "b", "b"]))
    assert env.result(env.run("locker")) == [1, 1, 1, 1]
    env.deploy("greedy", takes_locks(["x", "y", "z"]))
    run = env.run("greedy")
    info = env.describe(run)
    assert (info["status"], info["error_code"], info["error"]) == (
        "failed",
        "denied",
        "quota locks exceeded: at most 2 per run",
    )
    assert env.locks() == {}  # its end released the two it held


def makes_schedules(count: int) -> bytes:
    w = Wat()
    body = "".join(
        f"(call $rec (call $schedule_cron {w.s('leaf')} {w.s('0 * * * *')} {w.s('UTC')} {w.js(i)}))"
        for i in range(count)
    )
    w.run(f"{body} (call $finish)")
    return w.wasm()


def test_the_schedules_quota_denies_the_schedule_over_it(make_env: MakeEnv) -> None:
    env = make_env(schedules=1)
    env.deploy("leaf", leaf())
    env.deploy("planner", makes_schedules(2))
    [(first, _), second] = env.result(env.run("planner"))
    assert first == 0
    assert second == [8, "quota schedules exceeded: at most 1 per tenant"]


# --- plugins: versions pinned at deploy, cool-down, guard ----------------------------------------


class Llm:
    """A plugin whose every version answers its own number; ``fail`` makes it raise."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.fail = False
        self.calls = 0

    def ask(self, request: Any) -> dict[str, Any]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("model backend down")
        return {"version": self.version}


def plugin_env(request: pytest.FixtureRequest, kind: str, **options: Any) -> Any:
    if kind == "memory":
        return MemoryEnvironment(**options)
    from workflows.testing import DatabaseWorkflowEnvironment

    return DatabaseWorkflowEnvironment(request.getfixturevalue("tenant"), None, **options)


def asks(times: int = 1) -> bytes:
    w = Wat()
    body = "".join(
        f"(call $rec (call $plugin_call {w.s('llm')} {w.s('ask')} {w.js({})}))"
        for _ in range(times)
    )
    w.run(f"{body} (call $finish)")
    return w.wasm()


@pytest.fixture(
    params=["memory", pytest.param("database", marks=pytest.mark.django_db(transaction=True))]
)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_plugin_dependencies_pin_the_newest_fitting_version_at_deploy(
    request: pytest.FixtureRequest, kind: str
) -> None:
    versions = {v: Llm(v) for v in ("1.1.0", "1.4.2", "2.0.0")}
    env = plugin_env(request, kind, plugins={"llm": versions})
    try:
        env.deploy("asker", asks(), plugin_dependencies={"llm": ">=1.2.0, <2"})
        assert env.result(env.run("asker")) == [[0, '{"version":"1.4.2"}']]
        env.deploy("bold", asks(), plugin_dependencies={"llm": "^2.0.0"})
        assert env.result(env.run("bold")) == [[0, '{"version":"2.0.0"}']]
        with pytest.raises(Exception, match=r"no version of plugin 'llm' satisfies '>=3'"):
            env.deploy("asker", asks(), plugin_dependencies={"llm": ">=3"})
        with pytest.raises(Exception, match="is not a semver constraint"):
            env.deploy("asker", asks(), plugin_dependencies={"llm": "newest"})
    finally:
        if kind == "database":
            env.close()


def test_a_plugin_that_raises_cools_down_and_its_calls_get_error(
    request: pytest.FixtureRequest, kind: str
) -> None:
    llm = Llm("1.0.0")
    env = plugin_env(request, kind, plugins={"llm": llm})
    try:
        env.deploy("asker", asks(2))
        now = [1000.0]
        env.services.plugins.clock = lambda: now[0]
        llm.fail = True
        down = "RuntimeError: model backend down"
        assert env.result(env.run("asker")) == [
            [1, down],
            [1, f"plugin 'llm' is unhealthy (cooling down): {down}"],
        ]
        assert llm.calls == 1  # the second call was not made
        assert env.services.plugins.unhealthy() == {"llm": down}
        llm.fail = False
        now[0] += 59
        assert env.result(env.run("asker"))[0][0] == 1  # still cooling down
        assert llm.calls == 1
        now[0] += 1  # the 60 s cool-down is over
        assert env.result(env.run("asker")) == [[0, '{"version":"1.0.0"}']] * 2
        assert llm.calls == 3
    finally:
        if kind == "database":
            env.close()


def test_the_plugin_guard_denies_tenants_and_workflows_it_does_not_name(
    request: pytest.FixtureRequest, kind: str
) -> None:
    env = plugin_env(
        request, kind, plugins={"llm": Llm("1.0.0")}, plugin_guard={"llm": {"workflows": ["ok"]}}
    )
    try:
        env.deploy("ok", asks())
        env.deploy("other", asks())
        assert env.result(env.run("ok")) == [[0, '{"version":"1.0.0"}']]
        assert env.result(env.run("other")) == [
            [8, "plugin 'llm' may not be called by workflow 'other'"]
        ]
    finally:
        if kind == "database":
            env.close()
