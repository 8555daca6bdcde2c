"""Tracing: the spans a run makes and the W3C ``traceparent`` that carries its trace.

Design note
-----------
The engine depends on ``opentelemetry-api`` only (the package OpenTelemetry meant for
instrumented libraries: interfaces and a no-op default, no exporter). Which SDK, exporter and
sampler are used is the deployment's choice, made in ``workflows.tracing`` from settings; the
engine receives a ``Tracer`` in :class:`engine.services.Services` (``tracer``), or ``None``.

Tracing off means ``Services.tracer is None``: every site tests that one attribute and makes
no span, no context and no attribute dictionary (not even OpenTelemetry's non-recording
spans). Two alternatives were dropped: a tracer hook protocol of the engine's own (it would
re-declare what the OpenTelemetry API already is, and an embedding project that set up
OpenTelemetry could not hand its tracer over), and always calling the API's no-op tracer
(it allocates a span object per call).

A run's trace lives on the run as a ``traceparent`` string (the span context its segments
are children of), so a segment executed later by any worker continues it. The segment span
(``cleat.segment``) is opened around the segment by the executor, with the stored context as
its parent, and made current; the spans the session opens inside it (``cleat.durable_call``,
``cleat.fetch``, ``cleat.child_start``) are its children through OpenTelemetry's context,
and HTTP services and ``fetch`` send the current span as ``traceparent``.

Replay: a call answered from the history makes no span (nothing happened; the segment span
counts them in ``cleat.replayed_steps``). Tracing never changes what is recorded: the
``traceparent`` header is added at the I/O boundary, after the event's request was fixed,
and child runs receive their context through the start mutation, not through an event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from engine.status import AbiStatus


class _Answer(Protocol):
    """What an I/O call answers (``engine.services.CallResult``: not imported, it imports
    this module)."""

    @property
    def status(self) -> int: ...


A = TypeVar("A", bound=_Answer)
SEGMENT = "cleat.segment"
DURABLE_CALL = "cleat.durable_call"
FETCH = "cleat.fetch"
CHILD_START = "cleat.child_start"
START = "cleat.start"

TRACEPARENT = "traceparent"

_propagator = TraceContextTextMapPropagator()

__all__ = [
    "CHILD_START",
    "DURABLE_CALL",
    "FETCH",
    "SEGMENT",
    "START",
    "TRACEPARENT",
    "context_of",
    "current_traceparent",
    "parse_traceparent",
    "segment_span",
    "span_traceparent",
    "status_label",
    "trace_id_of",
    "traced_call",
]


def parse_traceparent(value: str | None) -> str | None:
    """``value`` when it is a valid W3C ``traceparent`` (version 00's form), else None
    (a malformed one is ignored, as the W3C recommendation asks, never an error)."""
    if not value or not isinstance(value, str) or len(value) > 512:
        return None
    ctx = _propagator.extract({TRACEPARENT: value.strip()})
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid:
        return None
    return _format(span_context)


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digits of a valid ``traceparent``'s trace id."""
    return traceparent.split("-")[1]


def _format(span_context: trace.SpanContext) -> str:
    return (
        f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
        f"{int(span_context.trace_flags):02x}"
    )


def span_traceparent(span: trace.Span) -> str | None:
    """The ``traceparent`` naming ``span`` as the parent (None for an invalid span)."""
    span_context = span.get_span_context()
    return _format(span_context) if span_context.is_valid else None


def current_traceparent() -> str | None:
    """The current span as a ``traceparent`` header value; None when there is none (tracing
    off, or outside every span): a context-variable read, no allocation."""
    return span_traceparent(trace.get_current_span())


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """The OpenTelemetry context whose remote parent is ``traceparent`` (None: a new trace)."""
    if not traceparent:
        return None
    ctx = _propagator.extract({TRACEPARENT: traceparent})
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def status_label(status: int) -> str:
    try:
        return AbiStatus(status).name.lower()
    except ValueError:
        return str(status)


def call_attributes(name: str, a: str, b: str) -> dict[str, Any]:
    """The attributes of an I/O span: (service, operation) for a call, (method, url) for a
    fetch (the URL's host only: a path or query may carry secrets)."""
    if name == FETCH:
        return {
            "http.request.method": (a or "GET").upper(),
            "server.address": urlsplit(b).hostname or "",
        }
    return {"cleat.service": a, "cleat.operation": b}


def traced_call(
    tracer: trace.Tracer, name: str, a: str, b: str, step: int, call: Callable[[], A]
) -> A:
    """Run ``call`` in a current span ``name``; its status becomes ``cleat.status``."""
    attributes = call_attributes(name, a, b)
    attributes["cleat.step"] = step
    with tracer.start_as_current_span(name, attributes=attributes) as span:
        result = call()
        label = status_label(result.status)
        span.set_attribute("cleat.status", label)
        if result.status != AbiStatus.OK:
            span.set_status(trace.Status(trace.StatusCode.ERROR, label))
        return result


@contextmanager
def segment_span(
    tracer: trace.Tracer, traceparent: str | None, attributes: Mapping[str, Any]
) -> Iterator[trace.Span]:
    """The current ``cleat.segment`` span, child of the run's stored ``traceparent``."""
    with tracer.start_as_current_span(
        SEGMENT,
        context=context_of(traceparent),
        kind=trace.SpanKind.INTERNAL,
        attributes=dict(attributes),
    ) as span:
        yield span
