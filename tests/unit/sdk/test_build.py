"""Building a workflow module: what goes into the cache key, and errors in the app's terms."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from cleat_workflow import build
from cleat_workflow.build import BuildError, build_component, build_key, source_files

# What componentize-py 0.25 prints when the app fails to import at build time: the
# console script's traceback, the guest's (paths are its numbered search directories), then
# the Rust error chain and backtrace.
COMPONENTIZE_OUTPUT = """\
Traceback (most recent call last):
  File "/venv/bin/componentize-py", line 6, in <module>
    sys.exit(script())
             ^^^^^^^^
AssertionError: Traceback (most recent call last):
  File "/0/cleat_entry__.py", line 3, in <module>
    import app  # noqa: F401
    ^^^^^^^^^^
  File "/1/app.py", line 4, in <module>
    import helper
  File "/1/helper.py", line 1
    def f(:
          ^
SyntaxError: invalid syntax


Caused by:
    SyntaxError: invalid syntax (helper.py, line 1)

Stack backtrace:
   0: <anyhow::Error>::msg::<alloc::string::String>
   1: anyhow::__private::format_err
  10: cfunction_vectorcall_NOARGS
             at /tmp/python-build/Python-3.11.7/Objects/methodobject.c:486:24
"""


def write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_sources_are_the_app_and_its_local_imports(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "app.py": "import json\nimport helper\nfrom pkg.sub import thing\n",
            "helper.py": "from shared import x\n",
            "shared.py": "x = 1\n",
            "pkg/__init__.py": "",
            "pkg/sub.py": "thing = 2\n",
            "unrelated.py": "y = 3\n",
        },
    )
    found = [p.relative_to(tmp_path).as_posix() for p in source_files(tmp_path / "app.py")]
    assert found == ["app.py", "helper.py", "pkg/__init__.py", "pkg/sub.py", "shared.py"]


def test_the_key_follows_the_sources_not_their_directory(tmp_path: Path) -> None:
    files = {"app.py": "import helper\n", "helper.py": "x = 1\n", "notes.py": "n = 1\n"}
    one, two = tmp_path / "one", tmp_path / "two"
    write(one, files)
    write(two, files)
    key = build_key(one / "app.py", source_files(one / "app.py"))
    assert build_key(two / "app.py", source_files(two / "app.py")) == key
    (two / "notes.py").write_text("n = 2\n")
    assert build_key(two / "app.py", source_files(two / "app.py")) == key
    (two / "helper.py").write_text("x = 2\n")
    assert build_key(two / "app.py", source_files(two / "app.py")) != key


def test_the_key_covers_the_sdk_and_the_wit_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, {"app.py": "x = 1\n"})
    app = tmp_path / "app.py"
    key = build_key(app, source_files(app))
    monkeypatch.setattr(build, "RECIPE_VERSION", build.RECIPE_VERSION + 1)
    assert build_key(app, source_files(app)) != key
    monkeypatch.undo()
    monkeypatch.setattr(build, "componentize_py_version", lambda: "0.0.0")
    assert build_key(app, source_files(app)) != key
    wit = tmp_path / "wit"
    wit.mkdir()
    (wit / "workflow.wit").write_text("package x:y;\n")
    monkeypatch.setattr(build, "WIT_DIR", wit)
    assert build_key(app, source_files(app)) != key


def test_componentize_py_output_becomes_a_python_error_with_real_paths(tmp_path: Path) -> None:
    generated, app_dir, sdk = tmp_path / "gen", tmp_path / "src", tmp_path / "sdk"
    message = build.readable_error(COMPONENTIZE_OUTPUT, [generated, app_dir, sdk], generated)
    lines = message.splitlines()
    assert lines[0] == f"{app_dir / 'helper.py'}:1: SyntaxError: invalid syntax"
    assert f'  File "{app_dir / "app.py"}", line 4, in <module>' in lines
    assert "cleat_entry__" not in message, "the generated entry module is not the app's"
    assert "Stack backtrace" not in message and "anyhow" not in message


def test_a_non_python_failure_keeps_the_error_chain_without_the_backtrace() -> None:
    output = (
        "Error: world `nope` not found\n\nCaused by:\n    no such world\n\n"
        "Stack backtrace:\n   0: x\n"
    )
    message = build.readable_error(output, [], Path("/gen"))
    assert message.startswith("componentize-py failed:")
    assert "no such world" in message and "0: x" not in message


def test_an_app_that_is_not_a_python_module_is_refused(tmp_path: Path) -> None:
    (tmp_path / "app.txt").write_text("")
    with pytest.raises(BuildError, match=r"is a \.py file"):
        build_component(tmp_path / "app.txt")
    (tmp_path / "wit_world.py").write_text("")
    with pytest.raises(BuildError, match="cannot be used"):
        build_component(tmp_path / "wit_world.py")


def test_a_syntax_error_is_reported_at_its_line_and_the_failure_is_cached(
    tmp_path: Path,
) -> None:
    """A real componentize-py run on a module with a syntax error in a local import: the
    message starts with ``helper.py:2: SyntaxError``. The same inputs fail again at once
    from the cache, with this checkout's paths."""
    write(
        tmp_path / "first",
        {
            "broken_app.py": "from cleat_workflow import workflow\nimport broken_helper\n",
            "broken_helper.py": "x = 1\ndef f(:\n    pass\n",
        },
    )
    with pytest.raises(BuildError) as first:
        build_component(tmp_path / "first" / "broken_app.py")
    headline = str(first.value).splitlines()[0]
    assert headline.startswith(f"{tmp_path / 'first' / 'broken_helper.py'}:2: SyntaxError")

    write(
        tmp_path / "second",
        {p.name: p.read_text() for p in (tmp_path / "first").glob("*.py")},
    )
    started = time.monotonic()
    with pytest.raises(BuildError) as again:
        build_component(tmp_path / "second" / "broken_app.py")
    assert time.monotonic() - started < 2, "the cached failure was built again"
    assert str(again.value).startswith(f"{tmp_path / 'second' / 'broken_helper.py'}:2:")


def test_sdk_operations_outside_a_component_say_so() -> None:
    from cleat_workflow import Context
    from cleat_workflow._host import OutsideWorkflow

    with pytest.raises(OutsideWorkflow, match="build_workflow"):
        Context("run").call("shop", "price")


# --- the cache's size budget -------------------------------------------------------------------


def _entry(directory: Path, key_char: str, size: int, used: float, failure: bool = False) -> str:
    key = key_char * 64
    (directory / f"{key}.wasm").write_bytes(b"\0" * size)
    (directory / f"{key}.json").write_text("{}")
    paths = [directory / f"{key}.wasm", directory / f"{key}.json"]
    if failure:
        (directory / f"{key}.error.json").write_text('{"message": "x"}')
        paths.append(directory / f"{key}.error.json")
    for path in paths:
        os.utime(path, (used, used))
    return key


def test_prune_removes_the_least_recently_used_builds_down_to_the_budget(
    tmp_path: Path,
) -> None:
    now = time.time()
    old = _entry(tmp_path, "a", 1000, now - 3000, failure=True)
    middle = _entry(tmp_path, "b", 1000, now - 2000)
    new = _entry(tmp_path, "c", 1000, now - 1000)
    (tmp_path / "notes.txt").write_text("not the cache's")
    result = build.prune_cache(tmp_path, 2100)
    assert result.removed == (old,)
    assert result.freed_bytes == 1000 + 2 + len('{"message": "x"}')
    assert sorted(p.name[:64] for p in tmp_path.glob("*.wasm")) == [middle, new]
    assert not list(tmp_path.glob(f"{old}*"))
    assert (tmp_path / "notes.txt").exists()
    assert build.prune_cache(tmp_path, 2100).removed == ()  # already within the budget
    assert build.prune_cache(tmp_path, 500, keep=[middle]).removed == (new,)
    assert build.prune_cache(tmp_path, 0).removed == ()  # 0: no limit


def test_prune_spares_builds_used_within_the_grace_period(tmp_path: Path) -> None:
    now = time.time()
    recent = _entry(tmp_path, "d", 1000, now - 60)
    older = _entry(tmp_path, "e", 1000, now - 5000)
    assert build.prune_cache(tmp_path, 10).removed == (older,)
    assert build.prune_cache(tmp_path, 10).removed == ()  # over budget, but in use lately
    assert build.prune_cache(tmp_path, 10, grace_s=0).removed == (recent,)


def test_a_bad_budget_fails_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "src", {"app.py": "x = 1\n"})
    monkeypatch.setenv("CLEAT_COMPONENT_CACHE_MAX_MB", "lots")
    monkeypatch.setattr(build, "_componentize", lambda *a: pytest.fail("built anyway"))
    with pytest.raises(BuildError, match="whole number"):
        build_component(tmp_path / "src" / "app.py", cache=tmp_path / "cache")


def test_prune_clears_stale_partial_files_only(tmp_path: Path) -> None:
    stale, fresh = tmp_path / "x.part", tmp_path / "y.part"
    stale.write_bytes(b"1")
    fresh.write_bytes(b"2")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    build.prune_cache(tmp_path, 10)
    assert not stale.exists() and fresh.exists()


def test_a_cache_hit_counts_as_a_use(tmp_path: Path) -> None:
    app = tmp_path / "src" / "app.py"
    write(tmp_path / "src", {"app.py": "x = 1\n"})
    cache = tmp_path / "cache"
    cache.mkdir()
    key = build_key(app, source_files(app), [])
    (cache / f"{key}.wasm").write_bytes(b"component")
    os.utime(cache / f"{key}.wasm", (time.time() - 3600,) * 2)
    before = (cache / f"{key}.wasm").stat().st_mtime
    result = build_component(app, cache=cache)
    assert result.cached and result.key == key
    assert (cache / f"{key}.wasm").stat().st_mtime > before + 3000


@pytest.mark.parametrize(("raw", "expected"), [("", 2 * 1024**3), ("0", 0), ("64", 64 << 20)])
def test_the_budget_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    monkeypatch.setenv("CLEAT_COMPONENT_CACHE_MAX_MB", raw)
    assert build.cache_max_bytes() == expected


def test_a_bad_budget_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEAT_COMPONENT_CACHE_MAX_MB", "lots")
    with pytest.raises(BuildError, match="whole number of megabytes"):
        build.cache_max_bytes()


def test_a_bad_typed_service_fails_the_build_at_its_line(tmp_path: Path) -> None:
    """A real componentize-py run (once per machine: the failure is cached) on a module whose
    typed service declares a request type that is not JSON: the build fails when
    componentize-py imports it, the headline names the app's line (not the SDK's check), the
    message the method and what is wrong."""
    write(
        tmp_path,
        {
            "bad_service.py": (
                "from cleat_workflow import Service\n"
                "\n"
                "\n"
                "class Shop(Service):\n"
                "    def price(self, request: object) -> int: ...\n"
            )
        },
    )
    with pytest.raises(BuildError) as failed:
        build_component(tmp_path / "bad_service.py")
    message = str(failed.value)
    assert message.splitlines()[0].startswith(f"{tmp_path / 'bad_service.py'}:4: ")
    assert "ServiceDefinitionError: Shop.price (bad_service.py:5)" in message
    assert "the request type object is not a dataclass, a TypedDict or a JSON type" in message


def test_a_build_reports_its_start_and_componentize_py_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build_component tells ``progress`` it starts componentize-py (a cache hit tells it
    nothing); the runner reports how componentize-py ended, with its exit status and output."""
    (tmp_path / "app.py").write_text("from cleat_workflow import workflow\n")
    lines: list[str] = []

    def refuse(*args: object) -> None:
        raise BuildError("stopped here")

    monkeypatch.setattr(build, "_componentize", refuse)
    with pytest.raises(BuildError, match="stopped here"):
        build_component(tmp_path / "app.py", cache=tmp_path / "cache", progress=lines.append)
    assert len(lines) == 1 and lines[0].startswith(
        "building app.py into a component with componentize-py"
    )

    reported: list[str] = []
    code, output = build._run_reporting(
        [sys.executable, "-c", "print('made it'); raise SystemExit(3)"],
        tmp_path,
        dict(os.environ),
        reported.append,
    )
    assert (code, output.strip()) == (3, "made it")
    assert reported[-1].startswith("  componentize-py failed after ")
    code, _ = build._run_reporting([sys.executable, "-c", "pass"], tmp_path, dict(os.environ), None)
    assert code == 0
