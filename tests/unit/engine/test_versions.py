"""The version rule every store applies to a new run (``engine.versions``)."""

from __future__ import annotations

import pytest

from engine.versions import (
    ChildBinding,
    DeployedVersion,
    NoSuchVersion,
    binding_problem,
    choose_version,
    resolve_child_version,
    resolve_plugins,
)

# version -> deprecated
DEPLOYED = {1: False, 2: True, 3: False, 4: True}


def test_an_explicit_version_is_taken_even_deprecated() -> None:
    assert choose_version("flow", DEPLOYED, version=4) == 4
    assert choose_version("flow", DEPLOYED, version=1, preferred=3) == 1


def test_the_preferred_version_is_taken_when_deployed_even_deprecated() -> None:
    assert choose_version("flow", DEPLOYED, preferred=2) == 2
    assert choose_version("flow", DEPLOYED, preferred=9) == 3


def test_otherwise_the_newest_version_not_deprecated() -> None:
    assert choose_version("flow", DEPLOYED) == 3


@pytest.mark.parametrize(
    ("deployed", "version", "field", "message"),
    [
        ({}, None, "definition", "no workflow definition named 'flow'"),
        ({}, 1, "definition", "no workflow definition named 'flow'"),
        (DEPLOYED, 9, "version", "flow has no version 9"),
        ({1: True, 2: True}, None, "definition", "every version of flow is deprecated"),
    ],
)
def test_refusals_name_the_field(
    deployed: dict[int, bool], version: int | None, field: str, message: str
) -> None:
    with pytest.raises(NoSuchVersion) as caught:
        choose_version("flow", deployed, version=version)
    assert (caught.value.field, caught.value.message) == (field, message)


# --- a child's version (the reference's ResolveChildVersion) ---------------------------------

CHILDREN = [
    DeployedVersion(1, min_version=0),
    DeployedVersion(2, min_version=5),
    DeployedVersion(3, deprecated=True, min_version=0),
]


def child(parent_version: int, version: int = 0, **policy: object) -> int:
    return resolve_child_version(
        "child", CHILDREN, version=version, parent_version=parent_version, **policy
    )  # type: ignore[arg-type]


def test_a_child_takes_its_parents_version_then_the_newest_compatible() -> None:
    assert child(2) == 2  # the parent's version, though its min_version is above it
    assert child(4) == 1  # v2 needs parents from 5 on; v3 is deprecated
    assert child(7) == 2
    assert child(3) == 3  # the parent's version, even deprecated (the pair stays coupled)


def test_an_explicit_version_and_the_policies() -> None:
    assert child(7, version=3) == 3
    assert child(7, binding=ChildBinding.FROZEN, pins={"child": 1}) == 1
    assert child(7, binding=ChildBinding.FROZEN, pins={"other": 1}) == 2  # no pin: default
    assert child(1, binding=ChildBinding.STABLE, stable=2) == 2
    assert child(1, binding=ChildBinding.LATEST) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"parent_version": 4, "version": 8}, "child has no version 8 (asked for by the parent)"),
        (
            {"parent_version": 4, "version": 0, "binding": ChildBinding.STABLE},
            "no version of child is tagged 'stable' (the parent's child_binding is stable)",
        ),
    ],
)
def test_child_refusals_say_unknown_definition(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(NoSuchVersion) as caught:
        resolve_child_version("child", CHILDREN, **kwargs)  # type: ignore[arg-type]
    assert caught.value.message == f"unknown_definition: {message}"


def test_no_compatible_child_version() -> None:
    with pytest.raises(NoSuchVersion, match="no non-deprecated version whose min_version"):
        resolve_child_version("child", CHILDREN[1:], version=0, parent_version=4)


def test_binding_problems_name_the_field() -> None:
    assert binding_problem("frozen", {"a": 1}) is None
    assert binding_problem("sometimes", {}) == (
        "child_binding",
        "child_binding must be one of '', 'frozen', 'stable', 'latest', not 'sometimes'",
    )
    assert binding_problem("frozen", []) is not None
    assert binding_problem("latest", {"a": 1}) == (
        "child_versions",
        "child_versions are only used with child_binding 'frozen'",
    )


# --- plugin versions (the reference's ResolvePlugins) ------------------------------------------


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        (">=1.2.0", "2.1.0"),
        (">=1.2.0, <2", "1.10.0"),
        ("~1.2", "1.2.9"),
        ("^1.2.0", "1.10.0"),
        ("=1.2.9", "1.2.9"),
        ("1.2.0", "1.2.0"),
        ("*", "2.1.0"),
    ],
)
def test_plugins_resolve_to_the_newest_fitting_version(constraint: str, expected: str) -> None:
    available = {"llm": ["1.2.0", "1.2.9", "1.10.0", "2.1.0", "0.9.0"]}
    assert resolve_plugins({"llm": constraint}, available) == {"llm": expected}


def test_plugin_refusals_name_the_plugin() -> None:
    with pytest.raises(NoSuchVersion, match="no plugin named 'llm' is configured"):
        resolve_plugins({"llm": ">=1"}, {})
    with pytest.raises(NoSuchVersion, match=r"satisfies '>=3' \(configured: 1.0.0, 2.0.0\)"):
        resolve_plugins({"llm": ">=3"}, {"llm": ["2.0.0", "1.0.0"]})
    with pytest.raises(NoSuchVersion, match="'latest' is not a semver constraint"):
        resolve_plugins({"llm": "latest"}, {"llm": ["1.0.0"]})
