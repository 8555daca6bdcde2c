"""Tracing (workflows/tracing.py, engine/tracing.py), on every database: a run started
through the API with a W3C ``traceparent`` is executed in-process and its spans, caught by
an in-memory exporter, form the expected tree -- the start under the caller's span, each
segment under the start, calls, fetches and child starts under their segment, a child's
segments under its child-start span, the continued run's segments in the same trace -- and
HTTP services and fetch send the current span as ``traceparent``. Replayed calls make no
span and tracing changes no recorded event. Off (the default), nothing is exported and no
trace is stored; a malformed ``traceparent`` is ignored, not refused."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.events import FetchEvent
from engine.services import Fetcher
from engine.tracing import parse_traceparent
from tests.fixtures.wat import Wat
from tests.integration.test_api_support import Api, key_for
from workflows import tracing
from workflows.models import Role, Tenant, WorkflowInstance
from workflows.tenancy import tenant_context
from workflows.testing import DatabaseWorkflowEnvironment

pytestmark = pytest.mark.django_db(transaction=True)

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


class Recorder:
    """A local HTTP server answering every request ``{"ok": true}`` and keeping each
    request's path and headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                recorder.requests.append(
                    (self.path, {k.lower(): v for k, v in self.headers.items()})
                )
                body = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()

    def traceparents(self, path: str) -> list[str]:
        return [h.get("traceparent", "") for p, h in self.requests if p == path]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    made = Recorder()
    yield made
    made.close()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on, to an in-memory exporter (off again afterwards)."""
    caught = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(caught))
    tracing.use_provider(provider)
    yield caught
    tracing.use_provider(None)
    provider.shutdown()


@pytest.fixture
def api(tenant: Tenant) -> Iterator[Api]:
    cache.clear()
    yield Api(key_for(tenant, Role.ADMIN))
    cache.clear()


def make_env(tenant: Tenant, recorder: Recorder) -> DatabaseWorkflowEnvironment:
    env = DatabaseWorkflowEnvironment(tenant, {"ledger": recorder.url})
    env.services.fetcher = Fetcher([recorder.url], allow_private=True)
    return env


def parent_wasm(url: str) -> bytes:
    """A call, a fetch and a child it awaits (the await suspends: a second segment replays
    the rest), then continue-as-new once (the workflow's counter)."""
    w = Wat()
    w.run(
        f"""
    (local.set $n (call $incr_state {w.s("count")} (i64.const 1)))
    (call $rec (call $durable_call {w.s("ledger")} {w.s("charge")} {w.input()}))
    (call $rec (call $fetch {w.s("GET")} {w.s(url + "page")} {w.s("")} {w.s("")}))
    (local.set $c (call $child_workflow {w.s("kid")} {w.js({"k": 1})}))
    (call $rec (call $await_child {w.payload("c")}))
    (if (i64.lt_s (local.get $n) (i64.const 2))
      (then (drop (call $continue_as_new {w.js({"again": True})}))))
    (call $finish)""",
        locals="$n i64 $c i64",
    )
    return w.wasm()


def kid_wasm() -> bytes:
    w = Wat()
    w.run(
        f"(call $rec (call $durable_call {w.s('ledger')} {w.s('kid')} {w.input()})) (call $finish)"
    )
    return w.wasm()


def instance(tenant: Tenant, run_id: str) -> WorkflowInstance:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id)


def hexid(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


def parent_id(span: ReadableSpan) -> str | None:
    return f"{span.parent.span_id:016x}" if span.parent is not None else None


def test_a_traced_run_makes_the_span_tree_in_the_callers_trace(
    tenant: Tenant, api: Api, recorder: Recorder, exporter: InMemorySpanExporter
) -> None:
    env = make_env(tenant, recorder)
    try:
        assert api.deploy("traced", parent_wasm(recorder.url)).status_code == 201
        assert api.deploy("kid", kid_wasm()).status_code == 201
        started = api.post(
            "/api/v1/workflows",
            {"definition": "traced", "input": {"n": 1}},
            HTTP_TRACEPARENT=CALLER,
        )
        assert started.status_code == 201, started.content
        first = started.json()["id"]
        assert started.json()["trace_id"] == CALLER_TRACE
        env.run_until_idle()
        chain = [r["id"] for r in api.get(f"/api/v1/workflows/{first}/chain").json()["results"]]
        assert len(chain) == 2 and chain[0] == first
        assert env.status(chain[1]) == "done", env.describe(chain[1])
        second = chain[1]
        history = env.history(first)
    finally:
        env.close()
    spans = exporter.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in spans} == {CALLER_TRACE}
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (start,) = by_name["cleat.start"]
    assert parent_id(start) == CALLER_SPAN
    assert start.attributes is not None and start.attributes["cleat.run_id"] == first
    segments = {hexid(s): s for s in by_name["cleat.segment"]}

    def segments_of(run_id: str) -> list[ReadableSpan]:
        return [s for s in segments.values() if (s.attributes or {})["cleat.run_id"] == run_id]

    # The first run: a segment up to the await, and one that replays and continues as new;
    # the continued run keeps the trace (its segments under the same start span).
    assert [(s.attributes or {})["cleat.outcome"] for s in segments_of(first)] == [
        "suspended",
        "continued",
    ]
    assert [(s.attributes or {})["cleat.outcome"] for s in segments_of(second)][-1] == "completed"
    for run_id in (first, second):
        assert {parent_id(s) for s in segments_of(run_id)} == {hexid(start)}
        assert instance(tenant, run_id).trace_id == CALLER_TRACE
    assert (segments_of(first)[0].attributes or {})["cleat.definition"] == "traced"
    assert (segments_of(first)[0].attributes or {})["cleat.attempt"] == 1
    # One call, one fetch and one child start per run: the replayed ones made no span.
    calls = [
        s
        for s in by_name["cleat.durable_call"]
        if (s.attributes or {})["cleat.operation"] == "charge"
    ]
    assert (
        len(calls) == 2
        and len(by_name["cleat.fetch"]) == 2
        and len(by_name["cleat.child_start"]) == 2
    )
    for span in [
        *by_name["cleat.durable_call"],
        *by_name["cleat.fetch"],
        *by_name["cleat.child_start"],
    ]:
        assert parent_id(span) in segments, span.name
    assert {(s.attributes or {})["cleat.status"] for s in calls} == {"ok"}
    assert {(s.attributes or {})["server.address"] for s in by_name["cleat.fetch"]} == {"127.0.0.1"}
    # Each child's segment is in the trace, under the span of the start that made it.
    for child_start in by_name["cleat.child_start"]:
        kid_run = (child_start.attributes or {})["cleat.child.run_id"]
        assert isinstance(kid_run, str)
        kid_segments = segments_of(kid_run)
        assert kid_segments and {parent_id(s) for s in kid_segments} == {hexid(child_start)}
        assert instance(tenant, kid_run).trace_id == CALLER_TRACE
    # HTTP services and fetch sent the span of their call as traceparent.
    for path, made in (("/charge", calls), ("/page", by_name["cleat.fetch"])):
        sent = recorder.traceparents(path)
        assert sorted(sent) == sorted(f"00-{CALLER_TRACE}-{hexid(s)}-01" for s in made)
    # Tracing changed nothing recorded: the fetch event keeps the workflow's own headers.
    fetches = [e for e in history if isinstance(e, FetchEvent)]
    assert len(fetches) == 1 and fetches[0].headers == ""
    assert api.get(f"/api/v1/workflows/{second}").json()["trace_id"] == CALLER_TRACE
    # The console's run page shows it.
    user = get_user_model().objects.create_superuser("op", "op@example.com", "pw-12345678")
    console = Client()
    console.force_login(user)
    html = console.get(f"/admin/workflows/workflowinstance/{first}/change/").content.decode()
    assert f'<td id="run-trace-id"><code>{CALLER_TRACE}</code></td>' in html


def test_without_a_traceparent_a_traced_run_starts_a_new_trace(
    tenant: Tenant, api: Api, recorder: Recorder, exporter: InMemorySpanExporter
) -> None:
    """No header, or a malformed one (ignored, not a 400): the start span is a root."""
    env = make_env(tenant, recorder)
    try:
        assert api.deploy("kid", kid_wasm()).status_code == 201
        for header in (
            {},
            {"HTTP_TRACEPARENT": "00-not-a-trace-01"},
            {"HTTP_TRACEPARENT": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        ):
            started = api.post("/api/v1/workflows", {"definition": "kid", "input": 1}, **header)
            assert started.status_code == 201, started.content
            trace_id = started.json()["trace_id"]
            assert trace_id and len(trace_id) == 32 and trace_id != CALLER_TRACE
        env.run_until_idle()
    finally:
        env.close()
    starts = [s for s in exporter.get_finished_spans() if s.name == "cleat.start"]
    assert len(starts) == 3 and all(s.parent is None for s in starts)
    assert len({s.context.trace_id for s in starts}) == 3


def test_off_by_default_nothing_is_exported_and_no_trace_is_stored(
    tenant: Tenant, api: Api, recorder: Recorder
) -> None:
    caught = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(caught))
    # A provider that exists but is not configured for cleat receives nothing.
    assert tracing.mode() == "off" and tracing.tracer() is None
    env = make_env(tenant, recorder)
    try:
        assert env.services.tracer is None
        assert api.deploy("traced", parent_wasm(recorder.url)).status_code == 201
        assert api.deploy("kid", kid_wasm()).status_code == 201
        started = api.post(
            "/api/v1/workflows", {"definition": "traced", "input": {}}, HTTP_TRACEPARENT=CALLER
        )
        assert started.status_code == 201 and started.json()["trace_id"] is None
        env.run_until_idle()
        with tenant_context(tenant.id):
            rows = list(WorkflowInstance.objects.values_list("status", "trace_id", "trace_parent"))
    finally:
        env.close()
        provider.shutdown()
    assert len(rows) == 4 and {r[0] for r in rows} == {"done"}
    assert {r[1:] for r in rows} == {(None, None)}
    assert caught.get_finished_spans() == ()
    assert recorder.requests and all("traceparent" not in h for _, h in recorder.requests)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (CALLER, CALLER),
        (CALLER.upper(), None),  # hex digits are lower case
        (f"00-{CALLER_TRACE}-{CALLER_SPAN}-00", f"00-{CALLER_TRACE}-{CALLER_SPAN}-00"),
        ("", None),
        ("garbage", None),
        (f"00-{'0' * 32}-{CALLER_SPAN}-01", None),  # an all-zero trace id
        (f"00-{CALLER_TRACE}-{'0' * 16}-01", None),  # an all-zero span id
        (f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01", None),  # version ff is invalid
        (f"00-{CALLER_TRACE}-{CALLER_SPAN}-01-extra", None),  # version 00 has four fields
    ],
)
def test_traceparent_parsing_follows_w3c(value: str, expected: str | None) -> None:
    assert parse_traceparent(value) == expected


@pytest.fixture
def unconfigured() -> Iterator[None]:
    """The tracing settings read afresh, in the test and after it."""
    tracing.use_provider(None)
    yield
    tracing.use_provider(None)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("zipkin", "CLEAT_TRACING must be one of off, console, otlp, global, not 'zipkin'"),
        ("otlp", "CLEAT_TRACING=otlp needs the package opentelemetry-exporter-otlp-proto-http"),
    ],
)
def test_the_worker_refuses_a_tracing_setting_it_cannot_honour(
    tenant: Tenant,
    settings: Any,
    unconfigured: None,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    message: str,
) -> None:
    """A bad mode, or OTLP without its optional package, stops ``runworker`` and fails
    ``manage.py check`` with the reason, not a traceback."""
    try:
        import opentelemetry.exporter.otlp.proto.http  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.fail(
            "opentelemetry-exporter-otlp-proto-http is installed: this test needs it absent"
        )
    settings.CLEAT_TRACING = mode
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("runworker", "--burst")
    # The system check (web processes, manage.py check) says the same.
    with pytest.raises(SystemCheckError, match=re.escape(message)):
        call_command("check")


def test_console_tracing_prints_the_spans(
    tenant: Tenant, settings: Any, unconfigured: None, capfd: pytest.CaptureFixture[str]
) -> None:
    settings.CLEAT_TRACING = "console"
    with tracing.start_span(CALLER, {"cleat.run_id": "r"}) as span:
        assert span is not None
    tracing.shutdown()
    out = capfd.readouterr().out
    assert '"name": "cleat.start"' in out and f'"trace_id": "0x{CALLER_TRACE}"' in out


def test_the_client_and_an_ambient_span_carry_the_trace(
    tenant: Tenant, recorder: Recorder, exporter: InMemorySpanExporter
) -> None:
    """``client.start(traceparent=...)`` joins that trace; without one, a start made inside
    the application's own span joins the application's trace."""
    from opentelemetry.sdk.trace import TracerProvider as AppProvider

    from workflows import client

    env = make_env(tenant, recorder)
    try:
        env.deploy("kid", kid_wasm())
        explicit = client.start("kid", 1, traceparent=CALLER)
        app_tracer = AppProvider().get_tracer("shop")
        with app_tracer.start_as_current_span("checkout") as app_span:
            ambient = client.start("kid", 2)
        app_trace = f"{app_span.get_span_context().trace_id:032x}"
    finally:
        env.close()
    assert instance(tenant, explicit.id).trace_id == CALLER_TRACE
    assert instance(tenant, ambient.id).trace_id == app_trace != CALLER_TRACE
    parent = instance(tenant, ambient.id).trace_parent
    (start,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "cleat.start" and (s.attributes or {})["cleat.run_id"] == str(ambient.id)
    ]
    assert parent_id(start) == f"{app_span.get_span_context().span_id:016x}"
    assert parent is not None and parent.startswith(f"00-{app_trace}-{hexid(start)}-")


def test_a_batch_of_calls_makes_a_span_per_call_and_sends_each_its_traceparent(
    tenant: Tenant, api: Api, recorder: Recorder, exporter: InMemorySpanExporter
) -> None:
    """``durable_call_many`` (``ctx.gather``): each call is a ``cleat.durable_call`` span
    under the segment, made on its own thread, and the HTTP service gets that span."""
    w = Wat()
    w.run(f"(call $rec (call $durable_call_many {w.input()})) (call $finish)")
    env = make_env(tenant, recorder)
    try:
        assert api.deploy("batch", w.wasm()).status_code == 201
        requests = [{"service": "ledger", "operation": f"op{i}", "request": "{}"} for i in range(3)]
        started = api.post(
            "/api/v1/workflows",
            {"definition": "batch", "input": requests},
            HTTP_TRACEPARENT=CALLER,
        )
        assert started.status_code == 201, started.content
        env.run_until_idle()
    finally:
        env.close()
    spans = exporter.get_finished_spans()
    [segment] = [s for s in spans if s.name == "cleat.segment"]
    calls = sorted(
        (s for s in spans if s.name == "cleat.durable_call"),
        key=lambda s: str(s.attributes.get("cleat.operation")),
    )
    assert [s.attributes["cleat.operation"] for s in calls] == ["op0", "op1", "op2"]
    assert all(parent_id(s) == hexid(segment) for s in calls)
    assert all(s.context.trace_id == int(CALLER_TRACE, 16) for s in calls)
    for i, span in enumerate(calls):
        [sent] = recorder.traceparents(f"/op{i}")
        assert sent == f"00-{CALLER_TRACE}-{hexid(span)}-01"
