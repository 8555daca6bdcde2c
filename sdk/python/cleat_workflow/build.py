"""Build a Python workflow module into a WebAssembly component (host side, never bundled).

``build_component(Path("app.py"))`` runs componentize-py against the WIT world in
``sdk/wit`` and caches the result by the hash of everything that goes into it: the app and
the local modules it imports, the guest SDK, the WIT files, the componentize-py version and
this recipe's version. An unchanged app is never built twice on a machine (a build takes a
minute); a clean machine builds it with componentize-py from PyPI
(``requirements-build.txt``).

Failures of guest code are reported the way Python reports them, with the app's real paths:
``app.py:12: SyntaxError: invalid syntax`` and the traceback, not componentize-py's Rust
backtrace.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

SDK_PACKAGE_DIR = Path(__file__).resolve().parent
SDK_PYTHON_DIR = SDK_PACKAGE_DIR.parent
WIT_DIR = SDK_PYTHON_DIR.parent / "wit"
WORLD = "workflow-batch"
# Bump when the generated entry module or the componentize-py invocation changes.
RECIPE_VERSION = 2
ENTRY_MODULE = "cleat_entry__"
# Host-side modules of the SDK: not part of a component, so not part of its hash.
HOST_ONLY = frozenset({"build.py", "testing.py"})
RESERVED_MODULES = frozenset({"wit_world", "cleat_workflow", ENTRY_MODULE, "poll_loop"})
BUILD_TIMEOUT_S = 900
# How often a running build reports that it is still running.
PROGRESS_EVERY_S = 5.0
Progress = Callable[[str], None]
# The cache keeps the most recently used builds within this many bytes (a Python component
# is 20-40 MB); ``$CLEAT_COMPONENT_CACHE_MAX_MB`` overrides it, 0 turns pruning off.
DEFAULT_CACHE_MAX_BYTES = 2 * 1024**3


class BuildError(Exception):
    """The component could not be built; the message says why, in the app's terms."""


class GuestCodeError(BuildError):
    """The app's own code failed at build time (syntax error, exception at import): the
    same inputs always fail the same way, so the failure is cached like a build."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# Stands for the app's directory in a cached failure message.
_APP_DIR = "\x00app-dir\x00"


@dataclass(frozen=True)
class BuildResult:
    path: Path  # the component in the cache (or ``output`` when one was given)
    key: str  # the cache key: sha256 of every input of the build
    cached: bool  # True when no build was needed
    seconds: float
    sources: tuple[Path, ...]  # the app and the local modules it imports


def cache_dir() -> Path:
    """``$CLEAT_COMPONENT_CACHE``, else ``$XDG_CACHE_HOME/cleat/components``, else
    ``~/.cache/cleat/components``: outside any checkout, so CI runs share it."""
    explicit = os.environ.get("CLEAT_COMPONENT_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cleat" / "components"


def cache_max_bytes() -> int:
    """The cache's size budget: ``$CLEAT_COMPONENT_CACHE_MAX_MB`` (0: unlimited), else 2 GiB."""
    raw = os.environ.get("CLEAT_COMPONENT_CACHE_MAX_MB", "").strip()
    if not raw:
        return DEFAULT_CACHE_MAX_BYTES
    try:
        megabytes = int(raw)
    except ValueError:
        raise BuildError(
            f"CLEAT_COMPONENT_CACHE_MAX_MB must be a whole number of megabytes, not {raw!r}"
        ) from None
    if megabytes < 0:
        raise BuildError("CLEAT_COMPONENT_CACHE_MAX_MB must not be negative")
    return megabytes * 1024 * 1024


@dataclass(frozen=True)
class PruneResult:
    removed: tuple[str, ...]  # cache keys removed, least recently used first
    freed_bytes: int
    kept_bytes: int


def _entry_key(path: Path) -> str | None:
    name = path.name
    for suffix in (".error.json", ".wasm", ".json"):
        if name.endswith(suffix) and len(name) == 64 + len(suffix):
            return name[:64]
    return None


# Builds used more recently than this are never pruned: another process may have just
# found one in the cache and be about to read it.
PRUNE_GRACE_S = 600.0


def prune_cache(
    directory: Path | None = None,
    max_bytes: int | None = None,
    *,
    keep: Sequence[str] = (),
    grace_s: float = PRUNE_GRACE_S,
) -> PruneResult:
    """Remove the least recently used builds until the cache holds at most ``max_bytes``
    (default :func:`cache_max_bytes`; 0 means no limit). A build is its component, its
    metadata and any cached failure; "used" is the newest modification time among them (a
    cache hit touches the component). ``keep`` names keys never removed (the build just
    made), and builds used within ``grace_s`` stay too. Leftover partial files older than a
    day go. Files of other names are not touched."""
    directory = directory or cache_dir()
    limit = cache_max_bytes() if max_bytes is None else max_bytes
    if not directory.is_dir():
        return PruneResult((), 0, 0)
    entries: dict[str, list[Path]] = {}
    now = time.time()
    for path in directory.iterdir():
        if path.suffix == ".part" and path.is_file():
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime > 86400:
                    path.unlink()
            continue
        key = _entry_key(path)
        if key is not None and path.is_file():
            entries.setdefault(key, []).append(path)
    sized: list[tuple[float, str, int, list[Path]]] = []
    for key, paths in entries.items():
        stats = []
        for path in paths:
            try:
                stats.append(path.stat())
            except FileNotFoundError:
                continue
        if stats:
            used = max(st.st_mtime for st in stats)
            sized.append((used, key, sum(st.st_size for st in stats), paths))
    total = sum(size for _, _, size, _ in sized)
    removed: list[str] = []
    freed = 0
    if limit > 0:
        for used, key, size, paths in sorted(sized):
            if total <= limit:
                break
            if key in keep or now - used < grace_s:
                continue
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            removed.append(key)
            total -= size
            freed += size
    return PruneResult(tuple(removed), freed, total)


def componentize_py_version() -> str:
    try:
        return importlib.metadata.version("componentize-py")
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(
            "componentize-py is not installed: pip install -r requirements-build.txt"
        ) from None


def _componentize_py() -> list[str]:
    beside = Path(sys.executable).parent / "componentize-py"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("componentize-py")
    if found:
        return [found]
    raise BuildError("componentize-py is not installed: pip install -r requirements-build.txt")


# --- what goes into a build -----------------------------------------------------------------


def _imported_names(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError):
        return set()  # newer syntax than this Python's, or broken: the build will say
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def source_files(app: Path) -> tuple[Path, ...]:
    """The app and the modules it imports (transitively) from its own directory."""
    app = app.resolve()
    root = app.parent
    found: list[Path] = []
    seen: set[Path] = set()
    queue = [app]
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        found.append(path)
        for name in sorted(_imported_names(path)):
            module = root / f"{name}.py"
            package = root / name
            if module.is_file():
                queue.append(module)
            elif (package / "__init__.py").is_file():
                queue.extend(sorted(package.rglob("*.py")))
    return tuple(sorted(found))


def _sdk_files() -> list[Path]:
    return sorted(p for p in SDK_PACKAGE_DIR.glob("*.py") if p.name not in HOST_ONLY)


def build_key(app: Path, sources: Sequence[Path], python_path: Sequence[Path] = ()) -> str:
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\x00{len(data)}\x00".encode())
        digest.update(data)

    add("recipe", str(RECIPE_VERSION).encode())
    add("componentize-py", componentize_py_version().encode())
    add("app", app.resolve().stem.encode())
    root = app.resolve().parent
    for path in sources:
        add(f"src:{path.relative_to(root)}", path.read_bytes())
    for path in _sdk_files():
        add(f"sdk:{path.name}", path.read_bytes())
    for path in sorted(WIT_DIR.rglob("*.wit")):
        add(f"wit:{path.relative_to(WIT_DIR)}", path.read_bytes())
    for extra in python_path:
        add("path", str(Path(extra).resolve()).encode())
    return digest.hexdigest()


# --- building -------------------------------------------------------------------------------


def build_component(
    app: Path | str,
    output: Path | str | None = None,
    *,
    cache: Path | None = None,
    python_path: Sequence[Path | str] = (),
    force: bool = False,
    progress: Progress | None = None,
) -> BuildResult:
    """Build ``app`` (a Python file with ``@workflow`` functions) into a component.

    Returns the cached component (copied to ``output`` too when given). Raises BuildError
    with a readable message when the app cannot be built. A build that is not in the cache
    takes tens of seconds: ``progress`` (default: a line on stderr) is told when it starts,
    every :data:`PROGRESS_EVERY_S` seconds while componentize-py runs, and when it ends; a
    cache hit tells it nothing.
    """
    started = time.monotonic()
    app = Path(app).resolve()
    if not app.is_file():
        raise BuildError(f"{app}: no such file")
    if app.suffix != ".py":
        raise BuildError(f"{app}: a workflow module is a .py file")
    module = app.stem
    if not module.isidentifier() or module in RESERVED_MODULES:
        raise BuildError(
            f"{app.name}: the module name {module!r} cannot be used for a workflow module "
            "(it must be a Python identifier, and not wit_world, cleat_workflow, poll_loop)"
        )
    extra = [Path(p).resolve() for p in python_path]
    sources = source_files(app)
    key = build_key(app, sources, extra)
    directory = cache or cache_dir()
    budget = cache_max_bytes()  # a bad setting fails now, not after a long build
    cached = directory / f"{key}.wasm"
    failure = directory / f"{key}.error.json"
    if failure.is_file() and not force:
        # The same inputs failed before, in the guest's code: the same error, at once.
        message = json.loads(failure.read_text())["message"]
        raise BuildError(message.replace(_APP_DIR, str(app.parent)))
    hit = cached.is_file() and not force
    if hit:
        # Most recently used: the last the pruning removes (a read-only cache still serves).
        with contextlib.suppress(OSError):
            os.utime(cached)
    else:
        say = progress or _to_stderr
        say(
            f"building {app.name} into a component with componentize-py (not in the build "
            f"cache {directory}: this takes a while, about 20 s or more; the same sources "
            "are built once)"
        )
        try:
            _componentize(app, module, extra, directory, cached, say)
        except GuestCodeError as exc:
            text = json.dumps({"message": exc.message.replace(str(app.parent), _APP_DIR)})
            _write_text(failure, text)
            raise BuildError(exc.message) from None
        prune_cache(directory, budget, keep=[key])
        say(f"built {app.name} in {time.monotonic() - started:.0f} s")
    if output is not None:
        target = Path(output)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cached, target)
    return BuildResult(
        path=Path(output) if output is not None else cached,
        key=key,
        cached=hit,
        seconds=time.monotonic() - started,
        sources=sources,
    )


def _to_stderr(message: str) -> None:
    print(f"cleat: {message}", file=sys.stderr, flush=True)


def _componentize(
    app: Path,
    module: str,
    extra: Sequence[Path],
    directory: Path,
    cached: Path,
    progress: Progress | None = None,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cleat-build-") as tmp:
        generated = Path(tmp) / "entry"
        generated.mkdir()
        (generated / f"{ENTRY_MODULE}.py").write_text(
            "# Generated by cleat's build: the world's exports, then the workflows.\n"
            "from cleat_workflow._guest import WitWorld as WitWorld\n"
            f"import {module}  # noqa: F401\n"
        )
        search = [generated, app.parent, SDK_PYTHON_DIR, *extra]
        out = Path(tmp) / "component.wasm"
        command = [*_componentize_py(), "-d", str(WIT_DIR), "-w", WORLD, "componentize"]
        for entry in search:
            command += ["-p", str(entry)]
        command += ["-o", str(out), ENTRY_MODULE]
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        env["RUST_BACKTRACE"] = "0"
        returncode, output = _run_reporting(command, generated, env, progress)
        if returncode != 0 or not out.is_file():
            message = readable_error(output, search, generated)
            if guest_traceback(output) is not None:
                raise GuestCodeError(message)
            raise BuildError(message)
        fd, partial = tempfile.mkstemp(dir=directory, suffix=".part")
        os.close(fd)
        shutil.copyfile(out, partial)
        os.replace(partial, cached)
        meta = {
            "app": str(app),
            "componentize_py": componentize_py_version(),
            "recipe": RECIPE_VERSION,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        _write_text(cached.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")


def _run_reporting(
    command: Sequence[str], cwd: Path, env: dict[str, str], progress: Progress | None
) -> tuple[int, str]:
    """Run componentize-py to the end (its output in a file, which nobody has to drain),
    telling ``progress`` how long it has been running every :data:`PROGRESS_EVERY_S` s."""
    started = time.monotonic()
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                try:
                    proc.wait(timeout=PROGRESS_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - started
                    if elapsed > BUILD_TIMEOUT_S:
                        proc.kill()
                        proc.wait()
                        raise BuildError(
                            f"componentize-py did not finish within {BUILD_TIMEOUT_S} s"
                        ) from None
                    if progress is not None:
                        progress(f"  still building, {elapsed:.0f} s")
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        log.seek(0)
        output = log.read()
    if progress is not None:
        done = "done" if proc.returncode == 0 else "failed"
        progress(f"  componentize-py {done} after {time.monotonic() - started:.0f} s")
    return proc.returncode, output


def _write_text(path: Path, text: str) -> None:
    fd, partial = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(partial, path)


# --- readable errors --------------------------------------------------------------------------

_TRACEBACK = "Traceback (most recent call last):\n"
_FRAME = re.compile(r'^  File "/(\d+)/([^"]*)", line (\d+)', re.M)


def guest_traceback(output: str) -> str | None:
    """The traceback of the app's code in componentize-py's output (it imports the app
    while it builds), or None when the build failed for another reason."""
    starts = [m.start() for m in re.finditer(re.escape(_TRACEBACK), output)]
    found = None
    for index, start in enumerate(starts):
        end = starts[index + 1] if index + 1 < len(starts) else len(output)
        block = output[start:end]
        first_frame = block.split("\n", 2)[1] if "\n" in block else ""
        if "componentize-py" not in first_frame:
            found = re.split(r"\n\s*\nCaused by:|\nStack backtrace:", block)[0]
    return found.rstrip() if found is not None else None


def readable_error(output: str, search: Sequence[Path], generated: Path) -> str:
    """The guest's Python traceback from componentize-py's output, with real paths and a
    ``file:line: Error: message`` headline; else the first lines of its error chain."""
    guest = guest_traceback(output)
    if guest is not None:

        def real_path(m: re.Match[str]) -> str:
            index = int(m.group(1))
            base = search[index] if index < len(search) else Path(f"/{index}")
            return f'  File "{base / m.group(2)}", line {m.group(3)}'

        guest = _FRAME.sub(real_path, guest)
        lines = guest.splitlines()
        kept: list[str] = []
        skip = False
        for line in lines:
            if line.startswith('  File "'):
                skip = str(generated) in line
            elif not line.startswith("    "):
                skip = False
            if not skip:
                kept.append(line)
        frames = [line for line in kept if line.startswith('  File "')]
        # The headline names the innermost frame of the app's own code, not the SDK's (a
        # typed service declaration is checked inside the SDK).
        own = [line for line in frames if "/cleat_workflow/" not in line]
        frames = own or frames
        error = kept[-1] if kept else "error"
        where = ""
        if frames:
            m = re.match(r'  File "([^"]*)", line (\d+)', frames[-1])
            if m:
                where = f"{m.group(1)}:{m.group(2)}: "
        return f"{where}{error}\n\n" + "\n".join(kept)
    lines = [
        line
        for line in output.splitlines()
        if line.strip() and not re.match(r"\s+\d+: |\s+at ", line)
    ]
    if "Caused by:" in lines:
        lines = lines[lines.index("Caused by:") + 1 :]
    text = "\n".join(lines[:8]).strip() or "componentize-py failed without a message"
    return f"componentize-py failed: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cleat_workflow.build app.py -o app.wasm`` (without Django)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("app")
    parser.add_argument("-o", "--output")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = build_component(args.app, args.output, force=args.force)
    except BuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    how = "cached" if result.cached else f"built in {result.seconds:.1f} s"
    print(f"{result.path} ({how}, key {result.key[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
