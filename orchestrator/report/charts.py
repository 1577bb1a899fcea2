"""Inline SVG for the report: the task timeline and line charts.

Hand-drawn SVG keeps the report one self-contained file: no charting script,
no font, nothing fetched when it opens. Numbers are rounded so the same data
always gives the same bytes.
"""

from __future__ import annotations

from html import escape
from typing import Any

PALETTE = ("#2563eb", "#16a34a", "#dc2626", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d")
# an unusable result is what its strategy failed on: the colour of a failure
OUTCOME_COLOURS = {
    "completed": "#16a34a",
    "failed": "#dc2626",
    "unusable": "#dc2626",
    "interrupted": "#f59e0b",
    "running": "#94a3b8",
}


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    while mag > raw and mag > 1e-9:
        mag /= 10
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = (lo // step) * step
    out, v = [], first
    while v <= hi + 1e-9:
        if v >= lo - 1e-9:
            out.append(round(v, 10))
        v += step
    return out


def _fmt_tick(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


# Series that share values must stay apart: each gets its own dash pattern and
# marker shape, and series that would be drawn over one another are shifted a
# few pixels each (the tooltips keep the exact values).
DASHES = ("", "6 3", "2 3", "8 3 2 3", "12 4", "4 2 1 2")
SHAPES = ("circle", "square", "triangle", "diamond", "down", "cross")
OVERLAP_SHIFT_PX = 4.0


def _offsets(series: list[Any]) -> list[float]:
    """A vertical pixel shift per series: 0 unless some point is shared with another series."""
    seen: dict[tuple[float, float], int] = {}
    for s in series:
        for p in set(map(tuple, s.points)):
            seen[p] = seen.get(p, 0) + 1
    sharing = [i for i, s in enumerate(series) if any(seen[tuple(p)] > 1 for p in s.points)]
    out = [0.0] * len(series)
    mid = (len(sharing) - 1) / 2
    for rank, i in enumerate(sharing):
        out[i] = (rank - mid) * OVERLAP_SHIFT_PX
    return out


def _marker(i: int, x: float, y: float, colour: str, tip: str) -> str:
    shape, r = SHAPES[i % len(SHAPES)], 3.5
    title = f"<title>{escape(tip)}</title>"
    if shape == "circle":
        return f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{r}" fill="{colour}">{title}</circle>'
    if shape == "square":
        return f'<rect x="{_n(x - r)}" y="{_n(y - r)}" width="{r * 2}" height="{r * 2}" fill="{colour}">{title}</rect>'
    if shape == "cross":
        d = f"M{_n(x - r)},{_n(y - r)}L{_n(x + r)},{_n(y + r)}M{_n(x - r)},{_n(y + r)}L{_n(x + r)},{_n(y - r)}"
        return f'<path d="{d}" stroke="{colour}" stroke-width="2" fill="none">{title}</path>'
    corners = {
        "triangle": [(0, -r - 1), (r + 0.5, r), (-r - 0.5, r)],
        "down": [(0, r + 1), (r + 0.5, -r), (-r - 0.5, -r)],
        "diamond": [(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)],
    }[shape]
    pts = " ".join(f"{_n(x + dx)},{_n(y + dy)}" for dx, dy in corners)
    return f'<polygon points="{pts}" fill="{colour}">{title}</polygon>'


def timeline_svg(tasks: list[dict[str, Any]], span_s: float, *, width: int = 960) -> str:
    """A Gantt chart: one row per task, one bar per attempt, coloured by how it ended."""
    label_w, row_h, top = 260, 16, 24
    plot_w = width - label_w - 20
    height = top + row_h * max(len(tasks), 1) + 10
    span = max(span_s, 0.001)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="task timeline">'
    ]
    for tick in _ticks(0, span):
        x = label_w + plot_w * tick / span
        out.append(
            f'<line x1="{_n(x)}" y1="{top - 4}" x2="{_n(x)}" y2="{height - 6}" class="grid"/>'
            f'<text x="{_n(x)}" y="{top - 8}" class="tick" text-anchor="middle">{_fmt_tick(tick)}s</text>'
        )
    for i, t in enumerate(tasks):
        y = top + i * row_h
        out.append(
            f'<text x="{label_w - 6}" y="{y + 11}" class="label" text-anchor="end">'
            f"{escape(t['short_key'][-40:])}</text>"
        )
        for a in t["spans"]:
            end = span if a["end"] is None else a["end"]
            x0 = label_w + plot_w * a["start"] / span
            w = max(plot_w * (end - a["start"]) / span, 2.0)
            colour = OUTCOME_COLOURS.get(a["outcome"], "#64748b")
            tip = f"{t['short_key']}: {a['outcome']}, {_n(a['start'])}s to {_n(end)}s"
            out.append(
                f'<rect x="{_n(x0)}" y="{y + 2}" width="{_n(w)}" height="{row_h - 5}" rx="2" '
                f'fill="{colour}"><title>{escape(tip)}</title></rect>'
            )
    out.append("</svg>")
    return "".join(out)


def _axis_labels(x_label: str, y_label: str, *, x_mid: float, y_mid: float, height: int) -> list[str]:
    out = []
    if x_label:
        out.append(
            f'<text x="{x_mid}" y="{height - 8}" class="axis-label" text-anchor="middle">{escape(x_label)}</text>'
        )
    if y_label:
        out.append(
            f'<text x="14" y="{y_mid}" class="axis-label" text-anchor="middle" '
            f'transform="rotate(-90 14 {_n(y_mid)})">{escape(y_label)}</text>'
        )
    return out


def line_chart_svg(
    series: list[Any],
    *,
    x_label: str = "",
    y_label: str = "",
    x_integer: bool = False,
    width: int = 640,
    height: int = 280,
) -> str:
    """Lines with markers over a shared x axis, a legend under the plot."""
    pts = [(x, y) for s in series for (x, y) in s.points]
    left, right, top, bottom = 64, 16, 16, 44
    legend_h = 18 * ((len(series) + 2) // 3)
    total_h = height + legend_h
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{total_h}" '
        f'viewBox="0 0 {width} {total_h}" role="img" aria-label="{escape(y_label or "chart")}">'
    ]
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="tick">no data</text></svg>')
        return "".join(out)
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + pw * (x - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return top + ph * (1 - (y - y0) / (y1 - y0))

    for t in _ticks(y0, y1):
        out.append(
            f'<line x1="{left}" y1="{_n(sy(t))}" x2="{width - right}" y2="{_n(sy(t))}" class="grid"/>'
            f'<text x="{left - 6}" y="{_n(sy(t) + 4)}" class="tick" text-anchor="end">{_fmt_tick(t)}</text>'
        )
    xticks = [float(v) for v in range(int(x0), int(x1) + 1)] if x_integer and x1 - x0 <= 30 else _ticks(x0, x1)
    for t in xticks:
        out.append(f'<text x="{_n(sx(t))}" y="{top + ph + 16}" class="tick" text-anchor="middle">{_fmt_tick(t)}</text>')
    out.append(
        f'<line x1="{left}" y1="{top + ph}" x2="{width - right}" y2="{top + ph}" class="axis"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" class="axis"/>'
    )
    out += _axis_labels(x_label, y_label, x_mid=left + pw / 2, y_mid=top + ph / 2, height=height)
    offsets = _offsets(series)
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        dash = DASHES[i % len(DASHES)]
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        dy = offsets[i]
        out.append(f'<g class="series" data-series="{escape(s.name)}">')
        path = " ".join(f"{'M' if j == 0 else 'L'}{_n(sx(x))},{_n(sy(y) + dy)}" for j, (x, y) in enumerate(s.points))
        if len(s.points) > 1 and getattr(s, "line", True):
            out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="2"{dashed}/>')
        for x, y in s.points:
            out.append(_marker(i, sx(x), sy(y) + dy, colour, f"{s.name}: {_fmt_tick(x)}, {_fmt_tick(y)}"))
        lx, ly = left + (i % 3) * (pw / 3), height + 4 + 18 * (i // 3)
        out.append(
            f'<line x1="{_n(lx)}" y1="{_n(ly + 5)}" x2="{_n(lx + 22)}" y2="{_n(ly + 5)}" stroke="{colour}" '
            f'stroke-width="2"{dashed}/>{_marker(i, lx + 11, ly + 5, colour, s.name)}'
            f'<text x="{_n(lx + 28)}" y="{_n(ly + 9)}" class="tick">{escape(s.name[:40])}</text>'
        )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
