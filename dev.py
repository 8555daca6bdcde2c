#!/usr/bin/env python3
"""Set up and run cleat from a fresh checkout. Needs only Python 3.11+.

    python3 dev.py up      # venv + deps, .env, migrate, admin user, demo, then admin + worker
    python3 dev.py test    # venv + dev deps, services, ruff, mypy, the whole test suite

Each command is idempotent: the virtual environment lives in ``.venv`` and is only
re-installed when a requirements file changes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
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


# What the local set-up writes into .env (git-ignored) when it is missing there, so that
# every `manage.py` command of the docs works after `dev.py up` without exporting anything.
DOTENV = ROOT / ".env"
DOTENV_HEADER = """\
# Written by `python3 dev.py up` for local development (git-ignored: never commit it).
# Settings read it for anything the environment does not set; edit it freely, dev.py only
# adds what is missing. Production sets these in the environment instead (docs/production.md).
"""


def dotenv_defaults() -> dict[str, str]:
    return {
        "DEBUG": "1",
        "SECRET_KEY": secrets.token_urlsafe(50),
        # The password of the `admin` superuser `manage.py ensure_admin` creates.
        "CLEAT_ADMIN_PASSWORD": secrets.token_urlsafe(12),
        # The demo workflow's service, so the worker beside the admin completes its runs.
        "CLEAT_SERVICES": """'{"demo": "workflows.demo"}'""",
    }


def read_dotenv(path: Path = DOTENV) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped; one pair of quotes removed)."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep or key.startswith("#"):
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def ensure_dotenv(path: Path = DOTENV) -> dict[str, str]:
    """Add to ``.env`` the local settings it lacks (creating it); returns its values."""
    present = read_dotenv(path)
    missing = {k: v for k, v in dotenv_defaults().items() if k not in present}
    if missing:
        text = path.read_text() if path.is_file() else DOTENV_HEADER
        if text and not text.endswith("\n"):
            text += "\n"
        text += "".join(f"{key}={value}\n" for key, value in missing.items())
        path.write_text(text)
        path.chmod(0o600)
        say(f"wrote {', '.join(missing)} to {path.name} (git-ignored)")
    return read_dotenv(path)


def cmd_up(args: argparse.Namespace) -> None:
    ensure_venv(["requirements.txt"])
    settings = ensure_dotenv()
    say("applying migrations (SQLite in the project folder unless DATABASE_URL is set)")
    run([PY, "manage.py", "migrate", "--noinput"])
    say("making sure the admin user exists")
    run([PY, "manage.py", "ensure_admin"])
    say("running the demo workflow")
    run([PY, "manage.py", "demo"])
    url = f"http://127.0.0.1:{args.port}/admin/"
    password = os.environ.get("CLEAT_ADMIN_PASSWORD") or settings.get("CLEAT_ADMIN_PASSWORD")
    login = f"log in at {url} as admin, password {password} (CLEAT_ADMIN_PASSWORD in .env)"
    if args.no_serve:
        say(login.replace("log in at", "after `manage.py runserver`, log in at"))
        return
    say("starting a worker (manage.py runworker) beside the admin")
    worker = subprocess.Popen([str(PY), "manage.py", "runworker"], cwd=ROOT)
    try:
        say(login)
        say("Ctrl-C stops the admin and the worker")
        run([PY, "manage.py", "runserver", f"127.0.0.1:{args.port}"], check=False)
    except KeyboardInterrupt:
        pass
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


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


# Each pass ends with its slowest tests, to keep the whole run's time in view.
SLOWEST = ["--durations=15", "--durations-min=5"]


def cmd_test(args: argparse.Namespace) -> None:
    ensure_mysql_client_headers()
    ensure_chromium()
    ensure_rust_wasm32()
    ensure_assemblyscript()
    ensure_venv(["requirements-dev.txt", "requirements-mysql.txt"])
    # The suite starts a few hundred Python processes (workers, manage.py commands): each
    # would compile the project's modules again where bytecode caching is turned off.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    failures: list[str] = []

    def step(name: str, cmd: list[str | Path], env: dict[str, str] | None = None) -> None:
        say(name)
        if run(cmd, env=env, check=False) != 0:
            failures.append(name)

    if args.pytest_args:
        step("pytest", [PY, "-m", "pytest", *args.pytest_args])
    else:
        # The Celery tests use RabbitMQ and Redis as brokers.
        say("starting local services (PostgreSQL, MariaDB, Redis, RabbitMQ)")
        run(["bash", ROOT / "scripts" / "services.sh", "postgres", "mariadb", "redis", "rabbitmq"])
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
        step("pytest (SQLite)", [PY, "-m", "pytest", "-m", "not postgres_only", *SLOWEST])
        step(
            "pytest (PostgreSQL, as the RLS-bound application role)",
            [PY, "-m", "pytest", "tests/integration", "-p", "no:cacheprovider", *SLOWEST],
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
                *SLOWEST,
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
    test.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, help="passed to pytest (skips lint when given)"
    )
    test.set_defaults(func=cmd_test)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
