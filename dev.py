#!/usr/bin/env python3
"""Set up and run cleat from a fresh checkout. Needs only Python 3.11+.

    python3 dev.py up      # venv + deps, migrate, demo workflow, then admin + worker
    python3 dev.py test    # venv + dev deps, services, ruff, mypy, the whole test suite

Each command is idempotent: the virtual environment lives in ``.venv`` and is only
re-installed when a requirements file changes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("CLEAT_VENV", ROOT / ".venv"))
PY = VENV / "bin" / "python"


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def run(cmd: list[str | Path], *, env: dict[str, str] | None = None, check: bool = True) -> int:
    merged = {**os.environ, **(env or {})}
    proc = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=merged)
    if check and proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(str(c) for c in cmd)}")
    return proc.returncode


def ensure_venv(requirements: list[str]) -> None:
    """Create ``.venv`` and install ``requirements`` unless they are already installed."""
    if not PY.exists():
        say(f"creating virtual environment in {VENV}")
        venv.create(VENV, with_pip=True)
    digest = hashlib.sha256()
    for name in requirements:
        for req in _with_includes(ROOT / name):
            digest.update(req.read_bytes())
    stamp = VENV / f".cleat-{'-'.join(Path(r).stem for r in requirements)}"
    if stamp.exists() and stamp.read_text() == digest.hexdigest():
        return
    say(f"installing {', '.join(requirements)}")
    args: list[str | Path] = [PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for name in requirements:
        args += ["-r", ROOT / name]
    run(args)
    stamp.write_text(digest.hexdigest())


def _with_includes(path: Path) -> list[Path]:
    found = [path]
    for line in path.read_text().splitlines():
        if line.startswith("-r "):
            found += _with_includes(path.parent / line[3:].strip())
    return found


def cmd_up(args: argparse.Namespace) -> None:
    ensure_venv(["requirements.txt"])
    env = {"DEBUG": os.environ.get("DEBUG", "1")}
    say("applying migrations (SQLite in the project folder unless DATABASE_URL is set)")
    run([PY, "manage.py", "migrate", "--noinput"], env=env)
    say("running the demo workflow")
    run([PY, "manage.py", "demo"], env=env)
    if args.no_serve:
        return
    say(f"admin at http://127.0.0.1:{args.port}/admin/  (Ctrl-C stops)")
    run([PY, "manage.py", "runserver", f"127.0.0.1:{args.port}"], env=env, check=False)


def ensure_mysql_client_headers() -> None:
    """mysqlclient compiles against the MariaDB client library (Debian: libmariadb-dev)."""
    if shutil.which("mariadb_config") or shutil.which("mysql_config"):
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        sys.exit(
            "the MariaDB tests need the MariaDB client headers: install libmariadb-dev "
            "(Debian/Ubuntu) or mariadb-connector-c-devel, then run this again"
        )
    say("installing libmariadb-dev and pkg-config (for mysqlclient)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "libmariadb-dev", "pkg-config"], env=env)


def ensure_chromium() -> None:
    """The browser tests (tests/browser) drive Debian's chromium through chromedriver."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        sys.exit(
            "the browser tests need Chromium and its driver: install chromium and "
            "chromium-driver (Debian/Ubuntu), then run this again"
        )
    say("installing chromium and chromium-driver (for the browser tests)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], env=env)


def ensure_rust_wasm32() -> None:
    """Rust workflows (sdk/rust, tests/*/test_guest_sdks*) are built with Debian's rustc and
    its wasm32 standard library: a rustup toolchain has no wasm32-unknown-unknown std."""
    wasm32_std = Path("/usr/lib/rustlib/wasm32-unknown-unknown")
    if Path("/usr/bin/rustc").exists() and Path("/usr/bin/cargo").exists() and wasm32_std.is_dir():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        sys.exit(
            "the guest SDK tests need Debian's Rust for wasm32: install rustc, cargo and "
            "libstd-rust-dev-wasm32 (Debian/Ubuntu), then run this again"
        )
    say("installing rustc, cargo and libstd-rust-dev-wasm32 (for the Rust workflow SDK)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "rustc", "cargo", "libstd-rust-dev-wasm32"], env=env)


AS_SDK = ROOT / "sdk" / "assemblyscript"


def ensure_assemblyscript() -> None:
    """AssemblyScript workflows are built with asc from sdk/assemblyscript's lock file
    (``npm ci``), re-installed only when the lock file changes."""
    lock = AS_SDK / "package-lock.json"
    stamp = AS_SDK / "node_modules" / ".cleat-lock"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    if shutil.which("npm") is None:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            sys.exit(
                "the AssemblyScript SDK tests need npm: install Node.js and npm, then run "
                "this again"
            )
        say("installing npm (for the AssemblyScript workflow SDK)")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "npm"], env=env)
    say("installing assemblyscript (npm ci in sdk/assemblyscript)")
    npm = ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", AS_SDK]
    run(npm)
    stamp.write_text(digest)


def cmd_test(args: argparse.Namespace) -> None:
    ensure_mysql_client_headers()
    ensure_chromium()
    ensure_rust_wasm32()
    ensure_assemblyscript()
    ensure_venv(["requirements-dev.txt", "requirements-mysql.txt"])
    failures: list[str] = []

    def step(name: str, cmd: list[str | Path], env: dict[str, str] | None = None) -> None:
        say(name)
        if run(cmd, env=env, check=False) != 0:
            failures.append(name)

    if args.pytest_args:
        step("pytest", [PY, "-m", "pytest", *args.pytest_args])
    else:
        say("starting local services (PostgreSQL, MariaDB)")
        run(["bash", ROOT / "scripts" / "services.sh", "postgres", "mariadb"])
        # Python components are ~20 MB; MariaDB's default statement limit is 16 MB.
        run(
            [
                "mysql",
                "-h",
                "127.0.0.1",
                "-u",
                "root",
                "-e",
                "SET GLOBAL max_allowed_packet=268435456",
            ]
        )
        step("ruff check", [PY, "-m", "ruff", "check", "."])
        step("ruff format --check", [PY, "-m", "ruff", "format", "--check", "."])
        step("mypy engine/", [PY, "-m", "mypy"])
        # Everything on SQLite; the database-facing suites again on the real servers (they
        # fail, not skip, when a server is missing).
        step("pytest (SQLite)", [PY, "-m", "pytest", "-m", "not postgres_only"])
        step(
            "pytest (PostgreSQL, as the RLS-bound application role)",
            [PY, "-m", "pytest", "tests/integration", "-p", "no:cacheprovider"],
            env={"CLEAT_TEST_DB": "postgres"},
        )
        step(
            "pytest (MariaDB)",
            [
                PY,
                "-m",
                "pytest",
                "tests/integration",
                "-m",
                "not postgres_only",
                "-p",
                "no:cacheprovider",
            ],
            env={"CLEAT_TEST_DB": "mariadb"},
        )
    if failures:
        sys.exit(f"FAILED: {', '.join(failures)}")
    say("all checks passed")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="set up, migrate, run the demo, then serve the admin")
    up.add_argument("--no-serve", action="store_true", help="stop after the demo workflow")
    up.add_argument("--port", type=int, default=8000)
    up.set_defaults(func=cmd_up)
    test = sub.add_parser("test", help="set up and run lint, type checks and all tests")
    test.add_argument("pytest_args", nargs="*", help="passed to pytest (skips lint when given)")
    test.set_defaults(func=cmd_test)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
