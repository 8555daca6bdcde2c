"""A small local server for HashiCorp Vault's KV v2 read endpoint, as documented
(https://developer.hashicorp.com/vault/api-docs/secret/kv/kv-v2#read-secret-version):
``GET /v1/<mount>/data/<path>`` with the ``X-Vault-Token`` header answers
``{"data": {"data": {...}, "metadata": {...}}}``; a wrong token is a 403
(``{"errors": ["permission denied"]}``), an unknown path a 404 (``{"errors": []}``).

No Vault server can be installed on the test machine, so the ``vault`` provider
(``workflows.secrets``, through hvac) is tested against this: it checks the request hvac
sends and answers with the documented shapes. Nothing else of Vault is implemented.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeVault:
    def __init__(self, token: str, mount: str = "secret") -> None:
        self.token = token
        self.mount = mount
        self.secrets: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, int] = {}
        self.reads = 0
        self.url = ""

    def put(self, path: str, data: dict[str, Any]) -> None:
        self.secrets[path] = dict(data)
        self.versions[path] = self.versions.get(path, 0) + 1

    def answer(self, method: str, path: str, token: str | None) -> tuple[int, dict[str, Any]]:
        prefix = f"/v1/{self.mount}/data/"
        if method != "GET" or not path.startswith(prefix):
            return 404, {"errors": []}
        if token != self.token:
            return 403, {"errors": ["permission denied"]}
        name = path[len(prefix) :].split("?", 1)[0]
        if name not in self.secrets:
            return 404, {"errors": []}
        self.reads += 1
        metadata = {
            "created_time": "2026-12-01T00:00:00.000000Z",
            "custom_metadata": None,
            "deletion_time": "",
            "destroyed": False,
            "version": self.versions[name],
        }
        return 200, {
            "request_id": "fake",
            "lease_id": "",
            "renewable": False,
            "lease_duration": 0,
            "data": {"data": self.secrets[name], "metadata": metadata},
            "wrap_info": None,
            "warnings": None,
            "auth": None,
        }


@contextmanager
def fake_vault(token: str = "s.test-token") -> Iterator[FakeVault]:
    vault = FakeVault(token)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = vault.answer("GET", self.path, self.headers.get("X-Vault-Token"))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        # A worker's threads may each ask at once as they connect (16 by default on two
        # CPUs): socketserver's listen backlog of 5 would reset some (support.ledger).
        request_queue_size = 1024

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    vault.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield vault
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
