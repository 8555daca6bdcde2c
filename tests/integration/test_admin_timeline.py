"""The console's drawing and wording, without a database: the SVG timeline of a history,
the dashboard charts, and the short texts for waits and ages."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from engine.events import (
    AdminActionEvent,
    AwaitSignalsEvent,
    CallEvent,
    EncodedEvent,
    SignalReceivedEvent,
    SleepEvent,
    encode,
)
from engine.status import AbiStatus
from workflows import timeline
from workflows.console import charts
from workflows.console.display import STATUS_COLOURS, age_text, wait_text

START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def history() -> list[EncodedEvent]:
    return [
        encode(CallEvent(step=0, ts=START + 40, service="pay", operation="charge", request="{}")),
        encode(
            CallEvent(
                step=1,
                ts=START + 90,
                service="pay",
                operation="refund",
                request="{}",
                status=AbiStatus.ERROR,
                error="<script>alert(1)</script>",
            )
        ),
        encode(SleepEvent(step=2, ts=START + 2090, duration_ms=2000, wake_at_ms=START + 2090)),
        encode(
            AwaitSignalsEvent(step=3, ts=START + 5000, names=("approve", "reject"), name="approve")
        ),
        encode(
            AwaitSignalsEvent(
                step=4, ts=START + 8000, names=("again",), timeout_ms=3000, status=AbiStatus.TIMEOUT
            )
        ),
        encode(SignalReceivedEvent(step=5, ts=START + 8000, name="note", payload="1")),
        encode(AdminActionEvent(step=6, ts=START + 60_000, action="force_fail", operator="op")),
    ]


def items_by_step(svg: str) -> dict[int, str]:
    return {
        int(m.group(2)): m.group(1)
        for m in re.finditer(r'<g class="tl-item ([^"]+)" data-step="(\d+)"', svg)
    }


def test_timeline_draws_each_kind_of_event() -> None:
    end = timeline.RunEnd("failed", START + 60_000, START + 61_000, error_code="permanent")
    svg = timeline.render(history(), START, end, title="run <x>")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    kinds = items_by_step(svg)
    assert kinds == {
        0: "tl-call tl-ok",
        1: "tl-call tl-failed",
        2: "tl-timer tl-ok",
        3: "tl-wait tl-ok",
        4: "tl-wait tl-warn",
        5: "tl-signal tl-ok",
        6: "tl-annotation tl-failed",
    }
    assert "tl-end-failed" in svg and "failed: permanent" in svg
    assert "<script>" not in svg and "&lt;script&gt;" in svg  # payloads are escaped
    assert "run &lt;x&gt;" in svg
    for step in range(7):
        assert f'href="#event-{step}"' in svg
    assert timeline.COLOURS["failed"] in svg


def test_timeline_bars_follow_virtual_time() -> None:
    items = timeline.build_items(history(), START)
    call, _, sleep, wait, *_ = items
    assert (call.start_ms, call.end_ms) == (START, START + 40)
    assert (sleep.start_ms, sleep.end_ms) == (START + 90, START + 2090)
    assert (wait.start_ms, wait.end_ms) == (START + 2090, START + 5000)
    # An admin action carries wall time; it does not move the run's virtual clock.
    later = [*history(), encode(SignalReceivedEvent(step=7, ts=START + 8001, name="x"))]
    assert timeline.build_items(later, START)[7].start_ms == START + 8001


def test_a_waiting_run_shows_its_open_wait_and_bad_rows_show_up() -> None:
    rows = [*history()[:3], EncodedEvent(3, 999, START + 3000, "{}", "")]
    end = timeline.RunEnd("ready", None, START + 10_000, waiting="signals paid")
    svg = timeline.render(rows, START, end)
    kinds = items_by_step(svg)
    assert kinds[3] == "tl-event tl-failed"  # undecodable type code
    assert kinds[4] == "tl-wait tl-open" and "waiting: signals paid" in svg
    assert "tl-end" not in svg


def test_a_long_history_is_bounded() -> None:
    rows = [
        encode(CallEvent(step=i, ts=START + i, service="s", operation="o", request=str(i)))
        for i in range(timeline.MAX_ROWS + 5)
    ]
    svg = timeline.render(rows, START, timeline.RunEnd("done", START + 9000, START + 9000))
    assert len(items_by_step(svg)) == timeline.MAX_ROWS
    assert f"the first {timeline.MAX_ROWS} of {timeline.MAX_ROWS + 5} events" in svg


def test_charts_draw_one_element_per_datum_and_escape_labels() -> None:
    bars = charts.bar_chart(
        "t", [charts.Bar("a<b", 3, "#000"), charts.Bar("zero", 0, "#111", href="/x?y=1&z=2")]
    )
    assert bars.count('class="chart-bar"') == 2 and "a&lt;b" in bars
    assert 'href="/x?y=1&amp;z=2"' in bars
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    minutes = [now - timedelta(minutes=i) for i in range(59, -1, -1)]
    series = [charts.Series("started", [1] * 60, "#00f"), charts.Series("done", [0] * 60, "#0f0")]
    per_minute = charts.per_minute_chart("p", minutes, series)
    assert per_minute.count('class="chart-column"') == 60  # zero columns are not drawn
    stacked = charts.stacked_bars(
        "s", [("wf", [charts.Segment("done", 2, "#0f0"), charts.Segment("failed", 1, "#f00")], "")]
    )
    assert 'data-value="3"' in stacked and stacked.count("<rect x=") == 2 + 2  # legend + bars


def test_wait_texts() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    at = int(datetime(2026, 1, 1, 14, 5, tzinfo=UTC).timestamp() * 1000)
    assert wait_text({"kind": "timer", "wake_at_ms": at}, now) == "timer until 14:05"
    assert wait_text({"kind": "signals", "signals": ["approve", "reject"]}, now) == (
        "signals approve/reject"
    )
    assert wait_text({"kind": "child", "run_ids": ["3f2a9c00-0000"]}, now) == "child 3f2a…"
    assert wait_text({"kind": "retry", "description": "retry 2 of 3 after error"}, now) == (
        "retry 2 of 3 after error"
    )
    assert wait_text(None, now) == ""
    assert age_text(now - timedelta(seconds=42), now) == "42 s"
    assert age_text(now - timedelta(minutes=5), now) == "5 min"


def test_status_colours_in_the_stylesheet_match_the_charts() -> None:
    css = (Path(__file__).resolve().parents[2] / "templates/admin/base_site.html").read_text()
    for status, colour in STATUS_COLOURS.items():
        assert f".cleat-status-{status} {{ background: {colour}; }}" in css
