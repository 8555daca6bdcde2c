"""``workflows.client``, the public Python API an embedding project calls from its views
(docs/embedding.md): start (idempotent), signal, read, cancel and deploy, in the default
tenant or a named one, with the service layer's errors."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from tests.fixtures.wat import Wat
from workflows import client
from workflows.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)


def waiter() -> bytes:
    w = Wat()
    w.run(f"(call $rec (call $durable_await_signals {w.js(['go'])} (i64.const -1))) (call $finish)")
    return w.wasm()


def work() -> None:
    call_command("runworker", "--burst", "--concurrency", "1", stdout=io.StringIO())


def test_start_signal_get_in_the_default_tenant(tenant: Tenant) -> None:
    assert client.deploy("waiter", waiter()) == 1
    run = client.start("waiter", {"order": 1}, idempotency_key="order-1")
    assert (run.status, run.input, run.result, run.finished) == ("ready", {"order": 1}, None, False)
    assert client.start("waiter", {"order": 1}, idempotency_key="order-1").id == run.id
    work()
    assert client.get(run.id).waiting_on == "signals go"
    client.signal(run.id, "go", {"ok": True})
    work()
    done = client.get(run.id)
    assert (done.status, done.finished) == ("done", True)
    assert done.result == [[0, '{"name":"go","payload":{"ok":true}}']]
    with pytest.raises(client.Conflict, match="cannot receive signals"):
        client.signal(run.id, "go")


def test_cancel_and_a_named_tenant(tenant: Tenant, other_tenant: Tenant) -> None:
    client.deploy("waiter", waiter(), tenant="other")
    run = client.start("waiter", tenant=other_tenant)
    with pytest.raises(client.NotFound) as missing:
        client.get(run.id)  # not a run of the default tenant
    assert missing.value.field == "run_id" and missing.value.http_status == 404
    work()
    cancelled = client.cancel(run.id, "customer changed their mind", tenant="other")
    assert cancelled.id == run.id
    work()
    assert client.get(run.id, tenant="other").finished


def test_bad_input_names_the_field(tenant: Tenant) -> None:
    with pytest.raises(client.NotFound, match=r"no-such-workflow"):
        client.start("no-such-workflow")
    with pytest.raises(client.InvalidInput) as bad:
        client.start("waiter", {1, 2})
    assert bad.value.field == "input"
    with pytest.raises(client.NotFound, match="unknown tenant"):
        client.get("x", tenant="nobody")
