"""Server-side SVG charts for the operations page (no chart library, no script)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from markupsafe import Markup

WIDTH, HEIGHT, PAD = 600, 160, 28
#: Series colours of a chart broken down by queue or kind (classes ``g0`` … in app.css).
GROUP_COLOURS = 8


def bar_chart(
    title: str, labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]], *, unit: str = ""
) -> Markup:
    """Stacked bars: *series* is ``(name, css_class, values)``; one bar per label."""
    n = max(1, len(labels))
    totals = [sum(s[2][i] for s in series) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    bar_w = (WIDTH - 2 * PAD) / n
    parts = [_frame(title, top, unit)]
    for i in range(len(labels)):
        y = HEIGHT - PAD
        for name, css, values in series:
            h = (HEIGHT - 2 * PAD) * values[i] / top
            if h > 0:
                y -= h
                parts.append(
                    f'<rect class="{css}" x="{PAD + i * bar_w + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                    f'height="{h:.1f}"><title>{escape(labels[i])} {escape(name)}: {values[i]:g}</title></rect>'
                )
    parts.append(_x_labels(labels))
    parts.append(_legend([(name, css) for name, css, _ in series]))
    return _svg(title, parts)


def line_chart(
    title: str, labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float | None]]], *, unit: str = ""
) -> Markup:
    """Lines with gaps where a value is ``None``."""
    n = max(1, len(labels))
    top = max((v for _, _, vs in series for v in vs if v is not None), default=0) or 1
    step = (WIDTH - 2 * PAD) / max(1, n - 1)
    parts = [_frame(title, top, unit)]
    for name, css, values in series:
        points = [
            f"{PAD + i * step:.1f},{HEIGHT - PAD - (HEIGHT - 2 * PAD) * v / top:.1f}"
            for i, v in enumerate(values)
            if v is not None
        ]
        shown = [(labels[i], v) for i, v in enumerate(values) if v is not None]
        for point, (label, value) in zip(points, shown, strict=True):  # a single point would be an invisible line
            x, y = point.split(",")
            parts.append(
                f'<circle class="{css}" cx="{x}" cy="{y}" r="2.5">'
                f"<title>{escape(label)} {escape(name)}: {value:g}{escape(unit)}</title></circle>"
            )
        if len(points) > 1:
            parts.append(
                f'<polyline class="{css}" fill="none" points="{" ".join(points)}">'
                f"<title>{escape(name)}</title></polyline>"
            )
    parts.append(_x_labels(labels))
    parts.append(_legend([(name, css) for name, css, _ in series]))
    return _svg(title, parts)


def _frame(title: str, top: float, unit: str) -> str:
    return (
        f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}"/>'
        f'<text class="tick" x="2" y="{PAD}">{top:.3g}{escape(unit)}</text>'
        f'<text class="tick" x="2" y="{HEIGHT - PAD}">0</text>'
    )


def _x_labels(labels: Sequence[str]) -> str:
    if not labels:
        return f'<text class="tick" x="{WIDTH / 2 - 40}" y="{HEIGHT / 2}">no data yet</text>'
    return (
        f'<text class="tick" x="{PAD}" y="{HEIGHT - 8}">{escape(labels[0])}</text>'
        f'<text class="tick" text-anchor="end" x="{WIDTH - PAD}" y="{HEIGHT - 8}">{escape(labels[-1])}</text>'
    )


#: Width of a legend character at the ticks' 11 px, generously (the legend must not run off the chart).
LEGEND_CHAR_W = 6.5


def _legend(items: Sequence[tuple[str, str]]) -> str:
    """The series' names above the chart, in two rows at most (a queue or kind breakdown has many)."""
    out, x, row = [], float(PAD), 0
    for i, (name, css) in enumerate(items):
        width = 14 + LEGEND_CHAR_W * len(name) + 12
        if x + width > WIDTH - PAD and x > PAD:
            row, x = row + 1, float(PAD)
        if row == 2:
            out.append(f'<text class="tick" x="{WIDTH - PAD}" y="25" text-anchor="end">+{len(items) - i} more</text>')
            break
        y = 4 + 12 * row
        out.append(
            f'<rect class="{css}" x="{x:.0f}" y="{y}" width="9" height="9"/>'
            f'<text class="tick" x="{x + 13:.0f}" y="{y + 9}">{escape(name)}</text>'
        )
        x += width
    return "".join(out)


class Chart(Markup):
    """SVG markup that also carries its title (for the figure caption)."""

    title: str = ""


def _svg(title: str, parts: list[str]) -> Markup:
    body = "".join(parts)
    chart = Chart(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f'preserveAspectRatio="xMidYMid meet"><title>{escape(title)}</title>{body}</svg>'
    )
    chart.title = title
    return chart
