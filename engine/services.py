"""What ``durable_call``, ``fetch`` and ``plugin_call`` reach.

* **Python services**: ``{"payments": "myapp.services.payments"}``. The dotted path names a
  module or object whose attribute ``operation`` is called, or a single callable that serves
  every operation (it reads ``context.operation``). It is called as
  ``fn(request, *, idempotency_key=..., context=...)`` with the request parsed from JSON and
  returns something JSON-serialisable. Raising :class:`engine.errors.PermanentError` maps to
  ``PERMANENT``; any other exception to ``ERROR``.
* **Task services**: ``{"billing": "celery:billing.tasks?queue=payments"}``. The call runs as
  a task in another system (a Celery task ``billing.tasks.<operation>``): the session sends it
  once and suspends the run, and the task's outcome, recorded by a hook where the task runs,
  becomes the call's reply (see :class:`TaskService`). A scheme (``celery``) is made into a
  service by the factory registered for it (:func:`register_task_scheme`; the workflows app
  registers Celery's); an object with a ``send_task_call`` method is a task service itself.
* **HTTP services**: ``{"shipping": "https://ship.example/api/"}``. The operation is appended
  to the base URL and the request POSTed as JSON with an ``Idempotency-Key`` header;
  2xx is ``OK``, 4xx (except 408 and 429) is ``PERMANENT``, anything else ``ERROR``.
"""

from __future__ import annotations

import http.client
import importlib
import ipaddress
import json
import json.encoder
import logging
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from opentelemetry.trace import Tracer

from engine.errors import PermanentError
from engine.events import json_loads
from engine.status import AbiStatus
from engine.tracing import TRACEPARENT, current_traceparent
from engine.versions import parse_semver

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallContext:
    """Given to a Python service with every call."""

    tenant_id: str
    workflow_id: str
    run_id: str
    step: int
    service: str
    operation: str
    idempotency_key: str
    attempt: int = 1


class CallResult(NamedTuple):
    status: AbiStatus
    payload: str  # the response on OK, the error message otherwise


class ServiceCaller(Protocol):
    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        """Make one call. Never raises for a failure of the service: returns its status."""


@dataclass(frozen=True, slots=True)
class TaskCall:
    """One durable call sent as a task: everything the task's message carries."""

    task_id: str
    token: str  # per-call secret: an outcome reported for the call must carry it
    request: str  # JSON
    context: CallContext


class TaskService(Protocol):
    """A service whose operations run as tasks elsewhere (Celery). ``durable_call`` sends
    the task and suspends the run; the outcome arrives later through storage."""

    timeout_ms: int  # no outcome within this time: the call returns TIMEOUT

    def send_task_call(self, call: TaskCall) -> None:
        """Publish the task. Raises when it could not be sent (the session tries again)."""

    def revoke_task_call(self, task_id: str) -> None:
        """Best effort: the call's outcome is no longer wanted (timeout, cancellation)."""


TaskServiceFactory = Callable[[str, str], TaskService]
_task_schemes: dict[str, TaskServiceFactory] = {}


def register_task_scheme(scheme: str, factory: TaskServiceFactory) -> None:
    """Make ``scheme:target`` in ``CLEAT_SERVICES`` a task service: ``factory(target,
    service_name)`` builds it on first use."""
    _task_schemes[scheme] = factory


def is_task_service(target: Any) -> bool:
    return callable(getattr(target, "send_task_call", None))


class AmbiguityResolver(Protocol):
    def __call__(self, service: str, operation: str, idempotency_key: str) -> str | None:
        """The response of the call made with this key, or None when it cannot say."""


def import_dotted(path: str) -> Any:
    """Import ``a.b.c``: the module ``a.b.c``, else attribute ``c`` of module ``a.b``."""
    try:
        return importlib.import_module(path)
    except ImportError:
        module, _, attr = path.rpartition(".")
        if not module:
            raise
        return getattr(importlib.import_module(module), attr)


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
_json_string: Callable[[str], str] = json.encoder.encode_basestring


def _dumps(value: Any) -> str:
    """A Python value as the JSON document a guest receives (a ``str`` becomes a JSON
    string: services answer with values, not with JSON text).

    The text of ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)``, without
    building a ``JSONEncoder`` per call: its C encoder is made directly, with a fresh
    circular-reference memo each time, exactly as ``JSONEncoder.encode`` makes it."""
    if isinstance(value, str):
        return _json_string(value)
    if _make_encoder is None:  # an interpreter without the C accelerator
        return _ENCODER.encode(value)
    encoder = _make_encoder({}, _ENCODER.default, _json_string, None, ":", ",", False, False, True)
    return "".join(encoder(value, 0))


# A NamedTuple's own __new__ is a Python function; tuple.__new__ builds the same instance.
_new_tuple = tuple.__new__


class PythonService:
    def __init__(self, target: Any) -> None:
        self.target = target

    @property
    def target(self) -> Any:
        return self._target

    @target.setter
    def target(self, target: Any) -> None:
        self._target = target
        # A callable that is not a class or module serves every operation itself.
        is_container = (
            isinstance(target, type)
            or hasattr(target, "__path__")
            or (type(target).__name__ == "module")
        )
        self._serves_all = callable(target) and not is_container

    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        try:
            parsed = json_loads(request) if request else None
        except json.JSONDecodeError as exc:
            return CallResult(AbiStatus.PERMANENT, f"request is not valid JSON: {exc}")
        fn = self._function(operation)
        if fn is None:
            return CallResult(
                AbiStatus.PERMANENT, f"service {service!r} has no operation {operation!r}"
            )
        try:
            result = fn(parsed, idempotency_key=context.idempotency_key, context=context)
            return _new_tuple(CallResult, (AbiStatus.OK, _dumps(result)))
        except PermanentError as exc:
            return CallResult(AbiStatus.PERMANENT, str(exc) or type(exc).__name__)
        except Exception as exc:
            return CallResult(AbiStatus.ERROR, f"{type(exc).__name__}: {exc}")

    def _function(self, operation: str) -> Callable[..., Any] | None:
        target = self._target
        if self._serves_all:
            return target  # type: ignore[no-any-return]
        if operation.startswith("_"):
            return None
        fn = getattr(target, operation, None)
        return fn if callable(fn) else None


def _traced_headers(headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with the current span's ``traceparent`` (engine.tracing), unless there is
    no current span or the caller set one: added here, at the I/O boundary, so the recorded
    request never depends on tracing."""
    traceparent = current_traceparent()
    if traceparent is not None and not any(k.lower() == TRACEPARENT for k in headers):
        headers[TRACEPARENT] = traceparent
    return headers


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A service that redirects is answered as the HTTP error it is: a redirect would carry
    the bearer token to wherever it points and turn the POST into a GET."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_SERVICE_OPENER = urllib.request.build_opener(_NoRedirects)


class HttpService:
    """An HTTP service: ``POST base_url + operation``. ``token`` gives the bearer token to send
    (``Authorization: Bearer …``), asked at every call so a rotated one is used at once; a
    token that cannot be had fails the call retryably, naming the service."""

    def __init__(
        self, base_url: str, timeout_s: float = 30.0, token: Callable[[], str] | None = None
    ) -> None:
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.timeout_s = timeout_s
        self.token = token

    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        url = urllib.parse.urljoin(self.base_url, urllib.parse.quote(operation))
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": context.idempotency_key,
        }
        if self.token is not None:
            try:
                token = self.token()
            except Exception as exc:
                return CallResult(AbiStatus.ERROR, f"service {service!r}: no bearer token: {exc}")
            if any(c in token for c in "\r\n\0"):  # never sent, never quoted
                return CallResult(
                    AbiStatus.ERROR,
                    f"service {service!r}: its bearer token contains a line break or NUL "
                    "(check the secret it is read from)",
                )
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(
            url, data=request.encode(), method="POST", headers=_traced_headers(headers)
        )
        try:
            with _SERVICE_OPENER.open(req, timeout=self.timeout_s) as resp:
                return CallResult(AbiStatus.OK, resp.read().decode("utf-8", "replace"))
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:2000]
            permanent = 400 <= exc.code < 500 and exc.code not in (408, 429)
            status = AbiStatus.PERMANENT if permanent else AbiStatus.ERROR
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location", "?") if exc.headers else "?"
                return CallResult(
                    AbiStatus.ERROR,
                    f"HTTP {exc.code} from {url}: services are not followed to another "
                    f"address ({where}); configure the service's final URL",
                )
            return CallResult(status, f"HTTP {exc.code} from {url}: {body}")
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            return CallResult(AbiStatus.ERROR, f"{url}: {exc}")
        except ValueError:  # its message would quote the header value
            return CallResult(AbiStatus.ERROR, f"{url}: the request has an invalid header")


class ServiceRegistry:
    """Resolves ``durable_call`` targets: each name to a Python service or an HTTP service.

    Targets are resolved lazily (first call), so a typo in settings fails the call that
    uses it with a clear ``PERMANENT`` message instead of stopping the worker.
    """

    honours_idempotency_keys = True

    def __init__(
        self,
        services: Mapping[str, Any] | None = None,
        http_timeout_s: float = 30.0,
        tokens: Mapping[str, Callable[[], str]] | None = None,
    ):
        self._spec = dict(services or {})
        self._resolved: dict[str, PythonService | HttpService] = {}
        self._tasks: dict[str, TaskService] = {}
        self.http_timeout_s = http_timeout_s
        self._tokens = dict(tokens or {})

    def register(self, name: str, target: Any) -> None:
        self._spec[name] = target
        self._resolved.pop(name, None)
        self._tasks.pop(name, None)

    def task_service(self, name: str) -> TaskService | str | None:
        """The task service ``name`` is bound to; None for any other kind of service; the
        reason as text when it is a task service that cannot be built."""
        found = self._tasks.get(name)
        if found is not None:
            return found
        target = self._spec.get(name)
        if is_task_service(target):
            service: TaskService = target  # type: ignore[assignment]
            self._tasks[name] = service
            return service
        if not isinstance(target, str) or target.startswith(("http://", "https://")):
            return None
        scheme, colon, rest = target.partition(":")
        if not colon or "." in scheme:
            return None
        factory = _task_schemes.get(scheme)
        if factory is None:
            return f"service {name!r}: no task system {scheme!r} is installed (in {target!r})"
        try:
            built = factory(rest, name)
        except (ImportError, ValueError) as exc:
            return f"service {name!r} cannot be set up from {target!r}: {exc}"
        self._tasks[name] = built
        return built

    def _resolve(self, name: str) -> PythonService | HttpService | str:
        if name in self._resolved:
            return self._resolved[name]
        if name not in self._spec:
            return f"unknown service {name!r} (configure it in CLEAT_SERVICES)"
        target = self._spec[name]
        tasks = self.task_service(name)
        if tasks is not None:
            return tasks if isinstance(tasks, str) else f"service {name!r} runs as tasks"
        try:
            if isinstance(target, str) and target.startswith(("http://", "https://")):
                resolved: PythonService | HttpService = HttpService(
                    target, self.http_timeout_s, self._tokens.get(name)
                )
            elif isinstance(target, str):
                resolved = PythonService(import_dotted(target))
            else:
                resolved = PythonService(target)
        except (ImportError, AttributeError) as exc:
            return f"service {name!r} cannot be loaded from {target!r}: {exc}"
        self._resolved[name] = resolved
        return resolved

    def call(self, service: str, operation: str, request: str, context: CallContext) -> CallResult:
        target = self._resolve(service)
        if isinstance(target, str):
            return CallResult(AbiStatus.PERMANENT, target)
        return target.call(service, operation, request, context)


_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class AllowRule:
    """One entry of the fetch allow-list, parsed: ``https://api.example.com/v1/`` allows
    that scheme, that host (exactly: not ``api.example.com.evil.net``), that port (the
    scheme's default when none is written) and paths at or under ``/v1/``. Exactly
    ``https://`` (or ``http://``) allows any host over that scheme. Anything else without a
    host, with credentials, a query or a fragment, is refused: a typo must not widen it."""

    scheme: str
    host: str | None
    port: int | None
    path: str

    @classmethod
    def parse(cls, entry: str) -> AllowRule:
        text = entry.strip()

        def refuse(why: str) -> ValueError:
            return ValueError(f"fetch allow-list entry {entry!r}: {why}")

        if text.lower() in ("http://", "https://"):
            return cls(text.lower()[:-3], None, None, "")
        try:
            parts = urllib.parse.urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise refuse(f"not a URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise refuse("only http(s) URLs such as https://api.example.com/v1")
        if parts.username is not None or parts.password is not None:
            raise refuse("no credentials in it")
        if not parts.hostname or not text.lower().startswith(f"{scheme}://"):
            raise refuse("no host (write https://host/path, or exactly https:// for any host)")
        if parts.query or parts.fragment or text.endswith(("?", "#")):
            raise refuse("no query or fragment")
        if _unsafe_path(parts.path):
            raise refuse("no dot segments or encoded slashes in the path")
        return cls(scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme], parts.path)

    def allows(self, parts: urllib.parse.SplitResult) -> bool:
        scheme = parts.scheme.lower()
        if scheme != self.scheme:
            return False
        if self.host is None:
            return True
        try:
            port = parts.port or _DEFAULT_PORTS.get(scheme)
        except ValueError:
            return False
        if (parts.hostname or "").lower() != self.host or port != self.port:
            return False
        if self.path in ("", "/"):
            return True
        path = parts.path or "/"
        prefix = self.path if self.path.endswith("/") else self.path + "/"
        return path == self.path or path.startswith(prefix)


def _unsafe_path(path: str) -> bool:
    """A path a server may read differently from its text: ``.``/``..`` segments (also
    percent-encoded), encoded slashes or backslashes. Compared as text, ``/v1/../admin``
    would pass a ``/v1`` rule and reach ``/admin``."""
    lowered = path.lower()
    if "\\" in path or "%2f" in lowered or "%5c" in lowered:
        return True
    return any(seg in (".", "..") for seg in urllib.parse.unquote(path).split("/"))


class _RefusedRedirect(Exception):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url = url
        self.reason = reason


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to a URL the fetcher would fetch itself: a redirect must
    not carry a request off the allow-list or into the private network."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        try:
            target = urllib.parse.urljoin(req.full_url, newurl)
        except ValueError as exc:
            fp.close()
            raise _RefusedRedirect(newurl, f"not a valid URL: {exc}") from None
        refused, pin = self.fetcher.vet(target)
        if refused:
            fp.close()  # the redirect's own response is not read
            raise _RefusedRedirect(target, refused)
        follow = super().redirect_request(req, fp, code, msg, headers, newurl)
        if follow is not None:
            follow.cleat_pin = pin  # type: ignore[attr-defined]
        return follow


def _pinned(connection_class: Any, req: Any) -> Callable[..., Any]:
    """A connection factory for ``do_open`` that connects to the address :meth:`Fetcher.vet`
    checked, not to whatever the host name resolves to a moment later (DNS rebinding: a
    first answer that passes the private-address check, a second that points inside). TLS
    still verifies the certificate against the host name. Not pinned when the request goes
    through a proxy (the connection is then to the proxy, which resolves the host)."""
    pin: tuple[str, str] | None = getattr(req, "cleat_pin", None)

    def factory(host: str, **kwargs: Any) -> Any:
        conn = connection_class(host, **kwargs)
        if pin is not None and conn.host.lower() == pin[0]:
            address = pin[1]

            def create(target: tuple[str, int], *args: Any, **kw: Any) -> socket.socket:
                return socket.create_connection((address, target[1]), *args, **kw)

            conn._create_connection = create
        return conn

    return factory


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: Any) -> Any:
        return self.do_open(_pinned(http.client.HTTPConnection, req), req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: Any) -> Any:
        context = getattr(self, "_context", None)  # HTTPSHandler's own TLS context
        return self.do_open(_pinned(http.client.HTTPSConnection, req), req, context=context)


# NAT64's well-known prefix (RFC 6052): the last 32 bits are the IPv4 address reached.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# IPv4-compatible addresses (``::a.b.c.d``, deprecated by RFC 4291): never globally routed,
# though Python's registry does not say so.
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _embedded_ipv4(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address reaches through a translation or a tunnel: 6to4
    (``2002::/16``), Teredo (server and client), NAT64 (``64:ff9b::/96``)."""
    found = [addr.sixtofour] if addr.sixtofour is not None else []
    if addr.teredo is not None:
        found.extend(addr.teredo)
    if addr in _NAT64:
        found.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    return found


def _forbidden(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address a workflow may not reach without ``allow_private``: any that is not
    globally routable (IANA's special-purpose registries: private, loopback, link-local,
    shared ``100.64.0.0/10``, documentation, benchmarking, reserved...), multicast, and an
    IPv6 address that embeds such an IPv4 address (IPv4-mapped, 6to4, Teredo, NAT64). A
    list of bad ranges misses the ones nobody listed; "not global" does not."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return _forbidden(addr.ipv4_mapped)
        if addr in _IPV4_COMPATIBLE or any(_forbidden(inner) for inner in _embedded_ipv4(addr)):
            return True
    return not addr.is_global or addr.is_multicast


# RFC 9110 token: a method or a header name.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# A header value: visible characters, spaces and tabs; no CR, LF, NUL or other controls.
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


def _request_fault(method: str, headers: Mapping[Any, Any]) -> str | None:
    """Why the guest's method or headers cannot be sent (header injection, a method with
    control characters), or None."""
    if not _TOKEN.fullmatch(method):
        return f"{method!r} is not an HTTP method (letters, digits and !#$%&'*+-.^_`|~ only)"
    for name, value in headers.items():
        if not _TOKEN.fullmatch(str(name)):
            return f"header name {str(name)!r} is not a valid HTTP header name"
        if not _HEADER_VALUE.fullmatch(str(value)):
            return (
                f"the value of header {str(name)!r} contains a control character "
                "(CR, LF, NUL...), which HTTP does not allow"
            )
    return None


class Fetcher:
    """HTTP requests from workflows, through an allow-list (:class:`AllowRule`: scheme,
    exact host and port, path prefix by whole segments).

    Private, loopback and link-local addresses are refused unless ``allow_private`` is set:
    a workflow is untrusted code and must not reach the host's own network. URLs carrying
    credentials (``https://user:pw@host/``) are refused, and redirects are followed only to
    URLs that pass the same checks.
    """

    def __init__(
        self, allow: Iterable[str] = (), allow_private: bool = False, timeout_s: float = 30.0
    ) -> None:
        self.allow = tuple(allow)
        self.rules = tuple(AllowRule.parse(entry) for entry in self.allow)
        self.allow_private = allow_private
        self.timeout_s = timeout_s
        self._opener = urllib.request.build_opener(
            _CheckedRedirects(self), _PinnedHTTPHandler(), _PinnedHTTPSHandler()
        )

    def check(self, url: str) -> str | None:
        """None when ``url`` may be fetched, else the reason it may not."""
        return self.vet(url)[0]

    def vet(self, url: str) -> tuple[str | None, tuple[str, str] | None]:
        """(the reason ``url`` may not be fetched, or None; and, when addresses were
        checked, ``(host, address)``: the checked address the request must connect to)."""
        try:
            parsed = urllib.parse.urlsplit(url)
            parsed.port  # noqa: B018 -- raises ValueError for a bad port
        except ValueError as exc:
            return f"{url!r} is not a valid URL: {exc}", None
        if parsed.scheme.lower() not in _DEFAULT_PORTS or not parsed.hostname:
            return f"only absolute http(s) URLs can be fetched, not {url!r}", None
        if parsed.username is not None or parsed.password is not None:
            return "URLs with credentials are not fetched: send them in a header", None
        if _unsafe_path(parsed.path):
            return f"{url} has dot segments or encoded slashes in its path", None
        if not any(rule.allows(parsed) for rule in self.rules):
            return f"{url} is not on the fetch allow-list", None
        if self.allow_private:
            return None, None
        try:
            port = parsed.port or _DEFAULT_PORTS[parsed.scheme.lower()]
            infos = socket.getaddrinfo(parsed.hostname, port, type=socket.SOCK_STREAM)
        except (OSError, ValueError) as exc:
            return f"cannot resolve {parsed.hostname}: {exc}", None
        addresses = [str(info[4][0]) for info in infos]
        for text in addresses:
            addr = ipaddress.ip_address(text.split("%")[0])
            if _forbidden(addr):
                return (
                    f"{parsed.hostname} resolves to a private address ({addr}): only globally "
                    "routable addresses are fetched",
                    None,
                )
        if not addresses:
            return f"cannot resolve {parsed.hostname}: no address", None
        return None, (parsed.hostname.lower(), addresses[0])

    def fetch(self, method: str, url: str, headers: str, body: str) -> CallResult:
        refused, pin = self.vet(url)
        if refused:
            return CallResult(AbiStatus.DENIED, refused)
        try:
            header_map = json.loads(headers) if headers else {}
        except json.JSONDecodeError as exc:
            return CallResult(AbiStatus.PERMANENT, f"headers are not a JSON object: {exc}")
        if not isinstance(header_map, dict):
            return CallResult(AbiStatus.PERMANENT, "headers must be a JSON object")
        method = method.upper() or "GET"
        fault = _request_fault(method, header_map)
        if fault is not None:
            return CallResult(AbiStatus.PERMANENT, fault)
        req = urllib.request.Request(
            url,
            data=body.encode() if body else None,
            method=method,
            headers=_traced_headers({str(k): str(v) for k, v in header_map.items()}),
        )
        req.cleat_pin = pin  # type: ignore[attr-defined]
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                status, resp_headers, data = resp.status, dict(resp.headers), resp.read()
        except _RefusedRedirect as exc:
            return CallResult(AbiStatus.DENIED, f"{url} redirects to {exc.url}: {exc.reason}")
        except urllib.error.HTTPError as exc:
            status, resp_headers, data = exc.code, dict(exc.headers), exc.read()
        except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as exc:
            # HTTPException: the server broke the protocol (a truncated body, a bad status
            # line) -- worth another try, like a dropped connection.
            return CallResult(AbiStatus.ERROR, f"{url}: {type(exc).__name__}: {exc}")
        except ValueError as exc:
            # http.client refusing what it would send: the same request fails the same way.
            return CallResult(AbiStatus.PERMANENT, f"{url}: the request cannot be sent: {exc}")
        text = data.decode("utf-8", "replace")
        return CallResult(
            AbiStatus.OK,
            json.dumps({"status": status, "headers": resp_headers, "body": text}),
        )


UNVERSIONED = "0.0.0"  # the version of a plugin configured without versions


@dataclass(frozen=True)
class PluginCaller:
    """Who makes a plugin call (the guard's question) and the version its definition pinned
    at deploy (None: the newest configured)."""

    tenant: str = ""
    workflow: str = ""
    version: str | None = None


class PluginRegistry:
    """Host plugins, as ``CLEAT_PLUGINS`` configures them: ``{"llm": "myapp.plugins.llm"}``,
    or with versions ``{"llm": {"1.2.0": "myapp.llm_v1", "2.0.0": "myapp.llm_v2"}}``.
    ``plugin_call(plugin, fn, input)`` calls attribute ``fn`` with the parsed input; a
    streaming function returns an iterable of chunks.

    As the reference's ``PluginRegistry`` and ``PluginCallGuard``: a function that raises
    anything but :class:`PermanentError` marks its whole plugin unhealthy for
    ``cooldown_s`` seconds, during which every call to it answers ``ERROR`` without being
    made; ``guard`` (``{"llm": {"tenants": [...], "workflows": [...]}}``, ``"*"`` for any)
    says which tenants and workflow definitions may call a plugin it names (``DENIED``
    otherwise; a plugin it does not name is open to all)."""

    def __init__(
        self,
        plugins: Mapping[str, Any] | None = None,
        *,
        guard: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
        cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._spec: dict[str, dict[str, Any]] = {}
        for name, target in (plugins or {}).items():
            if isinstance(target, Mapping):
                self._spec[name] = dict(target)
            else:
                self._spec[name] = {UNVERSIONED: target}
        self._guard = {name: dict(rule) for name, rule in (guard or {}).items()}
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._unhealthy: dict[str, tuple[float, str]] = {}  # plugin -> (until, error)
        self._lock = threading.Lock()

    def versions(self) -> dict[str, list[str]]:
        """Each configured plugin's versions (what deploy resolves constraints against)."""
        return {name: list(by_version) for name, by_version in self._spec.items()}

    def unhealthy(self) -> dict[str, str]:
        """The plugins in their cool-down now, with the error that put them there."""
        now = self.clock()
        with self._lock:
            return {p: err for p, (until, err) in self._unhealthy.items() if until > now}

    def _mark_unhealthy(self, plugin: str, error: str) -> None:
        with self._lock:
            self._unhealthy[plugin] = (self.clock() + self.cooldown_s, error)
        log.warning("plugin %s marked unhealthy for %gs: %s", plugin, self.cooldown_s, error)

    def _refusal(self, plugin: str, caller: PluginCaller) -> CallResult | None:
        rule = self._guard.get(plugin)
        if rule is not None:
            for key, who in (("tenants", caller.tenant), ("workflows", caller.workflow)):
                allowed = list(rule.get(key, ["*"]))
                if "*" not in allowed and who not in allowed:
                    return CallResult(
                        AbiStatus.DENIED,
                        f"plugin {plugin!r} may not be called by {key[:-1]} {who!r}",
                    )
        sick = self.unhealthy().get(plugin)
        if sick is not None:
            return CallResult(
                AbiStatus.ERROR, f"plugin {plugin!r} is unhealthy (cooling down): {sick}"
            )
        return None

    def _function(
        self, plugin: str, function: str, version: str | None
    ) -> Callable[..., Any] | str:
        if plugin not in self._spec:
            return f"unknown plugin {plugin!r}"
        by_version = self._spec[plugin]
        if version is None:
            version = max(by_version, key=lambda v: parse_semver(v) or (0, 0, 0))
        if version not in by_version:
            return f"plugin {plugin!r} has no version {version} (pinned at deploy)"
        target = by_version[version]
        try:
            obj = import_dotted(target) if isinstance(target, str) else target
        except (ImportError, AttributeError) as exc:
            return f"plugin {plugin!r} cannot be loaded: {exc}"
        fn = None if function.startswith("_") else getattr(obj, function, None)
        if not callable(fn):
            return f"plugin {plugin!r} has no function {function!r}"
        return fn  # type: ignore[no-any-return]

    def call(
        self, plugin: str, function: str, input: str, caller: PluginCaller | None = None
    ) -> CallResult:
        caller = caller or PluginCaller()
        refused = self._refusal(plugin, caller)
        if refused is not None:
            return refused
        fn = self._function(plugin, function, caller.version)
        if isinstance(fn, str):
            return CallResult(AbiStatus.PERMANENT, fn)
        try:
            return CallResult(AbiStatus.OK, _dumps(fn(json.loads(input) if input else None)))
        except PermanentError as exc:
            return CallResult(AbiStatus.PERMANENT, str(exc))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._mark_unhealthy(plugin, error)
            return CallResult(AbiStatus.ERROR, error)

    def stream(
        self, plugin: str, function: str, input: str, caller: PluginCaller | None = None
    ) -> Iterator[str] | CallResult:
        caller = caller or PluginCaller()
        refused = self._refusal(plugin, caller)
        if refused is not None:
            return refused
        fn = self._function(plugin, function, caller.version)
        if isinstance(fn, str):
            return CallResult(AbiStatus.PERMANENT, fn)
        try:
            chunks = fn(json.loads(input) if input else None)
        except PermanentError as exc:
            return CallResult(AbiStatus.PERMANENT, str(exc))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._mark_unhealthy(plugin, error)
            return CallResult(AbiStatus.ERROR, error)
        return self._watched(plugin, chunks)

    def _watched(self, plugin: str, chunks: Iterable[Any]) -> Iterator[str]:
        """The chunks; a stream that raises midway marks its plugin unhealthy too."""
        try:
            for chunk in chunks:
                yield _dumps(chunk)
        except PermanentError:
            raise
        except Exception as exc:
            self._mark_unhealthy(plugin, f"{type(exc).__name__}: {exc}")
            raise


@dataclass
class Services:
    """Everything outside the workflow that a segment may reach."""

    caller: ServiceCaller
    fetcher: Fetcher
    plugins: PluginRegistry
    resolvers: Mapping[str, AmbiguityResolver]
    # The OpenTelemetry tracer of the segment's spans; None: tracing off (engine.tracing).
    tracer: Tracer | None = None
    # Called on a batch thread after each call a ``durable_call_many`` made on it (the
    # Django app closes that thread's database connections there); None: nothing to do.
    after_batch_call: Callable[[], None] | None = None

    @classmethod
    def from_settings(
        cls,
        services: Mapping[str, Any] | None = None,
        *,
        fetch_allow: Iterable[str] = (),
        fetch_allow_private: bool = False,
        plugins: Mapping[str, Any] | None = None,
        resolvers: Mapping[str, Any] | None = None,
        plugin_guard: Mapping[str, Mapping[str, Sequence[str]]] | None = None,
        plugin_cooldown_s: float = 60.0,
        service_tokens: Mapping[str, Callable[[], str]] | None = None,
        tracer: Tracer | None = None,
    ) -> Services:
        loaded = {
            name: (import_dotted(path) if isinstance(path, str) else path)
            for name, path in (resolvers or {}).items()
        }
        return cls(
            caller=ServiceRegistry(services, tokens=service_tokens),
            fetcher=Fetcher(fetch_allow, fetch_allow_private),
            plugins=PluginRegistry(plugins, guard=plugin_guard, cooldown_s=plugin_cooldown_s),
            resolvers=loaded,
            tracer=tracer,
        )
