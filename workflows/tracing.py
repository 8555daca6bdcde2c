"""Tracing with OpenTelemetry, as the settings ask (``CLEAT_TRACING``):

* ``off`` (the default): no tracer; nothing is exported, no trace context is stored, and
  the engine makes no span objects at all (engine.tracing's design note);
* ``console``: spans printed to standard output (``ConsoleSpanExporter``);
* ``otlp``: spans sent over OTLP/HTTP to ``CLEAT_OTLP_ENDPOINT`` (the optional package
  ``opentelemetry-exporter-otlp-proto-http``, requirements-otlp.txt);
* ``global``: the tracer provider the embedding project set up with
  ``opentelemetry.trace.set_tracer_provider`` (its exporters and sampler).

Where a run starts (:func:`workflows.services.start_workflow`: the API, the client, the
commands, schedules), :func:`start_span` opens a short ``cleat.start`` span, child of the
caller's ``traceparent`` (or of the current span, or a new trace), and the run stores it;
the executor opens each segment's span under it (:func:`segment_span`).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from opentelemetry import trace
from opentelemetry.trace import Span, Tracer

from engine import tracing as spans
from engine.tracing import context_of, parse_traceparent, span_traceparent

MODES = ("off", "console", "otlp", "global")
OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"
OTLP_MODULE = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
TRACER_NAME = "cleat"

_lock = threading.Lock()
_configured = False
_tracer: Tracer | None = None
_provider: Any = None  # the SDK provider made here (flushed and shut down by shutdown())


def mode() -> str:
    value = str(getattr(settings, "CLEAT_TRACING", "off") or "off").strip().lower()
    if value not in MODES:
        raise ImproperlyConfigured(
            f"CLEAT_TRACING must be one of {', '.join(MODES)}, not {value!r}"
        )
    return value


def _otlp_missing() -> str:
    return (
        f"CLEAT_TRACING=otlp needs the package {OTLP_PACKAGE} "
        "(pip install -r requirements-otlp.txt)"
    )


def configuration_fault() -> str | None:
    """What is wrong with the tracing settings (the system check workflows.E003), or None."""
    try:
        chosen = mode()
    except ImproperlyConfigured as exc:
        return str(exc)
    if chosen == "otlp":
        try:
            found = importlib.util.find_spec(OTLP_MODULE)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return _otlp_missing()
    return None


def _build(chosen: str) -> tuple[Tracer | None, Any]:
    if chosen == "off":
        return None, None
    if chosen == "global":
        return trace.get_tracer(TRACER_NAME), None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
        SpanExporter,
    )

    exporter: SpanExporter
    if chosen == "console":
        exporter = ConsoleSpanExporter(out=sys.stdout)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise ImproperlyConfigured(_otlp_missing()) from None
        endpoint = str(getattr(settings, "CLEAT_OTLP_ENDPOINT", "") or "") or None
        exporter = OTLPSpanExporter(endpoint=endpoint)
    service = str(getattr(settings, "CLEAT_TRACING_SERVICE_NAME", "cleat") or "cleat")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    processor = (
        SimpleSpanProcessor(exporter) if chosen == "console" else BatchSpanProcessor(exporter)
    )
    provider.add_span_processor(processor)
    return provider.get_tracer(TRACER_NAME), provider


def tracer() -> Tracer | None:
    """The process's tracer; None with tracing off. Read from the settings once."""
    global _configured, _tracer, _provider
    if _configured:
        return _tracer
    with _lock:
        if not _configured:
            _tracer, _provider = _build(mode())
            _configured = True
    return _tracer


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Trace to ``provider`` from now on (tests: an SDK provider with an in-memory exporter);
    None reads the settings again. The executor's services are rebuilt to take it."""
    global _configured, _tracer, _provider
    with _lock:
        _tracer = provider.get_tracer(TRACER_NAME) if provider is not None else None
        _provider = None
        _configured = provider is not None
    from workflows import executor

    executor.set_services(None)


def shutdown() -> None:
    """Flush and stop the exporter this module made (the worker's exit)."""
    if _provider is not None:
        _provider.shutdown()


@contextmanager
def start_span(incoming: str | None, attributes: Mapping[str, Any]) -> Iterator[Span | None]:
    """Around a run's start: the ``cleat.start`` span (None with tracing off), child of the
    ``incoming`` traceparent when it is valid (a malformed one is ignored), else of the
    current span, else the root of a new trace."""
    found = tracer()
    if found is None:
        yield None
        return
    parent = context_of(parse_traceparent(incoming))
    with found.start_as_current_span(
        spans.START, context=parent, attributes=dict(attributes)
    ) as span:
        yield span


def stored_context(span: Span | None) -> dict[str, str | None]:
    """The run's trace fields for ``span`` (both None when not traced)."""
    traceparent = span_traceparent(span) if span is not None else None
    if traceparent is None:
        return {"trace_id": None, "trace_parent": None}
    return {"trace_id": spans.trace_id_of(traceparent), "trace_parent": traceparent}
