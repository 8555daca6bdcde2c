"""What durable_call and fetch reach: Python services, HTTP services against a real local
server, and the fetch allow-list."""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine.errors import PermanentError
from engine.services import CallContext, CallResult, Fetcher, ServiceRegistry
from engine.status import AbiStatus

KEY = "idem-key-for-this-step"


def context(service: str, operation: str, key: str = KEY) -> CallContext:
    return CallContext(
        tenant_id="t1",
        workflow_id="wf",
        run_id="run",
        step=4,
        service=service,
        operation=operation,
        idempotency_key=key,
    )


def call(registry: ServiceRegistry, service: str, operation: str, request: Any) -> CallResult:
    text = request if isinstance(request, str) else json.dumps(request)
    return registry.call(service, operation, text, context(service, operation))


# --- Python services -----------------------------------------------------------------------
# Module-level operations, so this module can itself serve as a dotted-path target.


def add(request: dict[str, int], *, idempotency_key: str, context: CallContext) -> dict[str, Any]:
    return {"sum": request["a"] + request["b"], "key": idempotency_key, "step": context.step}


def refuse(request: Any, *, idempotency_key: str, context: CallContext) -> None:
    raise PermanentError("card declined")


def crash(request: Any, *, idempotency_key: str, context: CallContext) -> None:
    raise RuntimeError("database unavailable")


def _private(request: Any, *, idempotency_key: str, context: CallContext) -> str:
    return "should never be reachable"


class Payments:
    """An object whose methods are operations."""

    def __init__(self) -> None:
        self.charged: list[int] = []

    def charge(self, request: dict[str, int], **_: Any) -> dict[str, int]:
        self.charged.append(request["amount"])
        return {"charged": request["amount"]}


def router(request: Any, *, idempotency_key: str, context: CallContext) -> dict[str, Any]:
    """A single callable serving every operation."""
    return {"operation": context.operation, "request": request}


PAYMENTS = Payments()
THIS_MODULE = __name__


def test_module_target_by_dotted_path() -> None:
    """A dotted path to a module calls the attribute named by the operation, with the
    idempotency key and the call context."""
    registry = ServiceRegistry({"math": THIS_MODULE})
    result = call(registry, "math", "add", {"a": 2, "b": 3})
    assert result.status == AbiStatus.OK
    assert json.loads(result.payload) == {"sum": 5, "key": KEY, "step": 4}


def test_object_target_by_dotted_path_and_by_instance() -> None:
    """A dotted path may name an object inside a module; an instance can be given directly."""
    PAYMENTS.charged.clear()
    by_path = ServiceRegistry({"pay": f"{THIS_MODULE}.PAYMENTS"})
    result = call(by_path, "pay", "charge", {"amount": 7})
    assert (result.status, json.loads(result.payload)) == (AbiStatus.OK, {"charged": 7})
    assert PAYMENTS.charged == [7]

    payments = Payments()
    registry = ServiceRegistry({"pay": payments})
    result = call(registry, "pay", "charge", {"amount": 12})
    assert (result.status, json.loads(result.payload)) == (AbiStatus.OK, {"charged": 12})
    assert payments.charged == [12]
    assert PAYMENTS.charged == [7]


def test_single_callable_serves_every_operation() -> None:
    """A callable target is called for any operation and reads it from the context."""
    registry = ServiceRegistry({"any": router})
    for operation in ("create", "delete"):
        result = call(registry, "any", operation, {"id": 1})
        assert result.status == AbiStatus.OK
        assert json.loads(result.payload) == {"operation": operation, "request": {"id": 1}}


def test_callable_by_dotted_path() -> None:
    registry = ServiceRegistry({"any": f"{THIS_MODULE}.router"})
    result = call(registry, "any", "whatever", [1, 2])
    assert json.loads(result.payload) == {"operation": "whatever", "request": [1, 2]}


def test_permanent_error_maps_to_permanent() -> None:
    """PermanentError means do not retry: its message is the payload."""
    result = call(ServiceRegistry({"m": THIS_MODULE}), "m", "refuse", {})
    assert result == CallResult(AbiStatus.PERMANENT, "card declined")


def test_other_exceptions_map_to_error() -> None:
    """Any other exception is retryable and names its type."""
    result = call(ServiceRegistry({"m": THIS_MODULE}), "m", "crash", {})
    assert result.status == AbiStatus.ERROR
    assert result.payload == "RuntimeError: database unavailable"


def test_invalid_json_request_is_permanent() -> None:
    """A request that is not JSON never reaches the service and is not worth retrying."""
    payments = Payments()
    result = call(ServiceRegistry({"pay": payments}), "pay", "charge", "{amount: 12")
    assert result.status == AbiStatus.PERMANENT
    assert "not valid JSON" in result.payload
    assert payments.charged == []


def test_unknown_service_is_permanent_and_names_the_setting() -> None:
    result = call(ServiceRegistry({}), "nowhere", "op", {})
    assert result.status == AbiStatus.PERMANENT
    assert "nowhere" in result.payload
    assert "CLEAT_SERVICES" in result.payload


@pytest.mark.parametrize("operation", ["no_such_operation", "_private", "__class__"])
def test_unknown_and_private_operations_are_permanent(operation: str) -> None:
    """Only public callables of the target are operations."""
    result = call(ServiceRegistry({"m": THIS_MODULE}), "m", operation, {})
    assert result.status == AbiStatus.PERMANENT
    assert operation in result.payload


def test_unloadable_dotted_path_is_permanent() -> None:
    """A typo in settings fails the call clearly rather than stopping the worker."""
    result = call(ServiceRegistry({"bad": "no.such.module_path"}), "bad", "op", {})
    assert result.status == AbiStatus.PERMANENT
    assert "cannot be loaded" in result.payload


# --- HTTP services -------------------------------------------------------------------------


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class LocalServer:
    base: str
    requests: list[Received] = field(default_factory=list)


class Handler(BaseHTTPRequestHandler):
    """Answers ``/status/<code>`` with that code and anything else with 200 and an echo."""

    server: Any

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.received.append(
            Received(self.command, self.path, dict(self.headers.items()), body)
        )
        code = 200
        if self.path.startswith("/status/"):
            code = int(self.path.rsplit("/", 1)[1])
        reply = json.dumps({"path": self.path, "echo": body.decode()}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Test", "yes")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = _answer
    do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.received = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    host, port = httpd.server_address[:2]
    local = LocalServer(f"http://{host!s}:{port}")
    local.requests = httpd.received  # type: ignore[attr-defined]
    yield local
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_http_service_posts_json_with_the_idempotency_key(server: LocalServer) -> None:
    """The operation is appended to the base URL; the request is POSTed as JSON with the
    step's idempotency key; a 2xx answer is OK with the body as payload."""
    server.requests.clear()
    registry = ServiceRegistry({"ship": f"{server.base}/api"})
    result = call(registry, "ship", "create_label", {"parcel": "ü-1"})
    assert result.status == AbiStatus.OK
    [received] = server.requests
    assert received.method == "POST"
    assert received.path == "/api/create_label"
    assert received.headers["Idempotency-Key"] == KEY
    assert received.headers["Content-Type"] == "application/json"
    assert json.loads(received.body) == {"parcel": "ü-1"}
    assert json.loads(result.payload)["path"] == "/api/create_label"


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (200, AbiStatus.OK),
        (201, AbiStatus.OK),
        (400, AbiStatus.PERMANENT),
        (404, AbiStatus.PERMANENT),
        (408, AbiStatus.ERROR),
        (429, AbiStatus.ERROR),
        (500, AbiStatus.ERROR),
        (503, AbiStatus.ERROR),
    ],
)
def test_http_status_classes(server: LocalServer, code: int, status: AbiStatus) -> None:
    """2xx is OK; 4xx is PERMANENT except 408 and 429 (retry later); 5xx is ERROR."""
    registry = ServiceRegistry({"svc": f"{server.base}/status/"})
    result = call(registry, "svc", str(code), {})
    assert result.status == status
    if status != AbiStatus.OK:
        assert f"HTTP {code}" in result.payload


def free_port() -> int:
    """A local port with nothing listening on it (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_connection_refused_is_error() -> None:
    """A service that is down is a retryable failure."""
    registry = ServiceRegistry({"down": f"http://127.0.0.1:{free_port()}/"})
    result = call(registry, "down", "op", {})
    assert result.status == AbiStatus.ERROR
    assert "refused" in result.payload.lower()


# --- fetch ---------------------------------------------------------------------------------


def test_fetch_outside_the_allow_list_is_denied() -> None:
    fetcher = Fetcher(allow=("https://api.example.com/",))
    result = fetcher.fetch("GET", "https://evil.example.net/steal", "{}", "")
    assert result.status == AbiStatus.DENIED
    assert "allow-list" in result.payload


def test_empty_allow_list_denies_everything() -> None:
    result = Fetcher().fetch("GET", "https://api.example.com/", "", "")
    assert result.status == AbiStatus.DENIED


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/",
        "http://10.1.2.3/",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata endpoint
        "http://[::1]/",
        "http://localhost/",
    ],
)
def test_private_addresses_are_denied_even_when_allow_listed(url: str) -> None:
    """A workflow must not reach the host's own network unless configured to."""
    fetcher = Fetcher(allow=("http://",))
    result = fetcher.fetch("GET", url, "", "")
    assert result.status == AbiStatus.DENIED
    assert "private address" in result.payload


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/", "/relative"])
def test_only_http_urls_can_be_fetched(url: str) -> None:
    result = Fetcher(allow=("http://", "https://")).fetch("GET", url, "", "")
    assert result.status == AbiStatus.DENIED
    assert "http(s)" in result.payload


def test_allowed_local_fetch_returns_status_headers_and_body(server: LocalServer) -> None:
    """With allow_private, a local fetch returns the response as a JSON document; request
    headers and body are passed through."""
    server.requests.clear()
    fetcher = Fetcher(allow=(server.base + "/",), allow_private=True)
    result = fetcher.fetch("post", f"{server.base}/things", '{"X-Trace": "t-1"}', "hello")
    assert result.status == AbiStatus.OK
    response = json.loads(result.payload)
    assert set(response) == {"status", "headers", "body"}
    assert response["status"] == 200
    assert response["headers"]["X-Test"] == "yes"
    assert json.loads(response["body"]) == {"path": "/things", "echo": "hello"}
    [received] = server.requests
    assert (received.method, received.headers["X-Trace"]) == ("POST", "t-1")


def test_fetch_of_an_error_page_reports_its_status(server: LocalServer) -> None:
    """An HTTP error is an answer, not a failure of the call: the guest sees the status."""
    fetcher = Fetcher(allow=(server.base,), allow_private=True)
    result = fetcher.fetch("GET", f"{server.base}/status/404", "", "")
    assert result.status == AbiStatus.OK
    assert json.loads(result.payload)["status"] == 404


def test_fetch_with_malformed_headers_is_permanent(server: LocalServer) -> None:
    fetcher = Fetcher(allow=(server.base,), allow_private=True)
    assert fetcher.fetch("GET", server.base, "not json", "").status == AbiStatus.PERMANENT
    assert fetcher.fetch("GET", server.base, "[1]", "").status == AbiStatus.PERMANENT


# --- the allow-list's rules ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "url", "allowed"),
    [
        ("https://api.example.com", "https://api.example.com/v1/x", True),
        ("https://api.example.com", "https://API.example.com/", True),
        ("https://api.example.com", "https://api.example.com.evil.net/", False),
        ("https://api.example.com", "https://api.example.com@evil.net/", False),
        ("https://api.example.com", "https://evil.net/?https://api.example.com", False),
        ("https://api.example.com", "http://api.example.com/", False),
        ("https://api.example.com", "https://api.example.com:8443/", False),
        ("https://api.example.com:443/", "https://api.example.com/", True),
        ("https://api.example.com:8443", "https://api.example.com:8443/x", True),
        ("https://api.example.com/v1", "https://api.example.com/v1", True),
        ("https://api.example.com/v1", "https://api.example.com/v1/items", True),
        ("https://api.example.com/v1", "https://api.example.com/v10/items", False),
        ("https://api.example.com/v1/", "https://api.example.com/v2/", False),
        ("https://", "https://anything.example.org/x", True),
        ("https://", "http://anything.example.org/x", False),
        ("http://", "http://anything.example.org/x", True),
        ("https://api.example.com/v1", "https://api.example.com/v1/../admin", False),
        ("https://api.example.com/v1", "https://api.example.com/v1/%2e%2e/admin", False),
        ("https://api.example.com/v1", "https://api.example.com/v1/./../admin", False),
        ("https://api.example.com/v1", "https://api.example.com/v1/..%2fadmin", False),
        ("https://api.example.com/v1", "https://api.example.com/v1/a%5c..%5cb", False),
        ("https://api.example.com/", "https://api.example.com/a/../b", False),
        ("https://api.example.com/v1", "https://api.example.com/v1/items?q=../x", True),
        ("https://api.example.com", "http://[::1", False),
        ("https://api.example.com", "https://api.example.com:99999/", False),
    ],
)
def test_allow_rules_match_scheme_exact_host_port_and_whole_path_segments(
    entry: str, url: str, allowed: bool
) -> None:
    fetcher = Fetcher(allow=(entry,), allow_private=True)
    refused = fetcher.check(url)
    assert (refused is None) == allowed, refused


def test_credentials_in_the_url_are_refused() -> None:
    fetcher = Fetcher(allow=("https://api.example.com/",), allow_private=True)
    assert "credentials" in (fetcher.check("https://user:pw@api.example.com/") or "")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("ftp://files.example.com/", r"only http\(s\)"),
        ("https://u:p@x.example.com/", "credentials"),
        ("", "only http"),
        ("   ", "only http"),
        ("https:/api.example.com/v1", "no host"),
        ("https:api.example.com", "no host"),
        ("https://:8443", "no host"),
        ("https:///v1", "no host"),
        ("https://api.example.com/v1?key=1", "no query"),
        ("https://api.example.com/v1#x", "no query"),
        ("https://[::1/", "not a URL"),
        ("https://api.example.com/v1/../admin", "dot segments"),
    ],
)
def test_an_allow_list_entry_that_cannot_be_interpreted_is_refused(
    entry: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Fetcher(allow=(entry,))


class Redirector(BaseHTTPRequestHandler):
    """``/to?<url>`` answers 302 to that URL."""

    def do_GET(self) -> None:
        target = urllib.parse.unquote(self.path.split("?", 1)[1])
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def redirector() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Redirector)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    host, port = httpd.server_address[:2]
    yield f"http://{host}:{port}"
    httpd.shutdown()
    httpd.server_close()


def test_a_redirect_off_the_allow_list_is_denied_and_not_followed(
    redirector: str, server: LocalServer
) -> None:
    server.requests.clear()
    fetcher = Fetcher(allow=(redirector + "/",), allow_private=True)
    target = urllib.parse.quote(f"{server.base}/secret", safe="")
    result = fetcher.fetch("GET", f"{redirector}/to?{target}", "", "")
    assert result.status == AbiStatus.DENIED
    assert "redirects to" in result.payload and "not on the fetch allow-list" in result.payload
    assert server.requests == []


def test_a_redirect_within_the_allow_list_is_followed(redirector: str, server: LocalServer) -> None:
    server.requests.clear()
    fetcher = Fetcher(allow=(redirector + "/", server.base + "/"), allow_private=True)
    target = urllib.parse.quote(f"{server.base}/landing", safe="")
    result = fetcher.fetch("GET", f"{redirector}/to?{target}", "", "")
    assert result.status == AbiStatus.OK
    assert json.loads(json.loads(result.payload)["body"])["path"] == "/landing"
    assert [r.path for r in server.requests] == ["/landing"]


def test_the_request_connects_to_the_address_that_was_checked(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name resolves to an acceptable address when checked and to
    another one a moment later. The request must go to the checked one. (Loopback stands in
    for the acceptable public address: the private-address test is patched to allow it.)"""
    import engine.services as services_module

    port = int(server.base.rsplit(":", 1)[1])
    answers = iter(["127.0.0.1"])
    real = socket.getaddrinfo

    def rebinding(host: str, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, *args, **kwargs)
        # First answer: the checked address; any later one: an unroutable address.
        address = next(answers, "10.255.255.1")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    monkeypatch.setattr(services_module, "_forbidden", lambda addr: str(addr) == "10.255.255.1")
    server.requests.clear()
    fetcher = Fetcher(allow=(f"http://rebind.test:{port}/",), timeout_s=3)
    result = fetcher.fetch("GET", f"http://rebind.test:{port}/pinned", "", "")
    assert result.status == AbiStatus.OK, result.payload
    assert json.loads(json.loads(result.payload)["body"])["path"] == "/pinned"
    [received] = server.requests
    assert received.headers["Host"] == f"rebind.test:{port}"  # the name, not the address


# --- addresses that are not globally routable, and requests that cannot be sent --------------


@pytest.mark.parametrize(
    "address",
    [
        "100.100.100.200",  # shared address space 100.64.0.0/10 (a cloud's metadata service)
        "100.64.0.1",
        "192.0.2.1",  # documentation
        "198.18.0.1",  # benchmarking
        "240.0.0.1",  # reserved
        "224.0.0.1",  # multicast
        "0.0.0.0",
        "2002:7f00:1::",  # 6to4 embedding 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 embedding 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::6464:64c8",  # NAT64 of 100.100.100.200
        "::ffff:10.0.0.1",  # IPv4-mapped
        "::127.0.0.1",  # IPv4-compatible (deprecated)
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "fc00::1",
        "fe80::1",
        "ff02::1",
    ],
)
def test_addresses_that_are_not_globally_routable_are_denied(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule is "globally routable", checked on the address the name resolves to and on
    the IPv4 address a translated or tunnelled IPv6 address reaches."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET

    def resolves(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolves)
    fetcher = Fetcher(allow=("https://api.example.com/",))
    result = fetcher.fetch("GET", "https://api.example.com/x", "", "")
    assert result.status == AbiStatus.DENIED, address
    assert "private address" in result.payload and "globally routable" in result.payload


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "2001:4860:4860::8888", "::ffff:8.8.8.8", "2002:808:808::1"]
)
def test_globally_routable_addresses_pass_the_address_check(address: str) -> None:
    from engine.services import _forbidden

    assert not _forbidden(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("method", "headers", "fault"),
    [
        ("GET", {"X-Evil": "a\r\nHost: internal"}, "control character"),
        ("GET", {"X-Evil": "a\nb"}, "control character"),
        ("GET", {"X-Nul": "a\x00b"}, "control character"),
        ("GET", {"Bad Name": "x"}, "not a valid HTTP header name"),
        ("GET", {"X\r\nInjected": "x"}, "not a valid HTTP header name"),
        ("GE\r\nT", {}, "is not an HTTP method"),
        ("GET /admin HTTP/1.1\x00", {}, "is not an HTTP method"),
    ],
)
def test_header_injection_and_bad_methods_are_permanent(
    server: LocalServer, method: str, headers: dict[str, str], fault: str
) -> None:
    """Refused before anything is sent, as PERMANENT (the same request fails the same way),
    not raised from inside http.client (which the run would retry as an internal error)."""
    fetcher = Fetcher(allow=(server.base,), allow_private=True)
    result = fetcher.fetch(method, server.base, json.dumps(headers), "")
    assert result.status == AbiStatus.PERMANENT, result
    assert fault in result.payload


def test_a_tab_in_a_header_value_is_sent(server: LocalServer) -> None:
    fetcher = Fetcher(allow=(server.base,), allow_private=True)
    result = fetcher.fetch("GET", server.base, json.dumps({"X-Tab": "a\tb"}), "")
    assert result.status == AbiStatus.OK, result
