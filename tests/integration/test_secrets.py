"""Secrets from credential providers (workflows/secrets.py, issue 13 part 4): ``env``, ``file``,
AWS Secrets Manager (against moto's standalone server, started here), Vault KV v2 (against
``support.fake_vault``: no Vault server can be installed here), the cache's time to live, HTTP
services' bearer tokens, and the database password rotated under a running worker (a
PostgreSQL cluster of the test's own, with password authentication), which reconnects with
the new one and loses nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from engine.services import CallContext
from engine.status import AbiStatus
from tests.integration.support.celery_workers import free_port
from tests.integration.support.fake_vault import FakeVault, fake_vault
from workflows import secrets

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    secrets.invalidate()
    yield
    secrets.invalidate()


# --- env, file, literal, the cache --------------------------------------------------------------


def test_env_file_and_literal_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLEAT_TEST_SECRET_X", "from-env")
    assert secrets.resolve("env:CLEAT_TEST_SECRET_X") == "from-env"
    mounted = tmp_path / "db-password"
    mounted.write_text("from-file\n")
    assert secrets.resolve(f"file:{mounted}") == "from-file"
    assert secrets.resolve("plain-value") == "plain-value"
    assert secrets.resolve("https://not.a/provider") == "https://not.a/provider"


def test_missing_secrets_name_the_provider_and_the_secret(tmp_path: Path) -> None:
    with pytest.raises(secrets.SecretError, match=r"env:CLEAT_NO_SUCH_VAR: .*not set"):
        secrets.resolve("env:CLEAT_NO_SUCH_VAR")
    with pytest.raises(secrets.SecretError, match=f"file:{tmp_path}/absent: No such file"):
        secrets.resolve(f"file:{tmp_path}/absent")
    with pytest.raises(secrets.SecretError, match="names no secret"):
        secrets.resolve("vault:")


def test_a_rotated_secret_is_read_again_after_its_time_to_live(tmp_path: Path) -> None:
    mounted = tmp_path / "token"
    mounted.write_text("one")
    spec = f"file:{mounted}"
    assert secrets.resolve(spec, ttl=0.3) == "one"
    mounted.write_text("two")
    assert secrets.resolve(spec, ttl=0.3) == "one"  # cached
    time.sleep(0.35)
    assert secrets.resolve(spec, ttl=0.3) == "two"
    # A provider that fails later serves the value read before, rather than failing.
    mounted.unlink()
    time.sleep(0.35)
    assert secrets.resolve(spec, ttl=0.3) == "two"
    secrets.invalidate(spec)
    with pytest.raises(secrets.SecretError):
        secrets.resolve(spec, ttl=0.3)


# --- AWS Secrets Manager (moto's standalone server) -------------------------------------------


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[str]:
    port = free_port()
    binary = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("moto_server did not start") from None
                time.sleep(0.1)
        for name, value in (
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_DEFAULT_REGION", "eu-west-1"),
        ):
            monkeypatch.setenv(name, value)
        settings.CLEAT_AWS_ENDPOINT_URL = url
        settings.CLEAT_AWS_REGION = "eu-west-1"
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_aws_secrets_manager_plain_json_field_rotation_and_absence(moto_server: str) -> None:
    import boto3

    client = boto3.client("secretsmanager", endpoint_url=moto_server, region_name="eu-west-1")
    client.create_secret(Name="cleat/db", SecretString=json.dumps({"password": "p1", "n": 3}))
    client.create_secret(Name="cleat/token", SecretString="t1")
    assert secrets.resolve("aws-secretsmanager:cleat/token") == "t1"
    assert secrets.resolve("aws-secretsmanager:cleat/db#password") == "p1"
    assert secrets.resolve("aws-secretsmanager:cleat/db#n") == "3"
    client.put_secret_value(SecretId="cleat/token", SecretString="t2")
    assert secrets.resolve("aws-secretsmanager:cleat/token", ttl=0) == "t2"
    with pytest.raises(secrets.SecretError, match=r"cleat/missing: .*ResourceNotFound"):
        secrets.resolve("aws-secretsmanager:cleat/missing")
    with pytest.raises(secrets.SecretError, match="no field 'user'"):
        secrets.resolve("aws-secretsmanager:cleat/db#user")


# --- Vault KV v2 ----------------------------------------------------------------------------------


@pytest.fixture
def vault(settings: Any) -> Iterator[FakeVault]:
    with fake_vault("s.right") as served:
        settings.CLEAT_VAULT_ADDR = served.url
        settings.CLEAT_VAULT_TOKEN = "s.right"
        yield served


def test_vault_kv2_reads_a_field_and_refuses_clearly(vault: FakeVault, settings: Any) -> None:
    vault.put("cleat/billing", {"token": "b1", "value": "v1"})
    assert secrets.resolve("vault:cleat/billing#token") == "b1"
    assert secrets.resolve("vault:cleat/billing") == "v1"  # the field defaults to "value"
    vault.put("cleat/billing", {"token": "b2"})
    assert secrets.resolve("vault:cleat/billing#token", ttl=0) == "b2"
    with pytest.raises(secrets.SecretError, match="vault:cleat/nothing#token: Vault has no secret"):
        secrets.resolve("vault:cleat/nothing#token")
    settings.CLEAT_VAULT_TOKEN = "s.wrong"
    secrets.invalidate()  # else the value read before is served, with a warning
    with pytest.raises(secrets.SecretError, match="Vault refused the token"):
        secrets.resolve("vault:cleat/billing#token", ttl=0)


# --- HTTP services' bearer tokens -----------------------------------------------------------------


@pytest.fixture
def http_service() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append(self.headers.get("Authorization", ""))
            if self.path.startswith("/redirect/"):
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.2:9/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b'{"ok":true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_http_services_send_the_bearer_token_their_setting_names(
    http_service: tuple[str, list[str]], vault: FakeVault, settings: Any, tmp_path: Path
) -> None:
    from workflows.conf import cleat_settings

    url, seen = http_service
    vault.put("cleat/billing", {"token": "tok-1"})
    settings.CLEAT_SERVICES = {"billing": url, "open": url, "broken": url}
    settings.CLEAT_SERVICE_TOKENS = {
        "billing": "vault:cleat/billing#token",
        "broken": f"file:{tmp_path}/none",
    }
    settings.CLEAT_SECRETS_TTL_SECONDS = 0
    cleat_settings.cache_clear()
    try:
        services = cleat_settings().build_services()
        context = CallContext("t", "wf", "run", 0, "billing", "charge", "k-1")
        assert services.caller.call("billing", "charge", "{}", context).status == AbiStatus.OK
        vault.put("cleat/billing", {"token": "tok-2"})  # rotated: the next call uses it
        assert services.caller.call("billing", "charge", "{}", context).status == AbiStatus.OK
        assert services.caller.call("open", "ping", "{}", context).status == AbiStatus.OK
        assert seen == ["Bearer tok-1", "Bearer tok-2", ""]
        failed = services.caller.call("broken", "charge", "{}", context)
        assert failed.status == AbiStatus.ERROR
        assert "service 'broken': no bearer token: file:" in failed.payload
        assert len(seen) == 3  # nothing was sent without its token
        # A token with a line break (an env var filled from a file) is neither sent nor quoted.
        (tmp_path / "crlf").write_text("tok-3\r\ninjected: yes")
        settings.CLEAT_SERVICE_TOKENS = {"broken": f"file:{tmp_path}/crlf"}
        cleat_settings.cache_clear()
        services = cleat_settings().build_services()
        failed = services.caller.call("broken", "charge", "{}", context)
        assert failed.status == AbiStatus.ERROR and "line break" in failed.payload
        assert "tok-3" not in failed.payload and len(seen) == 3
        # A redirect is not followed: the token would go wherever it points.
        settings.CLEAT_SERVICES = {"billing": url + "redirect/"}
        settings.CLEAT_SERVICE_TOKENS = {"billing": "vault:cleat/billing#token"}
        cleat_settings.cache_clear()
        services = cleat_settings().build_services()
        moved = services.caller.call("billing", "charge", "{}", context)
        assert moved.status == AbiStatus.ERROR and "not followed" in moved.payload
        assert seen[3:] == ["Bearer tok-2"]  # only the first hop saw the token
    finally:
        cleat_settings.cache_clear()


# --- settings -----------------------------------------------------------------------------------


def test_a_database_password_setting_on_sqlite_is_refused_at_start_up(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CLEAT_TEST_")},
        "DEBUG": "1",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'x.sqlite3'}",
        "CLEAT_DATABASE_PASSWORD": "env:DB_PASSWORD",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert "CLEAT_DATABASE_PASSWORD is read for PostgreSQL and MariaDB/MySQL" in done.stderr


# --- the database password, rotated under a running worker --------------------------------------


@pytest.mark.postgres_only
@pytest.mark.server_db
def test_the_worker_reconnects_with_a_rotated_database_password(tmp_path: Path) -> None:
    """A cluster of the test's own with password authentication; the worker reads the
    application role's password from a mounted file. Mid-run the password is changed (the file
    first, then the role) and every connection of the role is cut: the worker reconnects with
    the new password and every run finishes once."""
    from tests.integration.support.ledger import Ledger
    from tests.integration.support.pgcluster import throwaway_cluster
    from tests.integration.support.processes import MANAGE, WorkerProcess, command_env, wait_until
    from workflows.rls import app_role

    if connection.vendor != "postgresql":
        pytest.fail("the rotation scenario runs on PostgreSQL: CLEAT_TEST_DB=postgres")
    role = app_role()
    mounted = tmp_path / "db-password"
    mounted.write_text("first-password\n")
    with throwaway_cluster(password="owner-pw") as cluster, Ledger().serving() as ledger:
        owner = command_env(DATABASE_URL=cluster.url())
        migrated = subprocess.run(
            [sys.executable, str(MANAGE), "migrate", "--noinput", "-v0"],
            env=owner,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        cluster.psql(f"ALTER ROLE {role} PASSWORD 'first-password'")
        saved = dict(connection.settings_dict)
        connection.close()
        connection.settings_dict.update(
            HOST="127.0.0.1",
            PORT=str(cluster.port),
            NAME="cleat",
            USER="postgres",
            PASSWORD="owner-pw",
        )
        try:
            from tests.integration.support.faults import Workload, check, unfinished
            from workflows.models import DEFAULT_TENANT_ID, Tenant

            tenant = Tenant.objects.get(id=DEFAULT_TENANT_ID)
            workload = Workload(tenant)
            workload.start_jobs(6)
            env = command_env(
                {"ledger": ledger.url},
                DATABASE_URL=f"postgres://{role}@127.0.0.1:{cluster.port}/cleat",
                CLEAT_DATABASE_PASSWORD=f"file:{mounted}",
                CLEAT_SECRETS_TTL_SECONDS="3600",  # only a refused password reads it again
                CLEAT_WAIT_RECHECK_SECONDS="5",
            )
            with WorkerProcess(
                tmp_path / "rotating.log",
                ["--worker-id", "rotating", "--poll-interval", "0.2"],
                env,
            ) as worker:
                worker.wait_for_log("event=worker_started", 60)
                wait_until(lambda: len(ledger.entries) >= 2, 60, "the first calls made")
                mounted.write_text("second-password\n")
                cluster.psql(f"ALTER ROLE {role} PASSWORD 'second-password'")
                cut = cluster.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    f"WHERE usename = '{role}'"
                )
                assert int(cut) >= 1  # the worker's connections, opened with the old password
                connection.close()
                wait_until(lambda: unfinished(tenant) == 0, 120, "every run done", 0.3)
                worker.terminate()
                assert worker.wait(timeout=30) == 0, worker.log()[-3000:]
                log = worker.log()
            assert "changed: reconnecting with the new one" in log, log[-3000:]
            report = check(tenant, ledger, [])
            assert not report.violations, "\n".join(report.violations[:20])
        finally:
            connection.close()
            connection.settings_dict.clear()
            connection.settings_dict.update(saved)


@pytest.mark.postgres_only
def test_a_database_password_that_cannot_be_read_stops_the_worker_with_the_reason() -> None:
    from tests.integration.support.processes import MANAGE, command_env

    env = command_env(CLEAT_DATABASE_PASSWORD="env:CLEAT_NO_SUCH_PASSWORD_VAR")
    env.pop("CLEAT_NO_SUCH_PASSWORD_VAR", None)
    done = subprocess.run(
        [sys.executable, str(MANAGE), "runworker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "the database password cannot be read: env:CLEAT_NO_SUCH_PASSWORD_VAR" in out
    assert "Traceback" not in out
