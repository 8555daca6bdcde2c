"""Build a workflow written in Rust, C, Zig or AssemblyScript into an ABI v1 core module.

``build(Path("order_saga.rs"))`` recognises the language from the source (a ``.rs`` file or
a ``Cargo.toml``, ``.c``, ``.zig``, ``.ts``), compiles it against the guest SDK of that
language (``sdk/rust/cleat``, ``sdk/c``, ``sdk/zig``, ``sdk/assemblyscript``) and caches the
module by the hash of everything that goes into it: the sources, the SDK, the toolchain's
version and this recipe's version. An unchanged workflow is built once per machine.

The toolchains (``python3 dev.py test`` installs them):

- Rust: Debian's ``rustc`` with ``libstd-rust-dev-wasm32`` (``/usr/bin/rustc``, or
  ``$CLEAT_RUSTC``); a ``Cargo.toml`` project is built with ``cargo`` using that ``rustc``.
- C and Zig: ``zig`` from the ``ziglang`` package on PyPI (``requirements-build.txt``), or a
  ``zig`` on ``PATH``; C goes through ``zig cc -target wasm32-freestanding``.
- AssemblyScript: ``asc`` from ``sdk/assemblyscript/node_modules`` (``npm ci`` there).

No Django here: ``manage.py build_workflow`` and the tests call it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDK = ROOT / "sdk"
RUST_SDK = SDK / "rust" / "cleat"
C_SDK = SDK / "c"
ZIG_SDK = SDK / "zig"
AS_SDK = SDK / "assemblyscript"
# Bump when a compiler invocation below changes: every module is rebuilt once.
RECIPE_VERSION = 1
BUILD_TIMEOUT_S = 600

Progress = Callable[[str], None]

LANGUAGE_NAMES = {
    "rust": "Rust",
    "cargo": "Rust (Cargo)",
    "c": "C",
    "zig": "Zig",
    "assemblyscript": "AssemblyScript",
}


class BuildError(Exception):
    """The module could not be built; the message says why (the compiler's own words)."""


@dataclass(frozen=True)
class BuildResult:
    path: Path  # the module in the cache, or ``output`` when one was given
    key: str  # sha256 of every input of the build
    cached: bool
    seconds: float
    language: str  # a key of LANGUAGE_NAMES
    toolchain: str  # the compiler's version line


def language_of(source: Path) -> str | None:
    """The guest language of ``source``, or None (a Python workflow, or unknown)."""
    if source.name == "Cargo.toml" or (source.is_dir() and (source / "Cargo.toml").is_file()):
        return "cargo"
    return {".rs": "rust", ".c": "c", ".zig": "zig", ".ts": "assemblyscript"}.get(source.suffix)


def cache_dir() -> Path:
    """``$CLEAT_GUEST_CACHE``, else ``$XDG_CACHE_HOME/cleat/guest-modules``, else
    ``~/.cache/cleat/guest-modules``: outside any checkout, so CI runs share it."""
    explicit = os.environ.get("CLEAT_GUEST_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cleat" / "guest-modules"


# --- toolchains -------------------------------------------------------------------------------


def _run(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a compiler; its output, or BuildError with what it printed."""
    try:
        proc = subprocess.run(
            command,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise BuildError(f"{command[0]}: not found") from None
    except subprocess.TimeoutExpired:
        raise BuildError(
            f"{Path(command[0]).name} did not finish within {BUILD_TIMEOUT_S} s"
        ) from None
    if proc.returncode != 0:
        output = (proc.stderr + proc.stdout).strip() or f"exit status {proc.returncode}"
        raise BuildError(output)
    return proc.stdout + proc.stderr


def rustc() -> str:
    explicit = os.environ.get("CLEAT_RUSTC")
    if explicit:
        return explicit
    if Path("/usr/bin/rustc").exists():
        return "/usr/bin/rustc"
    raise BuildError(
        "Rust workflows are built with Debian's rustc and its wasm32 standard library: "
        "apt-get install rustc libstd-rust-dev-wasm32 (or set CLEAT_RUSTC)"
    )


def zig() -> list[str]:
    """``python -m ziglang`` of this interpreter (the PyPI package), else ``zig``."""
    try:
        import ziglang  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        found = shutil.which("zig")
        if found:
            return [found]
        raise BuildError(
            "C and Zig workflows are built with zig: pip install -r requirements-build.txt"
        ) from None
    return [sys.executable, "-m", "ziglang"]


def asc() -> list[str]:
    local = AS_SDK / "node_modules" / ".bin" / "asc"
    if local.exists():
        return [str(local)]
    found = shutil.which("asc")
    if found:
        return [found]
    raise BuildError(
        "AssemblyScript workflows are built with asc: run `npm ci` in sdk/assemblyscript"
    )


@functools.cache
def toolchain_version(language: str) -> str:
    """The version line of the compiler ``language`` is built with (part of the key)."""
    if language in ("rust", "cargo"):
        return _run([rustc(), "--version"]).strip()
    if language in ("c", "zig"):
        return "zig " + _run([*zig(), "version"]).strip()
    if language == "assemblyscript":
        return "asc " + _run([*asc(), "--version"]).strip().split()[-1]
    raise BuildError(f"unknown language {language!r}")


def _rustc_needs_bootstrap(version: str) -> bool:
    """Before Rust 1.68 a ``no_std`` binary with ``alloc`` needs the (then unstable) default
    allocation-error handler; Debian bookworm ships 1.63."""
    m = re.search(r"rustc (\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) < (1, 68)


# --- what goes into a build -------------------------------------------------------------------


def _files(directory: Path, patterns: Iterable[str]) -> list[Path]:
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in directory.rglob(pattern) if p.is_file())
    skip = ("node_modules", "target", ".zig-cache", "zig-cache", "zig-out")
    return sorted(p for p in found if not any(part in skip for part in p.parts))


def _inputs(language: str, source: Path) -> list[tuple[str, Path]]:
    """(label, file) of every file a build reads besides the toolchain."""
    if language == "cargo":
        project = source if source.is_dir() else source.parent
        own = _files(project, ["*.rs", "*.toml", "*.lock"])
        sdk = _files(RUST_SDK, ["*.rs", "*.toml"])
        return [("src", p) for p in own] + [("sdk", p) for p in sdk]
    patterns, sdk_dir, sdk_patterns = {
        "rust": (["*.rs"], RUST_SDK, ["*.rs", "*.toml"]),
        "c": (["*.h"], C_SDK, ["*.c", "*.h"]),
        "zig": (["*.zig"], ZIG_SDK, ["*.zig"]),
        "assemblyscript": (["*.ts"], AS_SDK / "assembly", ["*.ts"]),
    }[language]
    # The source, and the files beside it it may include (headers, modules), not below.
    beside = sorted(p for pattern in patterns for p in source.parent.glob(pattern) if p.is_file())
    own = sorted({source, *beside})
    return [("src", p) for p in own] + [("sdk", p) for p in _files(sdk_dir, sdk_patterns)]


def build_key(language: str, source: Path) -> str:
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\x00{len(data)}\x00".encode())
        digest.update(data)

    add("recipe", str(RECIPE_VERSION).encode())
    add("language", language.encode())
    add("toolchain", toolchain_version(language).encode())
    add("name", source.name.encode())
    base = source if source.is_dir() else source.parent
    for label, path in _inputs(language, source):
        root = base if label == "src" else SDK
        with contextlib.suppress(ValueError):
            label = f"{label}:{path.relative_to(root)}"
        add(label, path.read_bytes())
    return digest.hexdigest()


# --- building ---------------------------------------------------------------------------------


def build(
    source: Path | str,
    output: Path | str | None = None,
    *,
    cache: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """Build ``source`` into a core module; the cached module (copied to ``output`` too when
    given). ``progress`` receives a line per stage. Raises BuildError."""
    started = time.monotonic()
    say = progress or (lambda line: None)
    source = Path(source).resolve()
    language = language_of(source)
    if language is None:
        raise BuildError(f"{source}: not a Rust, C, Zig or AssemblyScript workflow")
    if not source.exists():
        raise BuildError(f"{source}: no such file")
    toolchain = toolchain_version(language)
    key = build_key(language, source)
    directory = cache or cache_dir()
    cached = directory / f"{key}.wasm"
    hit = cached.is_file() and not force
    if hit:
        say(f"{LANGUAGE_NAMES[language]}: {source.name} is in the build cache")
        with contextlib.suppress(OSError):
            os.utime(cached)
    else:
        say(f"{LANGUAGE_NAMES[language]}: building {source.name} with {toolchain}")
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="cleat-guest-") as tmp:
            out = Path(tmp) / "module.wasm"
            BUILDERS[language](source, out, Path(tmp), toolchain, say)
            if not out.is_file():
                raise BuildError(f"{source.name}: the compiler wrote no module")
            fd, partial = tempfile.mkstemp(dir=directory, suffix=".part")
            os.close(fd)
            shutil.copyfile(out, partial)
            os.replace(partial, cached)
    if output is not None:
        target = Path(output)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, target)
    seconds = time.monotonic() - started
    if not hit:
        say(f"done in {seconds:.1f} s")
    return BuildResult(
        path=Path(output) if output is not None else cached,
        key=key,
        cached=hit,
        seconds=seconds,
        language=language,
        toolchain=toolchain,
    )


def _build_rust(source: Path, out: Path, tmp: Path, toolchain: str, say: Progress) -> None:
    compiler = rustc()
    env: dict[str, str] = {}
    extra: list[str] = []
    if _rustc_needs_bootstrap(toolchain):
        env["RUSTC_BOOTSTRAP"] = "1"
        extra = ["-Zcrate-attr=feature(default_alloc_error_handler)"]
    common = [
        "--edition=2021",
        "--target=wasm32-unknown-unknown",
        "-Copt-level=s",
        "-Ccodegen-units=1",
    ]
    say("compiling the cleat crate (sdk/rust/cleat)")
    rlib = tmp / "libcleat.rlib"
    _run(
        [
            compiler,
            *common,
            "--crate-type=rlib",
            "--crate-name=cleat",
            '--cfg=feature="runtime"',
            str(RUST_SDK / "src" / "lib.rs"),
            "-o",
            str(rlib),
        ],
        env=env,
    )
    say(f"compiling and linking {source.name}")
    name = re.sub(r"\W", "_", source.stem) or "workflow"
    _run(
        [
            compiler,
            *common,
            *extra,
            "--crate-type=cdylib",
            f"--crate-name={name}",
            "-Clto",
            "-Cstrip=symbols",
            f"--extern=cleat={rlib}",
            f"-L{tmp}",
            str(source),
            "-o",
            str(out),
        ],
        env=env,
    )


def _build_cargo(source: Path, out: Path, tmp: Path, toolchain: str, say: Progress) -> None:
    project = source if source.is_dir() else source.parent
    # Debian's cargo goes with Debian's rustc (a rustup cargo asks rustc for newer things).
    debian = "/usr/bin/cargo" if Path("/usr/bin/cargo").exists() else None
    cargo = os.environ.get("CLEAT_CARGO") or debian or shutil.which("cargo")
    if cargo is None:
        raise BuildError("a Cargo.toml project needs cargo: apt-get install cargo")
    env = {"RUSTC": rustc(), "CARGO_TARGET_DIR": str(tmp / "target")}
    if _rustc_needs_bootstrap(toolchain):
        env["RUSTC_BOOTSTRAP"] = "1"
        env["RUSTFLAGS"] = "-Zcrate-attr=feature(default_alloc_error_handler) -Cstrip=symbols"
    say(f"cargo build --release --target wasm32-unknown-unknown ({project})")
    _run(
        [
            cargo,
            "build",
            "--release",
            "--offline",
            "--target",
            "wasm32-unknown-unknown",
            "--manifest-path",
            str(project / "Cargo.toml"),
        ],
        env=env,
    )
    built = sorted((tmp / "target" / "wasm32-unknown-unknown" / "release").glob("*.wasm"))
    if len(built) != 1:
        raise BuildError(
            f"cargo built {len(built)} .wasm files; a workflow crate builds one cdylib"
        )
    shutil.copyfile(built[0], out)


def _build_c(source: Path, out: Path, tmp: Path, toolchain: str, say: Progress) -> None:
    say(f"zig cc -target wasm32-freestanding {source.name} sdk/c/cleat.c")
    _run(
        [
            *zig(),
            "cc",
            "-target",
            "wasm32-freestanding",
            "-Os",
            "-nostdlib",
            "-std=c11",
            "-Wall",
            "-Werror=implicit-function-declaration",
            f"-I{C_SDK}",
            "-Wl,--no-entry",
            "-Wl,--strip-all",
            str(source),
            str(C_SDK / "cleat.c"),
            "-o",
            str(out),
        ],
        env={"ZIG_GLOBAL_CACHE_DIR": str(_zig_cache()), "ZIG_LOCAL_CACHE_DIR": str(tmp / "zc")},
    )


def _build_zig(source: Path, out: Path, tmp: Path, toolchain: str, say: Progress) -> None:
    say(f"zig build-exe -target wasm32-freestanding {source.name}")
    _run(
        [
            *zig(),
            "build-exe",
            "-target",
            "wasm32-freestanding",
            "-O",
            "ReleaseSmall",
            "-fno-entry",
            "-rdynamic",
            "-fstrip",
            f"-femit-bin={out}",
            "--dep",
            "cleat",
            f"-Mroot={source}",
            f"-Mcleat={ZIG_SDK / 'cleat.zig'}",
        ],
        cwd=tmp,
        env={"ZIG_GLOBAL_CACHE_DIR": str(_zig_cache()), "ZIG_LOCAL_CACHE_DIR": str(tmp / "zc")},
    )


def _build_assemblyscript(
    source: Path, out: Path, tmp: Path, toolchain: str, say: Progress
) -> None:
    say(f"asc {source.name} --runtime stub --optimize")
    _run(
        [
            *asc(),
            str(source),
            "--outFile",
            str(out),
            "--runtime",
            "stub",
            "--optimize",
            "--noAssert",
            "--use",
            "abort=",
            "--path",
            str(AS_SDK / "node_modules"),
        ],
        cwd=source.parent,
    )


def _zig_cache() -> Path:
    """zig's own compile cache (compiler-rt and the like), beside the module cache."""
    return cache_dir() / "zig-cache"


BUILDERS: dict[str, Callable[[Path, Path, Path, str, Progress], None]] = {
    "rust": _build_rust,
    "cargo": _build_cargo,
    "c": _build_c,
    "zig": _build_zig,
    "assemblyscript": _build_assemblyscript,
}
