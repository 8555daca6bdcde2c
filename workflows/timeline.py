"""A run's event history drawn as an SVG timeline, server-side (no script, no external asset).

One row per event, in step order; the x axis is the run's virtual time from its start:

* **calls** (service calls, fetches, plugin calls) are bars from the previous event to the
  call's own timestamp: the call happened in that span, so the bar is an upper bound of its
  duration (exact when the run did nothing else in between, as in a fresh segment);
* **sleeps and waits** (timers, retry backoffs, waits for signals, children, promises) are
  bars from when the wait began to when it ended; an unfinished wait of a run still waiting
  is drawn dashed up to now;
* **signals, updates, promises settled, children started, admin actions** are marks;
* anything that failed is red, timeouts and cancellations amber; the run's own end is a
  vertical line (green done, red failed / dead-lettered / terminated).

Every mark links to its row of the raw events table (``#event-<step>``) and carries a
tooltip. The same function draws the page's inline SVG and the downloadable ``.svg``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from html import escape

from engine.events import (
    AdminActionEvent,
    AwaitAllChildrenEvent,
    AwaitAnyChildEvent,
    AwaitChildEvent,
    AwaitPromiseEvent,
    AwaitSignalsEvent,
    CallEvent,
    ChildWorkflowEvent,
    CodecError,
    ContinueAsNewEvent,
    EncodedEvent,
    Event,
    FetchEvent,
    HeartbeatEvent,
    PluginCallEvent,
    PromiseRejectedEvent,
    PromiseResolvedEvent,
    RunDetachedEvent,
    SignalReceivedEvent,
    SignalReplyEvent,
    SignalSentEvent,
    SleepEvent,
    UpdateAppliedEvent,
    decode,
)
from engine.status import AbiStatus
from workflows.redaction import redacted_text

MAX_ROWS = 2000

WIDTH = 980
LABEL_W = 250
RIGHT_PAD = 24
TOP = 46  # legend and axis
BOTTOM = 12

COLOURS = {
    "call": "#2563eb",
    "timer": "#94a3b8",
    "wait": "#8b5cf6",
    "signal": "#0d9488",
    "annotation": "#111827",
    "event": "#64748b",
    "failed": "#dc2626",
    "warn": "#d97706",
    "done": "#15803d",
}
_WARN_STATUSES = {AbiStatus.TIMEOUT, AbiStatus.CANCELLED}
_DESTRUCTIVE_ACTIONS = {"force_fail", "terminate"}


@dataclass(frozen=True)
class Item:
    step: int
    type: str
    label: str
    kind: str  # call, timer, wait, signal, annotation, event
    start_ms: int
    end_ms: int
    outcome: str = "ok"  # ok, failed, warn, open
    detail: str = ""

    @property
    def colour(self) -> str:
        if self.outcome == "failed":
            return COLOURS["failed"]
        if self.outcome == "warn":
            return COLOURS["warn"]
        return COLOURS[self.kind]


@dataclass(frozen=True)
class RunEnd:
    """How the run stands, for the end line or the open wait."""

    status: str
    at_ms: int | None  # completed_at, or None while active
    now_ms: int
    error_code: str = ""
    waiting: str = ""  # what an active run waits on


def _status_outcome(status: int, *, soft_not_found: bool = False) -> str:
    if status == AbiStatus.OK:
        return "ok"
    if status in _WARN_STATUSES or (soft_not_found and status == AbiStatus.NOT_FOUND):
        return "warn"
    return "failed"


def _item(event: Event, previous_ms: int) -> Item:
    """What one event looks like; ``previous_ms`` is the run's virtual time before it."""
    ts = event.ts
    base = {"step": event.step, "type": event.TYPE.value, "end_ms": ts}
    match event:
        case CallEvent():
            outcome = "warn" if event.pending else _status_outcome(event.status)
            detail = event.error or event.response
            label = f"call {event.service}.{event.operation}"
            if event.attempt > 1:
                label += f" (attempt {event.attempt})"
            return Item(
                label=label,
                kind="call",
                start_ms=previous_ms,
                outcome=outcome,
                detail=detail,
                **base,
            )
        case HeartbeatEvent() | PluginCallEvent() | FetchEvent():
            if isinstance(event, HeartbeatEvent):
                label = f"call {event.service}.{event.operation} (heartbeat)"
            elif isinstance(event, PluginCallEvent):
                label = f"plugin {event.plugin}.{event.function}"
            else:
                label = f"fetch {event.method} {event.url}"
            return Item(
                label=label,
                kind="call",
                start_ms=previous_ms,
                outcome=_status_outcome(event.status),
                detail=event.error,
                **base,
            )
        case SleepEvent():
            start = event.wake_at_ms - event.duration_ms if event.wake_at_ms else previous_ms
            what = "retry backoff" if event.reason == "retry" else "sleep"
            return Item(
                label=f"{what} {_span(event.duration_ms)}",
                kind="timer",
                start_ms=min(start, ts),
                outcome=_status_outcome(event.status),
                **base,
            )
        case AwaitSignalsEvent():
            got = f" → {event.name}" if event.status == AbiStatus.OK and event.name else ""
            return Item(
                label=f"await signals {'/'.join(event.names)}{got}",
                kind="wait",
                start_ms=previous_ms,
                outcome=_status_outcome(event.status),
                detail=event.payload,
                **base,
            )
        case AwaitChildEvent():
            return Item(
                label=f"await child {event.run_id[:8]}…",
                kind="wait",
                start_ms=previous_ms,
                outcome=_status_outcome(event.status),
                detail=event.error or event.result,
                **base,
            )
        case AwaitAllChildrenEvent() | AwaitAnyChildEvent():
            which = "all" if isinstance(event, AwaitAllChildrenEvent) else "any"
            return Item(
                label=f"await {which} of {len(event.run_ids)} children",
                kind="wait",
                start_ms=previous_ms,
                outcome=_status_outcome(event.status),
                **base,
            )
        case AwaitPromiseEvent():
            return Item(
                label=f"await promise {event.promise_id[:8]}…",
                kind="wait",
                start_ms=previous_ms,
                outcome=_status_outcome(event.status),
                detail=event.error or event.value,
                **base,
            )
        case SignalReceivedEvent():
            if event.status == AbiStatus.NOT_FOUND:
                return Item(
                    label=f"poll signal {event.name}: none", kind="event", start_ms=ts, **base
                )
            return Item(
                label=f"signal {event.name}",
                kind="signal",
                start_ms=ts,
                detail=event.payload,
                **base,
            )
        case SignalSentEvent():
            return Item(
                label=f"signal {event.name} → {event.target_id[:8]}…",
                kind="signal",
                start_ms=ts,
                outcome=_status_outcome(event.status),
                **base,
            )
        case SignalReplyEvent():
            return Item(
                label="reply to signal",
                kind="signal",
                start_ms=ts,
                outcome=_status_outcome(event.status),
                **base,
            )
        case UpdateAppliedEvent():
            return Item(
                label=f"update {event.name}",
                kind="signal",
                start_ms=ts,
                detail=event.payload,
                **base,
            )
        case PromiseResolvedEvent():
            return Item(
                label=f"promise {event.promise_id[:8]}… resolved",
                kind="signal",
                start_ms=ts,
                **base,
            )
        case PromiseRejectedEvent():
            return Item(
                label=f"promise {event.promise_id[:8]}… rejected",
                kind="signal",
                start_ms=ts,
                outcome="failed",
                detail=event.message,
                **base,
            )
        case ChildWorkflowEvent() | RunDetachedEvent():
            what = "child" if isinstance(event, ChildWorkflowEvent) else "detached run"
            return Item(
                label=f"start {what} {event.name}",
                kind="signal",
                start_ms=ts,
                outcome=_status_outcome(event.status),
                detail=event.error,
                **base,
            )
        case AdminActionEvent():
            outcome = "failed" if event.action in _DESTRUCTIVE_ACTIONS else "ok"
            return Item(
                label=f"admin: {event.action} by {event.operator}",
                kind="annotation",
                start_ms=ts,
                outcome=outcome,
                detail=event.reason,
                **base,
            )
        case ContinueAsNewEvent():
            return Item(
                label="continue as new", kind="annotation", start_ms=ts, detail=event.reason, **base
            )
    return Item(label=event.describe(), kind="event", start_ms=ts, **base)


def build_items(rows: Sequence[EncodedEvent], start_ms: int) -> list[Item]:
    """The timeline items of a stored history (at most ``MAX_ROWS``)."""
    items: list[Item] = []
    vnow = start_ms
    # After an operator's action (a retry, a resume...) the run starts a new segment: what
    # follows began no earlier than the action, so a call made again after a retry is not
    # drawn across the time the run sat dead-lettered or failed.
    resumed_at: int | None = None
    for row in rows[:MAX_ROWS]:
        try:
            event = decode(row)
        except CodecError as exc:
            items.append(Item(row.step, "undecodable", str(exc), "event", row.ts, row.ts, "failed"))
            continue
        since = vnow
        if resumed_at is not None and not isinstance(event, AdminActionEvent):
            since = min(max(vnow, resumed_at), event.ts)
            resumed_at = None
        item = _item(event, since)
        # What the run sent and received is shown the way the API shows it: redacted.
        items.append(
            replace(item, label=redacted_text(item.label), detail=redacted_text(item.detail))
        )
        if isinstance(event, AdminActionEvent):
            resumed_at = max(resumed_at or 0, event.ts)
        if event.ts > vnow and not isinstance(event, AdminActionEvent):
            # Admin actions carry wall time and are not guest steps: they do not move the
            # run's virtual clock (replay steps over them too).
            vnow = event.ts
    return items


def _span(ms: float) -> str:
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:g} s" if ms % 100 == 0 else f"{ms / 1000:.1f} s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _nice_step(span_ms: float, ticks: int = 6) -> float:
    raw = span_ms / ticks
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return float(factor * magnitude)
    return float(10 * magnitude)


def render(rows: Sequence[EncodedEvent], start_ms: int, end: RunEnd, *, title: str = "") -> str:
    """The SVG document (a string) for a run's stored history."""
    items = build_items(rows, start_ms)
    last_vnow = max([start_ms, *(i.end_ms for i in items if i.kind != "annotation")])
    open_wait: Item | None = None
    if end.at_ms is None and end.waiting:
        open_wait = Item(
            step=len(rows),
            type="waiting",
            label=f"waiting: {end.waiting}",
            kind="wait",
            start_ms=last_vnow,
            end_ms=max(end.now_ms, last_vnow),
            outcome="open",
        )
    drawn = [*items, *([open_wait] if open_wait else [])]
    t0 = start_ms
    t1 = max([t0 + 1, *(i.end_ms for i in drawn), *(i.start_ms for i in drawn)])
    if end.at_ms is not None:
        t1 = max(t1, end.at_ms)
    n = max(1, len(drawn))
    row_h = 20.0 if n <= 40 else max(4.0, min(20.0, 900.0 / n))
    height = TOP + n * row_h + BOTTOM + (14 if len(rows) > MAX_ROWS else 0)
    plot_w = WIDTH - LABEL_W - RIGHT_PAD

    def x(ms: float) -> float:
        return LABEL_W + (ms - t0) / (t1 - t0) * plot_w

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="cleat-timeline" role="img" '
        f'width="{WIDTH}" height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}" '
        f'font-family="system-ui, sans-serif" font-size="11" style="max-width:100%;height:auto" '
        f'aria-label="{escape(title or "event timeline")}">',
        f"<title>{escape(title or 'event timeline')}</title>",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    out += _legend()
    # Axis and grid.
    step_ms = _nice_step(t1 - t0)
    tick = 0.0
    while tick <= (t1 - t0) + 1e-9:
        tx = x(t0 + tick)
        out.append(
            f'<line class="tl-grid" x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" '
            f'y2="{height - BOTTOM:.1f}" stroke="#e5e7eb" stroke-width="1"/>'
            f'<text x="{tx:.1f}" y="{TOP - 9}" text-anchor="middle" fill="#475569">'
            f"+{escape(_span(tick))}</text>"
        )
        tick += step_ms
    for index, item in enumerate(drawn):
        out.append(_row(item, index, row_h, x))
    if end.at_ms is not None:
        colour = COLOURS["done"] if end.status == "done" else COLOURS["failed"]
        shown = end.status.replace("_", "-")
        text = shown if not end.error_code else f"{shown}: {end.error_code}"
        ex = x(end.at_ms)
        out.append(
            f'<g class="tl-end tl-end-{escape(end.status)}"><line x1="{ex:.1f}" y1="{TOP - 4}" '
            f'x2="{ex:.1f}" y2="{height - BOTTOM:.1f}" stroke="{colour}" stroke-width="2"/>'
            f'<text x="{min(ex, WIDTH - RIGHT_PAD) - 3:.1f}" y="{TOP - 22}" text-anchor="end" '
            f'fill="{colour}" font-weight="bold">{escape(text)}</text>'
            f"<title>{escape(text)}</title></g>"
        )
    if len(rows) > MAX_ROWS:
        out.append(
            f'<text x="{LABEL_W}" y="{height - 4:.0f}" fill="#b91c1c">the first {MAX_ROWS} of '
            f"{len(rows)} events are drawn; the table below lists them all</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _legend() -> list[str]:
    entries = [
        ("call", "call", "bar"),
        ("sleep", "timer", "bar"),
        ("wait", "wait", "bar"),
        ("signal / update", "signal", "mark"),
        ("admin action", "annotation", "triangle"),
        ("failed", "failed", "bar"),
        ("timeout / cancelled", "warn", "bar"),
    ]
    out = ['<g class="tl-legend">']
    lx = 8.0
    for label, key, shape in entries:
        colour = COLOURS[key]
        if shape == "bar":
            out.append(f'<rect x="{lx}" y="6" width="14" height="8" rx="2" fill="{colour}"/>')
        elif shape == "mark":
            out.append(_diamond(lx + 7, 10, 5, colour))
        else:
            out.append(_triangle(lx + 7, 10, 5, colour))
        out.append(f'<text x="{lx + 18}" y="14" fill="#334155">{escape(label)}</text>')
        lx += 26 + 6.2 * len(label)
    out.append("</g>")
    return out


def _diamond(cx: float, cy: float, r: float, colour: str) -> str:
    return (
        f'<path d="M{cx:.1f} {cy - r:.1f} L{cx + r:.1f} {cy:.1f} L{cx:.1f} {cy + r:.1f} '
        f'L{cx - r:.1f} {cy:.1f} Z" fill="{colour}"/>'
    )


def _triangle(cx: float, cy: float, r: float, colour: str) -> str:
    return (
        f'<path d="M{cx:.1f} {cy - r:.1f} L{cx + r:.1f} {cy + r:.1f} L{cx - r:.1f} '
        f'{cy + r:.1f} Z" fill="{colour}"/>'
    )


def _row(item: Item, index: int, row_h: float, scale: Callable[[float], float]) -> str:
    y = TOP + index * row_h
    mid = y + row_h / 2
    bar_h = max(2.0, row_h * 0.6)
    colour = item.colour
    duration = item.end_ms - item.start_ms
    tip = f"#{item.step} {item.label}"
    if item.kind in ("call", "timer", "wait"):
        tip += f" — {_span(duration)}" + (" (at most)" if item.kind == "call" else "")
    if item.outcome in ("failed", "warn"):
        tip += f" [{item.outcome}]"
    if item.detail:
        tip += f"\n{item.detail[:300]}"
    parts = [
        f'<g class="tl-item tl-{item.kind} tl-{item.outcome}" data-step="{item.step}" '
        f'data-type="{escape(item.type)}"><title>{escape(tip)}</title>'
    ]
    if index % 2 == 0:
        parts.append(
            f'<rect x="0" y="{y:.1f}" width="{WIDTH}" height="{row_h:.1f}" fill="#f8fafc"/>'
        )
    if row_h >= 11:
        label = item.label if len(item.label) <= 38 else item.label[:37] + "…"
        parts.append(
            f'<text x="6" y="{mid + 4:.1f}" fill="#1f2937">'
            f'<tspan fill="#94a3b8">#{item.step}</tspan> {escape(label)}</text>'
        )
    x0 = scale(item.start_ms)
    x1 = scale(item.end_ms)
    if item.kind in ("call", "timer", "wait"):
        width = max(3.0, x1 - x0)
        dash = (
            ' stroke-dasharray="4 3" fill-opacity="0.25" stroke="#8b5cf6"'
            if (item.outcome == "open")
            else ""
        )
        fill = COLOURS["wait"] if item.outcome == "open" else colour
        opacity = "" if item.kind == "call" or dash else ' fill-opacity="0.75"'
        parts.append(
            f'<rect x="{x0:.1f}" y="{mid - bar_h / 2:.1f}" width="{width:.1f}" '
            f'height="{bar_h:.1f}" rx="2" fill="{fill}"{opacity}{dash}/>'
        )
        if item.kind == "wait" and item.outcome == "ok" and item.type == "await_signals":
            parts.append(_diamond(x1, mid, min(6.0, row_h / 2.5), COLOURS["signal"]))
    elif item.kind == "signal":
        parts.append(_diamond(x1, mid, min(6.0, row_h / 2.5), colour))
    elif item.kind == "annotation":
        parts.append(_triangle(x1, mid, min(6.0, row_h / 2.5), colour))
    else:
        parts.append(
            f'<circle cx="{x1:.1f}" cy="{mid:.1f}" r="{min(3.5, row_h / 3):.1f}" fill="{colour}"/>'
        )
    parts.append("</g>")
    return f'<a href="#event-{item.step}">{"".join(parts)}</a>'
