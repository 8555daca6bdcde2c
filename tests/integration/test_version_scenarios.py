"""The version rules (``engine/versions.py``) through both stores: which version a child
starts on (the reference's ``ResolveChildVersion`` with the parent definition's binding
policy), and when a run may continue on another version (``ValidateVersionCompatibility``:
continue-as-new with a version, an operator's move). Each scenario runs unchanged on the
in-memory environment and on the database one (SQLite, or PostgreSQL / MariaDB with
``CLEAT_TEST_DB``), as ``test_lifecycle_scenarios.py`` does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.fixtures.wat import Wat
from tests.integration.support.environments import MemoryEnvironment, database_environment

MakeEnv = Callable[[], Any]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("database", marks=pytest.mark.django_db(transaction=True)),
    ]
)
def make_env(request: pytest.FixtureRequest) -> Iterator[MakeEnv]:
    made: list[Any] = []

    def make() -> Any:
        if request.param == "memory":
            return MemoryEnvironment()
        env = database_environment(request.getfixturevalue("tenant"), None)
        made.append(env)
        return env

    yield make
    for env in made:
        env.close()


def reports_its_version() -> bytes:
    w = Wat()
    w.run("(call $recn (call $version)) (call $finish)")
    return w.wasm()


def starts_a_child(version: int = 0) -> bytes:
    """Starts ``child`` (asking for ``version``; 0: the default resolution), records the
    start's outcome and, when it started, the child's result (its version)."""
    w = Wat()
    w.run(
        f"""
    (local.set $c (call $child_workflow_with_options {w.s("child")} {w.js({})}
      (i64.const {version}) (i64.const 0) {w.s("")}))
    (call $rec (local.get $c))
    (if (i32.eqz (call $status (local.get $c)))
      (then (call $rec (call $await_child {w.payload("c")}))))
    (call $finish)""",
        locals="$c i64",
    )
    return w.wasm()


def child_version(env: Any, run: str) -> int:
    """The version the parent's child ran (from the parent's transcript)."""
    transcript = env.result(run)
    assert transcript[0][0] == 0, f"the child did not start: {transcript}"
    import json

    return int(json.loads(transcript[1][1])[0])


def refusal(env: Any, run: str) -> tuple[int, str]:
    transcript = env.result(run)
    assert len(transcript) == 1, f"the child started: {transcript}"
    return transcript[0][0], transcript[0][1]


def deploy_children(env: Any, *min_versions: int) -> None:
    for number, minimum in enumerate(min_versions, start=1):
        env.deploy("child", reports_its_version(), version=number, min_version=minimum)


# --- the default rule -----------------------------------------------------------------------


def test_a_child_takes_the_parents_version_when_it_has_it(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0, 0, 0)
    env.deploy("parent", starts_a_child(), version=2)
    assert child_version(env, env.run("parent")) == 2


def test_parent_version_missing_takes_the_newest_whose_min_version_admits_the_parent(
    make_env: MakeEnv,
) -> None:
    """The issue's case: child v1 (min_version 0) and v2 (min_version 5), parent at v3: v2
    does not accept parents older than 5, so the child runs v1. A parent at v5 gets v2."""
    env = make_env()
    deploy_children(env, 0, 5)
    env.deploy("parent", starts_a_child(), version=3)
    assert child_version(env, env.run("parent")) == 1
    env.deploy("parent", starts_a_child(), version=5)
    assert child_version(env, env.run("parent")) == 2


def test_no_qualifying_version_refuses_the_child_with_unknown_definition(
    make_env: MakeEnv,
) -> None:
    """Parent v3, child v1 needs parents from v4 and v2 from v5: none qualifies; the guest's
    start gets NOT_FOUND with the reason, and nothing is started."""
    env = make_env()
    deploy_children(env, 4, 5)
    env.deploy("parent", starts_a_child(), version=3)
    run = env.run("parent")
    status, message = refusal(env, run)
    assert status == 7
    assert message == (
        "unknown_definition: child has no version 3 (the parent's) and no non-deprecated "
        "version whose min_version is at most 3"
    )
    assert env.children(run) == {}


def test_deprecated_versions_are_not_fallbacks(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0, 0)
    env.deprecate("child", 2)
    env.deploy("parent", starts_a_child(), version=3)
    assert child_version(env, env.run("parent")) == 1
    env.deprecate("child", 1)
    status, message = refusal(env, env.run("parent"))
    assert status == 7 and message.startswith("unknown_definition: child has no version 3")


def test_a_deprecated_pin_is_honoured_and_a_missing_one_refused(make_env: MakeEnv) -> None:
    """A version the guest asks for is an explicit request: it runs even deprecated (as an
    explicit start does); one that is not deployed is refused, naming it."""
    env = make_env()
    deploy_children(env, 0, 0)
    env.deprecate("child", 1)
    env.deploy("parent", starts_a_child(version=1))
    assert child_version(env, env.run("parent")) == 1
    env.deploy("parent", starts_a_child(version=9))
    assert refusal(env, env.run("parent")) == (
        7,
        "unknown_definition: child has no version 9 (asked for by the parent)",
    )


def test_an_unknown_child_name_is_refused(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("parent", starts_a_child())
    assert refusal(env, env.run("parent")) == (
        7,
        "unknown_definition: no workflow definition named 'child'",
    )


# --- binding policies set at deploy --------------------------------------------------------------


def test_frozen_binding_uses_the_versions_pinned_at_deploy(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0, 0, 0)
    env.deploy(
        "parent",
        starts_a_child(),
        version=2,
        child_binding="frozen",
        child_versions={"child": 1},
    )
    assert child_version(env, env.run("parent")) == 1  # not 2, the parent's version
    env.deprecate("child", 1)
    assert child_version(env, env.run("parent")) == 1  # a pin is explicit: deprecated runs
    # A guest's explicit version still wins over the policy.
    env.deploy(
        "parent",
        starts_a_child(version=3),
        version=3,
        child_binding="frozen",
        child_versions={"child": 1},
    )
    assert child_version(env, env.run("parent")) == 3


def test_frozen_binding_to_a_missing_version_is_refused(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0)
    env.deploy("parent", starts_a_child(), child_binding="frozen", child_versions={"child": 4})
    assert refusal(env, env.run("parent")) == (
        7,
        "unknown_definition: child has no version 4 "
        "(pinned at the parent's deploy, child_binding frozen)",
    )


def test_stable_binding_follows_the_stable_tag_when_the_child_starts(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0, 0, 0)
    env.deploy("parent", starts_a_child(), version=3, child_binding="stable")
    status, message = refusal(env, env.run("parent"))
    assert (status, message) == (
        7,
        "unknown_definition: no version of child is tagged 'stable' "
        "(the parent's child_binding is stable)",
    )
    env.set_tag("child", "stable", 1)
    assert child_version(env, env.run("parent")) == 1
    env.set_tag("child", "stable", 2)
    assert child_version(env, env.run("parent")) == 2


def test_latest_binding_takes_the_newest_non_deprecated_version(make_env: MakeEnv) -> None:
    env = make_env()
    deploy_children(env, 0, 0, 9)
    env.deprecate("child", 3)
    env.deploy("parent", starts_a_child(), version=1, child_binding="latest")
    assert child_version(env, env.run("parent")) == 2  # not 1, the parent's version


def test_a_bad_binding_is_refused_at_deploy(make_env: MakeEnv) -> None:
    env = make_env()
    with pytest.raises(Exception, match="child_binding must be one of"):
        env.deploy("parent", starts_a_child(), child_binding="newest")
    with pytest.raises(Exception, match="only used with child_binding 'frozen'"):
        env.deploy("parent", starts_a_child(), child_versions={"child": 1})
    with pytest.raises(Exception, match=r"child_versions\['child'\] must be a positive integer"):
        env.deploy("parent", starts_a_child(), child_binding="frozen", child_versions={"child": 0})


# --- continue-as-new with a version, and an operator's move ---------------------------------------


def continues_on(version: int, *, handler: bool = False) -> bytes:
    """A first run that continues as new on ``version``; a successor reports its version.
    ``handler``: it also exports an update handler ``bump``."""
    w = Wat()
    if handler:
        w.func("bump", w.reply(0, "bumped"))
    w.run(
        f"""
    (if (i64.eq (call $has_state {w.s("moved")}) (i64.const 0))
      (then
        (drop (call $set_state {w.s("moved")} {w.js(1)}))
        (drop (call $continue_as_new_with_version {w.js({})} (i64.const {version})))))
    (call $recn (call $version))
    (call $finish)"""
    )
    return w.wasm()


def test_continue_as_new_to_a_compatible_version_starts_it(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("flow", continues_on(2, handler=True))
    env.deploy("flow", continues_on(2, handler=True), min_version=1)
    run = env.start("flow", version=1)
    env.run_until_idle()
    successor = env.describe(run)["continued_as"]
    assert env.describe(run)["status"] == "done" and successor is not None
    assert (env.describe(successor)["version"], env.result(successor)) == (2, [2])


@pytest.mark.parametrize(
    ("second", "min_version", "code", "message"),
    [
        (
            None,
            0,
            "not_found",
            "flow has no version 2 to move to",
        ),
        (
            continues_on(2),
            0,
            "permanent",
            "flow version 1 cannot move to version 2: version 2 does not export 'bump', "
            "which version 1 exports (an entry point or update handler)",
        ),
        (
            continues_on(2, handler=True),
            5,
            "permanent",
            "flow version 1 cannot move to version 2: version 2 has min_version 5: it does not "
            "replay histories of version 1",
        ),
    ],
    ids=["missing", "lacks-an-update-handler", "min-version-above"],
)
def test_continue_as_new_to_an_incompatible_version_fails_the_run_clearly(
    make_env: MakeEnv, second: bytes | None, min_version: int, code: str, message: str
) -> None:
    """Refused with the first incompatibility: the run fails (nothing retries it) and no
    successor starts. A version that is not deployed no longer leaves the run silently on
    its own version."""
    env = make_env()
    env.deploy("flow", continues_on(2, handler=True))
    if second is not None:
        env.deploy("flow", second, min_version=min_version)
    run = env.start("flow", version=1)
    env.run_until_idle()
    info = env.describe(run)
    assert (info["status"], info["error_code"], info["error"]) == ("failed", code, message)
    assert info["continued_as"] is None
    assert env.locks() == {}


def waits_then_reports_its_version(*, handler: bool = False) -> bytes:
    w = Wat()
    if handler:
        w.func("bump", w.reply(0, "bumped"))
    w.run(
        f"""
    (drop (call $durable_await_signals {w.js(["go"])} (i64.const -1)))
    (call $recn (call $version))
    (call $finish)"""
    )
    return w.wasm()


def test_an_operator_moves_a_waiting_run_to_a_compatible_version(make_env: MakeEnv) -> None:
    """The run's history replays on version 2's code from its next segment: it finishes
    there. The move is kept in the history as an admin_action."""
    env = make_env()
    env.deploy("flow", waits_then_reports_its_version(handler=True))
    env.deploy("flow", waits_then_reports_its_version(handler=True), min_version=1)
    run = env.run("flow", version=1)
    env.move_to_version(run, 2)
    assert env.describe(run)["version"] == 2
    env.signal(run, "go")
    env.run_until_idle()
    assert env.result(run) == [2]
    assert [e.TYPE.value for e in env.history(run)] == ["admin_action", "await_signals"]


def test_an_operators_move_is_refused_with_the_first_incompatibility(make_env: MakeEnv) -> None:
    env = make_env()
    env.deploy("flow", waits_then_reports_its_version(handler=True))
    env.deploy("flow", waits_then_reports_its_version())  # no update handler
    env.deploy("flow", waits_then_reports_its_version(handler=True), min_version=3)
    run = env.run("flow", version=1)
    with pytest.raises(Exception, match="flow has no version 7 to move to"):
        env.move_to_version(run, 7)
    with pytest.raises(Exception, match="version 2 does not export 'bump'"):
        env.move_to_version(run, 2)
    with pytest.raises(Exception, match="version 3 has min_version 3"):
        env.move_to_version(run, 3)
    assert env.describe(run)["version"] == 1  # nothing moved
    env.signal(run, "go")
    env.run_until_idle()
    assert env.result(run) == [1]
    with pytest.raises(Exception, match="already done"):
        env.move_to_version(run, 1)
