"""The WIT world is the component-side contract of guest ABI v1 (ABI.md): every import of
the core ABI has a counterpart in ``host`` with the same name in kebab-case, the same
parameters in the same order, and the typed result the mapping promises."""

from __future__ import annotations

import re
from pathlib import Path

from engine.abi import EXTENSION_IMPORTS, IMPORTS
from engine.component import wit_name

WIT = Path(__file__).resolve().parents[3] / "sdk" / "wit" / "workflow.wit"
PARAM_TYPES = {"s": "string", "I": "s64", "i": "s32"}
RESULTS = {"P": "result<string, call-error>", "V": "s64"}


def _interface(name: str) -> str:
    text = WIT.read_text()
    match = re.search(rf"^interface {name} \{{\n(.*?)^\}}", text, re.M | re.S)
    assert match, f"interface {name} is missing from {WIT}"
    return match.group(1)


def _functions(body: str) -> dict[str, tuple[list[str], str]]:
    found: dict[str, tuple[list[str], str]] = {}
    for name, params, result in re.findall(
        r"^\s*([a-z0-9-]+): func\((.*?)\)(?: -> (.*?))?;", body, re.M
    ):
        types = [p.split(":", 1)[1].strip() for p in params.split(",") if p.strip()]
        found[name] = (types, result)
    return found


def test_package_and_world_are_the_ones_abi_md_names() -> None:
    text = WIT.read_text()
    assert "package cleat:workflow@1.0.0;" in text
    assert re.search(
        r"export run: func\(entry: string, input: string\) -> result<string, workflow-error>;",
        text,
    )


def test_every_abi_import_has_a_host_function_of_the_same_shape() -> None:
    host = _functions(_interface("host"))
    expected = {
        wit_name(imp.name): ([PARAM_TYPES[c] for c in imp.params], RESULTS[imp.returns])
        for imp in IMPORTS
    }
    assert sorted(host) == sorted(expected), "host must offer exactly the ABI v1 operations"
    for name, shape in expected.items():
        assert host[name] == shape, f"{name}: WIT says {host[name]}, ABI v1 says {shape}"


def test_updates_interface_offers_take_and_complete() -> None:
    updates = _functions(_interface("updates"))
    assert updates == {
        "take": ([], "option<update-request>"),
        "complete": (["string", "u8", "string"], ""),
    }


BATCH_WIT = WIT.parent / "batch.wit"


def test_the_batch_extension_is_an_interface_of_its_own_outside_the_v1_world() -> None:
    """The optional extension (engine.abi.EXTENSION_IMPORTS) lives in ``batch.wit``: the v1
    world imports nothing of it, the ``workflow-batch`` world includes v1 and adds it."""
    text = BATCH_WIT.read_text()
    match = re.search(r"^interface batch \{\n(.*?)^\}", text, re.M | re.S)
    assert match, "interface batch is missing from batch.wit"
    assert _functions(match.group(1)) == {
        wit_name(imp.name): ([PARAM_TYPES[c] for c in imp.params], RESULTS[imp.returns])
        for imp in EXTENSION_IMPORTS
    }
    assert re.search(r"world workflow-batch \{\s*include workflow;\s*import batch;\s*\}", text)
    world = re.search(r"^world workflow \{\n(.*?)^\}", WIT.read_text(), re.M | re.S)
    assert world and "batch" not in world.group(1)
