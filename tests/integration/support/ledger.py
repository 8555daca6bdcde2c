"""An HTTP "ledger" service that honours ``Idempotency-Key`` headers, served from the test
process on 127.0.0.1 (a random port) for worker subprocesses to reach with ``durable_call``.

The first request with a key performs the effect (a new ledger entry with the next sequence
number) and stores the response; every later request with that key gets the stored response
and performs nothing. Requests are counted per key, so a test can prove both that a crash
made the engine send a key again and that the key kept the effect single.

``hold(seconds)`` makes first-time requests wait, after the effect and before answering,
until ``release()`` or the time runs out: a slow call that a test can kill a worker during.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Entry:
    seq: int
    operation: str
    request: Any
    response: str


class Ledger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: dict[str, Entry] = {}
        self.requests: Counter[str] = Counter()
        self.mismatches: list[str] = []
        self.truncated = 0  # requests whose body never arrived whole (not acted on)
        self._hold_s = 0.0
        self._released = threading.Event()
        self._held = 0
        self._server: ThreadingHTTPServer | None = None

    # --- the service ------------------------------------------------------------------------

    def handle(self, operation: str, key: str, body: bytes) -> tuple[int, str]:
        """Answer one request: (HTTP status, body)."""
        if not key:
            return 400, '{"error":"Idempotency-Key header is required"}'
        try:
            request = json.loads(body or b"null")
        except json.JSONDecodeError:
            return 400, '{"error":"the body is not JSON"}'
        with self._lock:
            self.requests[key] += 1
            entry = self.entries.get(key)
            fresh = entry is None
            if entry is None:
                seq = len(self.entries) + 1
                response = json.dumps(
                    {"op": operation, "seq": seq, "request": request}, separators=(",", ":")
                )
                entry = self.entries[key] = Entry(seq, operation, request, response)
            elif (entry.operation, entry.request) != (operation, request):
                # A key reused for a different call: a real service refuses it.
                self.mismatches.append(key)
                return 422, '{"error":"Idempotency-Key reused with another request"}'
            hold = self._hold_s if fresh else 0.0
            if hold:
                self._held += 1
        if hold:
            try:
                self._released.wait(hold)
            finally:
                with self._lock:
                    self._held -= 1
        return 200, entry.response

    # --- test controls ----------------------------------------------------------------------

    def hold(self, seconds: float) -> None:
        with self._lock:
            self._released.clear()
            self._hold_s = seconds

    def release(self) -> None:
        with self._lock:
            self._hold_s = 0.0
            self._released.set()

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def repeated_keys(self) -> set[str]:
        with self._lock:
            return {key for key, count in self.requests.items() if count > 1}

    @property
    def url(self) -> str:
        assert self._server is not None, "the ledger is not serving"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    # --- serving ----------------------------------------------------------------------------

    @contextmanager
    def serving(self) -> Iterator[Ledger]:
        ledger = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:
                    # The client went away mid-request (http.client sends the headers and
                    # the body in two writes: a worker killed between them leaves only the
                    # headers). A real service never acts on a request it did not receive
                    # whole: nothing is done, nothing answered.
                    ledger.truncated += 1
                    self.close_connection = True
                    return
                status, text = ledger.handle(
                    self.path.strip("/"), self.headers.get("Idempotency-Key", ""), body
                )
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # one line per request would drown the test's output

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # The listen backlog. socketserver's default of 5 is less than the calls two
            # workers of 16 threads make at once: on a loaded machine the connections beyond
            # it were reset before the ledger saw them, and the calls failed (ERROR) with no
            # effect -- a service answering that many clients keeps a longer queue.
            request_queue_size = 1024

            def handle_error(self, request: Any, client_address: Any) -> None:
                # A killed worker leaves held requests with nobody to answer: expected.
                pass

        server = Server(("127.0.0.1", 0), Handler)
        self._server = server
        thread = threading.Thread(target=server.serve_forever, name="ledger", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release()
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
            self._server = None
