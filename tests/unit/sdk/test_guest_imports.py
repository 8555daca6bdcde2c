"""The raw import declarations of the Rust, C, Zig and AssemblyScript SDKs are generated from
``engine.abi.IMPORTS`` (``sdk/guest_imports.py``) and must not drift from it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _generator():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "guest_imports", ROOT / "sdk" / "guest_imports.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", sorted(_generator().TARGETS))
def test_the_sdks_declare_every_import_as_the_host_defines_it(path: str) -> None:
    gen = _generator()
    assert (ROOT / path).read_text() == gen.render(path), (
        f"run python sdk/guest_imports.py ({path})"
    )


def test_every_import_of_the_host_is_declared_with_its_parameter_names() -> None:
    from engine.abi import IMPORTS

    gen = _generator()
    assert set(gen.PARAM_NAMES) == {imp.name for imp in IMPORTS}
    text = (ROOT / "sdk" / "c" / "cleat.h").read_text()
    for imp in IMPORTS:
        assert f'import_name("{imp.name}")' in text
