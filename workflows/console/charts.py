"""Small server-rendered SVG charts for the dashboard: no script, no external asset.

Each function returns an ``<svg>`` string with a ``<title>``, one ``class="chart ..."``
and one element per datum carrying its value as a tooltip, so the page reads without
hovering and tests can count what was drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from html import escape

from django.utils import timezone

FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    colour: str
    text: str = ""  # shown next to the bar; the value when empty
    href: str = ""


def _open(kind: str, width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-{kind}" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" {FONT} '
        'style="max-width:100%;height:auto" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="8" y="16" font-size="13" font-weight="bold" fill="#111827">'
        f"{escape(title)}</text>",
    ]


def bar_chart(title: str, bars: Sequence[Bar], *, width: int = 460, empty: str = "") -> str:
    """Horizontal bars, one per label; with no bars, the ``empty`` text in their place (a
    blank panel reads as broken)."""
    row = 22
    label_w = 130
    height = 30 + row * max(1, len(bars)) + 8
    top = max([b.value for b in bars] or [0]) or 1
    plot = width - label_w - 150  # room for the value text after the longest bar
    out = _open("bars", width, height, title)
    if not bars and empty:
        out.append(
            f'<text class="chart-empty" x="{width / 2:.0f}" y="{28 + 14}" text-anchor="middle" '
            f'fill="#6b7280">{escape(empty)}</text>'
        )
    for i, bar in enumerate(bars):
        y = 28 + i * row
        w = 0 if bar.value <= 0 else max(2.0, bar.value / top * plot)
        text = bar.text or f"{bar.value:g}"
        item = (
            f'<g class="chart-bar" data-label="{escape(bar.label)}" data-value="{bar.value:g}">'
            f"<title>{escape(bar.label)}: {escape(text)}</title>"
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" fill="#374151">'
            f"{escape(bar.label)}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row - 8}" rx="2" '
            f'fill="{bar.colour}"/>'
            f'<text x="{label_w + w + 5:.1f}" y="{y + 14}" fill="#111827">{escape(text)}</text>'
            "</g>"
        )
        out.append(f'<a href="{escape(bar.href)}">{item}</a>' if bar.href else item)
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[int]
    colour: str


def per_minute_chart(
    title: str, minutes: Sequence[datetime], series: Sequence[Series], *, width: int = 940
) -> str:
    """Grouped columns per minute (one colour per series), with a legend and a time axis."""
    height = 200
    left, right, top, bottom = 40, 12, 40, 26
    plot_w = width - left - right
    plot_h = height - top - bottom
    count = max(1, len(minutes))
    peak = max([1, *(v for s in series for v in s.values)])
    out = _open("per-minute", width, height, title)
    lx = width - right - 10
    for s in reversed(series):  # legend, right-aligned
        total = sum(s.values)
        label = f"{s.name} ({total})"
        lx -= 24 + 6.3 * len(label)
        out.append(
            f'<rect x="{lx:.0f}" y="8" width="12" height="10" rx="2" fill="{s.colour}"/>'
            f'<text x="{lx + 16:.0f}" y="17" fill="#374151">{escape(label)}</text>'
        )
    for fraction in (0.0, 0.5, 1.0):  # y grid
        gy = top + plot_h * (1 - fraction)
        value = peak * fraction
        out.append(
            f'<line x1="{left}" y1="{gy:.1f}" x2="{width - right}" y2="{gy:.1f}" '
            f'stroke="#e5e7eb"/><text x="{left - 4}" y="{gy + 4:.1f}" text-anchor="end" '
            f'fill="#6b7280">{value:.0f}</text>'
        )
    slot = plot_w / count
    col_w = max(1.0, (slot - 1) / max(1, len(series)))
    for i, minute in enumerate(minutes):
        x0 = left + i * slot
        clock = timezone.localtime(minute).strftime("%H:%M")
        for j, s in enumerate(series):
            value = s.values[i] if i < len(s.values) else 0
            if value <= 0:
                continue
            h = value / peak * plot_h
            out.append(
                f'<rect class="chart-column" data-series="{escape(s.name)}" '
                f'data-value="{value}" x="{x0 + j * col_w:.1f}" y="{top + plot_h - h:.1f}" '
                f'width="{col_w:.1f}" height="{h:.1f}" fill="{s.colour}">'
                f"<title>{clock} {escape(s.name)}: {value}</title></rect>"
            )
        if i % 10 == 0 or i == count - 1:
            anchor = "end" if i == count - 1 else "middle"
            out.append(
                f'<text x="{x0 + slot / 2:.1f}" y="{height - 8}" text-anchor="{anchor}" '
                f'fill="#6b7280">{clock}</text>'
            )
    out.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" '
        'stroke="#9ca3af"/></svg>'
    )
    return "".join(out)


@dataclass(frozen=True)
class Segment:
    name: str
    value: int
    colour: str


def stacked_bars(
    title: str,
    rows: Sequence[tuple[str, Sequence[Segment], str]],
    *,
    width: int = 940,
) -> str:
    """One horizontal bar per row (label, segments, link), split by segment; a legend of the
    segment names that occur."""
    row_h = 24
    label_w = 180
    height = 44 + row_h * max(1, len(rows)) + 6
    plot = width - label_w - 70
    peak = max([1, *(sum(s.value for s in segs) for _, segs, _ in rows)])
    out = _open("stacked", width, height, title)
    seen: dict[str, str] = {}
    for _, segs, _ in rows:
        for s in segs:
            if s.value:
                seen.setdefault(s.name, s.colour)
    lx = 8.0
    for name, colour in seen.items():
        out.append(
            f'<rect x="{lx:.0f}" y="24" width="12" height="10" rx="2" fill="{colour}"/>'
            f'<text x="{lx + 16:.0f}" y="33" fill="#374151">{escape(name)}</text>'
        )
        lx += 26 + 6.3 * len(name)
    for i, (label, segs, href) in enumerate(rows):
        y = 42 + i * row_h
        total = sum(s.value for s in segs)
        shown = label if len(label) <= 26 else label[:25] + "…"
        parts = [
            f'<g class="chart-stack" data-label="{escape(label)}" data-value="{total}">'
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" fill="#374151">'
            f"{escape(shown)}</text>"
        ]
        x = float(label_w)
        for s in segs:
            if s.value <= 0:
                continue
            w = max(2.0, s.value / peak * plot)
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
                f'fill="{s.colour}"><title>{escape(label)} {escape(s.name)}: {s.value}'
                "</title></rect>"
            )
            x += w
        parts.append(f'<text x="{x + 5:.1f}" y="{y + 15}" fill="#111827">{total}</text></g>')
        group = "".join(parts)
        out.append(f'<a href="{escape(href)}">{group}</a>' if href else group)
    out.append("</svg>")
    return "".join(out)
