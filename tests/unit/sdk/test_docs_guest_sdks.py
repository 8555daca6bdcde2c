"""The code blocks of ``docs/guest-sdks.md`` build and do what the page says."""

from __future__ import annotations

import re

import pytest

from engine.testing import WorkflowEnvironment
from tests.fixtures import FakeService
from tests.fixtures.guests import ROOT, built

PAGE = ROOT / "docs" / "guest-sdks.md"
# Two levels below the repository, as the page's relative AssemblyScript imports assume
# (build/ is ignored by git).
SNIPPETS = ROOT / "build" / "doc-snippets"


def block(language: str) -> str:
    found = re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), re.S)
    assert len(found) == 1, f"{PAGE.name} has {len(found)} {language} blocks"
    return str(found[0])


def snippet(language: str, suffix: str) -> bytes:
    SNIPPETS.mkdir(parents=True, exist_ok=True)
    path = SNIPPETS / f"guest_{language}{suffix}"
    text = block(language)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return built(path)


def services() -> dict[str, FakeService]:
    return {
        "inventory": FakeService({"reserve": {"id": "r-1"}}),
        "payments": FakeService({"charge": {"id": "ch-1"}}),
    }


def test_the_rust_block_waits_for_shipping_and_returns_the_carrier() -> None:
    env = WorkflowEnvironment(services())
    env.deploy("order", snippet("rust", ".rs"))
    run = env.run("order", {"sku": "book"})
    env.signal(run, "shipped", {"carrier": "ups"})
    env.run_until_idle()
    assert env.result(run) == {"charge": {"id": "ch-1"}, "carrier": "ups"}
    env.assert_replays(run)


@pytest.mark.parametrize(("language", "suffix"), [("c", ".c"), ("ts", ".ts")])
def test_the_c_and_assemblyscript_blocks_return_the_reservation(language: str, suffix: str) -> None:
    env = WorkflowEnvironment(services())
    env.deploy("order", snippet(language, suffix))
    run = env.run("order", {"sku": "book"})
    assert env.result(run) == {"reservation_id": "r-1"}
    env.assert_replays(run)
