"""Settings for the test suite.

``CLEAT_TEST_DB`` picks the database: ``sqlite`` (default; a file under test-artifacts/),
``postgres`` (``CLEAT_TEST_POSTGRES_URL``, default the local server as ``postgres``; the suite
migrates as that owner, then runs every test connected as the application role so row-level
security is really enforced) or ``mariadb`` (``CLEAT_TEST_MARIADB_URL``).
"""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("CLEAT_ENV_FILE", "")  # not the developer's .env (dev.py up writes one)

from cleat_project.settings import *  # noqa: F403
from cleat_project.settings import BASE_DIR, env

TEST_DB = os.environ.get("CLEAT_TEST_DB", "sqlite")
# One test database per test process, so concurrent runs on one machine do not collide.
_SUFFIX = os.environ.get("CLEAT_TEST_DB_SUFFIX", str(os.getpid()))
if TEST_DB == "postgres":
    DATABASES = {
        "default": env.db_url_config(
            os.environ.get("CLEAT_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        )
    }
    DATABASES["default"]["TEST"] = {"NAME": f"test_cleat_{_SUFFIX}"}
elif TEST_DB == "mariadb":
    DATABASES = {
        "default": env.db_url_config(
            os.environ.get("CLEAT_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/test")
        )
    }
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4"}
    DATABASES["default"]["TEST"] = {"NAME": f"test_cleat_{_SUFFIX}", "CHARSET": "utf8mb4"}
elif TEST_DB == "sqlite":
    os.makedirs(BASE_DIR / "test-artifacts", exist_ok=True)
    DATABASES["default"]["TEST"] = {
        "NAME": str(BASE_DIR / "test-artifacts" / f"test-{_SUFFIX}.sqlite3")
    }
else:
    raise RuntimeError(f"CLEAT_TEST_DB must be sqlite, postgres or mariadb, not {TEST_DB!r}")

# Waits re-check quickly in tests that rely on it; most tests wake runs explicitly.
CLEAT_WAIT_RECHECK_SECONDS = 300.0

# The suite runs web requests and workers in one process, and its worker threads end with
# each test: they keep no connection beyond a segment (PostgreSQL's driver warns about a
# connection dropped open), so `runworker` in a test keeps the database's CONN_MAX_AGE. The
# worker's production default is checked on the real settings, in a separate process.
CLEAT_WORKER_CONN_MAX_AGE = DATABASES["default"].get("CONN_MAX_AGE", 0)
