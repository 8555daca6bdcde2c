"""The version rule every store applies to a new run (``engine.versions``)."""

from __future__ import annotations

import pytest

from engine.versions import NoSuchVersion, choose_version

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
