"""The production settings of docs/production.md: ``check --deploy`` is clean with them (and
warns without them), the web process holds no connection between requests by default, and
the worker applies its own connection lifetime. Each check runs ``manage.py`` or Python as a
separate process on the real settings (not the test settings), with a clean environment."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

ROOT = Path(__file__).resolve().parents[2]

# The settings docs/production.md lists, with example values.
PRODUCTION_ENV = {
    "DEBUG": "0",
    "SECRET_KEY": "x9-long-random-production-key-" + "k3Jf8sLq2ZpWv7Rt" * 3,
    "ALLOWED_HOSTS": "cleat.example.com",
    "SECURE_SSL_REDIRECT": "1",
    "SESSION_COOKIE_SECURE": "1",
    "CSRF_COOKIE_SECURE": "1",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "1",
    "SECURE_HSTS_PRELOAD": "1",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
}


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    kept = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k in kept}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    env["CLEAT_ENV_FILE"] = ""  # not a developer's .env
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_with_the_documented_production_settings(tmp_path: Path) -> None:
    done = _run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        _clean_env(tmp_path, **PRODUCTION_ENV),
    )
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout


def test_check_deploy_warns_without_them(tmp_path: Path) -> None:
    bare = {k: PRODUCTION_ENV[k] for k in ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS")}
    done = _run(["manage.py", "check", "--deploy"], _clean_env(tmp_path, **bare))
    for warning in ("W004", "W008", "W012", "W016"):
        assert f"security.{warning}" in done.stderr, (warning, done.stderr)


def test_a_bad_proxy_ssl_header_is_refused_at_start(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, **{**PRODUCTION_ENV, "SECURE_PROXY_SSL_HEADER": "HTTP_X_PROTO"})
    done = _run(["manage.py", "check"], env)
    assert done.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER is a header and a value" in done.stderr


@pytest.mark.parametrize("command", ["runworker", "migrate", "check"])
def test_a_missing_secret_key_stops_a_command_with_its_reason(tmp_path: Path, command: str) -> None:
    """DEBUG off and no SECRET_KEY: every command exits 2 with one line that says so, not
    Django's traceback through the settings import."""
    env = _clean_env(tmp_path, DEBUG="0", ALLOWED_HOSTS="cleat.example.com")
    done = _run(["manage.py", command], env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        "manage.py: configuration error: SECRET_KEY must be set when DEBUG is off"
    )
    assert "Traceback" not in done.stderr


WEB_REQUESTS = """
import threading
import django
django.setup()
from django.db import connection
from django.test import RequestFactory
from django.core.handlers.wsgi import WSGIHandler

app = WSGIHandler()
held = []

def request():
    environ = RequestFactory().get("/healthz").environ
    environ["SERVER_NAME"] = "localhost"
    response = app(environ, lambda status, headers: None)
    body = b"".join(response)
    response.close()  # what a WSGI server does: Django's request_finished
    assert b"ok" in body, body
    held.append(connection.connection is not None)

threads = [threading.Thread(target=request) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
from django.conf import settings
print(connection.settings_dict["CONN_MAX_AGE"], sum(held), settings.CLEAT_WORKER_CONN_MAX_AGE)
"""


def test_the_web_process_holds_no_connection_between_requests(tmp_path: Path) -> None:
    """Each request thread's connection is closed when its request ends (runserver starts a
    thread per client connection: a connection kept per thread exhausted the server)."""
    env = _clean_env(tmp_path, DEBUG="1", DJANGO_SETTINGS_MODULE="cleat_project.settings")
    assert _run(["manage.py", "migrate", "-v0"], env).returncode == 0
    done = _run(["-c", WEB_REQUESTS], env)
    assert done.returncode == 0, done.stderr
    # CONN_MAX_AGE 0: no thread holds a connection; the worker's own lifetime is 60 s.
    assert done.stdout.split() == ["0", "0", "60"]
    kept = _run(["-c", WEB_REQUESTS], {**env, "CONN_MAX_AGE": "60"})
    assert kept.stdout.split() == ["60", "8", "60"]  # what the old default did


@pytest.mark.django_db(transaction=True)
def test_the_worker_applies_its_own_connection_lifetime(
    tenant: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runworker (and runscheduler) switch to CLEAT_WORKER_CONN_MAX_AGE before they connect;
    the settings dict is the one the worker's threads open their connections from."""
    from workflows.management.commands import _common, runworker

    applied: list[bool] = []
    monkeypatch.setattr(runworker, "use_worker_connection_age", lambda: applied.append(True))
    call_command("runworker", "--burst", stdout=io.StringIO())
    assert applied == [True]

    before = connections["default"].settings_dict["CONN_MAX_AGE"]
    try:
        connections["default"].settings_dict["CONN_MAX_AGE"] = 0  # the web's default
        with override_settings(CLEAT_WORKER_CONN_MAX_AGE=45):
            _common.use_worker_connection_age()
        assert connections.settings["default"]["CONN_MAX_AGE"] == 45
        assert connections["default"].settings_dict["CONN_MAX_AGE"] == 45
    finally:
        connections.settings["default"]["CONN_MAX_AGE"] = before
        connections["default"].settings_dict["CONN_MAX_AGE"] = before


@pytest.mark.django_db(transaction=True)
def test_the_https_redirect_leaves_the_probes_alone(tenant: Any) -> None:
    from django.test import Client

    with override_settings(SECURE_SSL_REDIRECT=True):
        client = Client()
        assert client.get("/healthz").status_code == 200
        assert client.get("/metrics").status_code == 200
        redirected = client.get("/api/v1/workflows")
        assert redirected.status_code == 301
        assert redirected["Location"] == "https://testserver/api/v1/workflows"
        secure = client.get("/api/v1/workflows", secure=True)
        assert secure.status_code == 401  # served (no key), not redirected


@pytest.mark.parametrize("entry", ["cleat_project.wsgi", "cleat_project.asgi"])
def test_a_web_server_refuses_to_start_on_a_setting_cleat_cannot_honour(
    entry: str, tmp_path: Path
) -> None:
    """gunicorn and uvicorn run no system checks: the entry points run cleat's, so a bad
    setting stops the server with its reason instead of a 500 at every request."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLEAT_TEST_")},
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}",
        "CLEAT_TRACING": "sideways",
    }
    code = f"import {entry}"
    bad = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert "ImproperlyConfigured: CLEAT_TRACING:" in bad.stderr and "sideways" in bad.stderr
    good = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env={**env, "CLEAT_TRACING": "off"},
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr[-2000:]


def test_broker_transport_options_are_merged_over_the_defaults_or_refused(
    tmp_path: Path,
) -> None:
    """CELERY_BROKER_TRANSPORT_OPTIONS's keys go over cleat's defaults (confirms on, the
    Redis visibility timeout); a value that is not a JSON object stops the command with the
    variable named."""
    root = Path(__file__).resolve().parents[2]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLEAT_TEST_")},
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}",
    }
    show = [
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        "from django.conf import settings; print(settings.CELERY_BROKER_TRANSPORT_OPTIONS)",
    ]
    merged = subprocess.run(
        show,
        cwd=root,
        env={**env, "CELERY_BROKER_TRANSPORT_OPTIONS": '{"visibility_timeout": 20}'},
        capture_output=True,
        text=True,
    )
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert merged.stdout.strip().splitlines()[-1] == (
        "{'visibility_timeout': 20, 'confirm_publish': True}"
    )
    refused = subprocess.run(
        show,
        cwd=root,
        env={**env, "CELERY_BROKER_TRANSPORT_OPTIONS": "[1]"},
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0
    assert "CELERY_BROKER_TRANSPORT_OPTIONS must be a JSON object" in refused.stderr
