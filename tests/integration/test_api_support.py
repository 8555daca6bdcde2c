"""Helpers shared by the REST API tests (no tests here): keys, a JSON client with a bearer
key, and the workflows the tests deploy."""

from __future__ import annotations

import json
from typing import Any

import wasmtime
from django.test import Client

from tests.fixtures.wat import INPUT, Wat
from workflows.api.keys import issue_api_key
from workflows.demo import DEMO_WAT
from workflows.models import Role, Tenant


def demo_wasm() -> bytes:
    """The demo order workflow: reserve, wait for "paid", charge, sleep 2 s."""
    return bytes(wasmtime.wat2wasm(DEMO_WAT.read_text()))


def signal_waiter() -> bytes:
    """Publishes query state "stage", waits up to an hour for "go", returns the transcript."""
    w = Wat()
    stage = w.js({"at": "waiting", "api_token": "t0ps3cret"})
    w.run(
        f"""
    (drop (call $set_query_state {w.s("stage")} {stage}))
    (call $rec (call $durable_await_signals {w.js(["go"])} (i64.const 3600000)))
    (call $finish)"""
    )
    return w.wasm()


def promiser() -> bytes:
    """Creates a promise, publishes its id as query state "promise", awaits it."""
    w = Wat()
    w.run(
        f"""
    (local.set $p (call $create_promise {w.s("approval")}))
    (drop (call $set_query_state {w.s("promise")} {w.payload("p")}))
    (call $rec (call $await_promise {w.payload("p")} (i64.const -1)))
    (call $finish)""",
        locals="$p i64",
    )
    return w.wasm()


def updatable() -> bytes:
    """Registers update handler "on_add" (answers {"seen": <input>}), waits for "done"."""
    w = Wat()
    w.run(
        f"""
    (call $recn (call $register_update_handler {w.s("on_add")}))
    (call $rec (call $durable_await_signals {w.js(["done"])} (i64.const -1)))
    (call $finish)"""
    )
    w.func("on_add", w.concat('{"seen":', INPUT, "}"))
    return w.wasm()


def key_for(tenant: Tenant, role: str = Role.ADMIN, name: str = "test") -> str:
    return issue_api_key(tenant, name, role)[1]


class Api:
    """A test client speaking JSON with ``Authorization: Bearer <key>``."""

    def __init__(self, key: str | None) -> None:
        self.client = Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.client.get(path, params or {}, **self.headers)

    def post(self, path: str, body: Any = None, **extra: Any) -> Any:
        data = "" if body is None else json.dumps(body)
        return self.client.post(
            path, data, content_type="application/json", **self.headers, **extra
        )

    def put(self, path: str, body: Any) -> Any:
        return self.client.put(
            path, json.dumps(body), content_type="application/json", **self.headers
        )

    def patch(self, path: str, body: Any) -> Any:
        return self.client.patch(
            path, json.dumps(body), content_type="application/json", **self.headers
        )

    def delete(self, path: str) -> Any:
        return self.client.delete(path, **self.headers)

    def raw(self, method: str, path: str, data: bytes | str, content_type: str) -> Any:
        if isinstance(data, bytearray):  # what wasmtime.wat2wasm returns
            data = bytes(data)
        return self.client.generic(method, path, data, content_type=content_type, **self.headers)

    def deploy(self, name: str, wasm: bytes, **options: Any) -> Any:
        query = "&".join([f"name={name}", *(f"{k}={v}" for k, v in options.items())])
        return self.raw("POST", f"/api/v1/definitions?{query}", wasm, "application/wasm")

    def start(self, definition: str, input: Any = None, **options: Any) -> Any:
        return self.post("/api/v1/workflows", {"definition": definition, "input": input, **options})


def error_of(response: Any) -> dict[str, Any]:
    """The error object of an error response, checking the one shape every error has."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "field"}, body
    return dict(body["error"])
