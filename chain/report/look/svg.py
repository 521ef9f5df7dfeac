"""The HTML report's charts as inline SVG: bars drawn by hand, no charting library, no
script, nothing loaded when the page is viewed (plotly inlined whole made a one-graph page
4.8 MB). A noisy graph's bar is hatched and outlined in dashes, and labelled "noisy"."""

from __future__ import annotations

import html
from collections.abc import Sequence

from chain.report.records import REFERENCE, GraphRecord, Status

WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 720, 240, 56, 28, 36
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#9d755d", "#e45756", "#72b7b2")
_DEFS = (
    '<defs><pattern id="noisy-hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff7e0"/>'
    '<line x1="0" y1="0" x2="0" y2="6" stroke="#a06a00" stroke-width="3"/></pattern></defs>'
)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _frame(title: str, unit: str, top: float, body: str, legend: str = "") -> str:
    """An SVG chart: title, y axis from 0 to `top` (3 ticks), then `body`."""
    plot_h = HEIGHT - TOP - BOTTOM
    ticks = "".join(
        f'<line x1="{LEFT}" x2="{WIDTH - 8}" y1="{TOP + plot_h * (1 - f):.1f}" '
        f'y2="{TOP + plot_h * (1 - f):.1f}" stroke="#e3e6ec"/>'
        f'<text x="{LEFT - 6}" y="{TOP + plot_h * (1 - f) + 4:.1f}" text-anchor="end" '
        f'font-size="11">{top * f:.3g}</text>'
        for f in (0.0, 0.5, 1.0)
    )
    return (
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg"><title>{_e(title)}</title>'
        f'{_DEFS}<text x="{LEFT}" y="16" font-size="13" font-weight="600">{_e(title)}</text>'
        f'<text x="12" y="{TOP + plot_h / 2:.1f}" font-size="11" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2:.1f})" text-anchor="middle">{_e(unit)}</text>'
        f"{ticks}{body}{legend}</svg>"
    )


def _y(value: float, top: float) -> float:
    plot_h = HEIGHT - TOP - BOTTOM
    return TOP + plot_h * (1 - min(value, top) / top)


def speedups(graphs: Sequence[GraphRecord], speedup: Sequence[float | None]) -> str:
    """One bar per graph: its winner's speedup over eager; noisy graphs hatched, dashed,
    labelled; a dotted line at 1x (eager)."""
    values = [s or 0.0 for s in speedup]
    clean = [v for v, g in zip(values, graphs, strict=True) if not g.noisy]
    top = max([1.5, *(v * 1.15 for v in clean)])  # a noisy 1000x does not flatten the rest
    slot = (WIDTH - LEFT - 8) / max(len(graphs), 1)
    bars = []
    for i, (g, v) in enumerate(zip(graphs, values, strict=True)):
        x, w = LEFT + i * slot + slot * 0.15, slot * 0.7
        y = _y(v, top)
        base = _y(0, top)
        label = f"graph {g.id}: {g.winner or 'none'} {v:.2f}x" + (" (noisy)" if g.noisy else "")
        if g.noisy:
            style = 'class="bar-noisy" fill="url(#noisy-hatch)" stroke="#a06a00" '
            style += 'stroke-dasharray="4 3"'
        else:
            style = f'class="bar-clean" fill="{"#2ca02c" if v >= 1 else "#d62728"}"'
        clipped = "+" if v > top else ""
        bars.append(
            f'<rect {style} x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{base - y:.1f}">'
            f"<title>{_e(label)} — {_e(g.origin)}</title></rect>"
            f'<text x="{x + w / 2:.1f}" y="{max(y - 4, TOP + 10):.1f}" font-size="10" '
            f'text-anchor="middle">{v:.2f}x{clipped}{" noisy" if g.noisy else ""}</text>'
            f'<text x="{x + w / 2:.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="11" '
            f'text-anchor="middle">{g.id}</text>'
        )
    one = _y(1.0, top)
    line = (
        f'<line x1="{LEFT}" x2="{WIDTH - 8}" y1="{one:.1f}" y2="{one:.1f}" stroke="#555" '
        f'stroke-dasharray="2 3"/><text x="{WIDTH - 10}" y="{one - 3:.1f}" font-size="10" '
        'text-anchor="end">eager 1x</text>'
    )
    legend = (
        f'<rect x="{LEFT}" y="{HEIGHT - 14}" width="12" height="9" fill="url(#noisy-hatch)" '
        f'stroke="#a06a00" stroke-dasharray="4 3"/><text x="{LEFT + 16}" y="{HEIGHT - 6}" '
        'font-size="10">noisy: timed on a busy machine, left out of the headline</text>'
    )
    title = "Graphs in call order: winner's speedup over eager"
    return _frame(title, "speedup (x)", top, "".join(bars) + line, legend)


def latencies(graphs: Sequence[GraphRecord]) -> str:
    """Grouped bars per graph: eager (the reference) and each timed backend's latency."""
    series: dict[str, list[float | None]] = {"eager (reference)": [g.eager_ms for g in graphs]}
    for i, g in enumerate(graphs):
        for a in g.attempts:  # eager's own attempt is the reference bar: one eager bar
            if a.verdict == REFERENCE or a.backend == "eager" or a.latency_ms is None:
                continue
            if a.status in (Status.WON, Status.SLOWER):
                series.setdefault(a.backend, [None] * len(graphs))[i] = a.latency_ms
    top = max([v for ys in series.values() for v in ys if v is not None] or [1.0]) * 1.1
    slot = (WIDTH - LEFT - 8) / max(len(graphs), 1)
    w = slot * 0.8 / len(series)
    bars, legend = [], []
    for k, (name, ys) in enumerate(series.items()):
        colour = PALETTE[k % len(PALETTE)]
        legend.append(
            f'<rect x="{LEFT + k * 130}" y="{HEIGHT - 14}" width="10" height="9" '
            f'fill="{colour}"/><text x="{LEFT + k * 130 + 14}" y="{HEIGHT - 6}" '
            f'font-size="10">{_e(name)}</text>'
        )
        for i, (g, v) in enumerate(zip(graphs, ys, strict=True)):
            if v is None:
                continue
            x, y = LEFT + i * slot + slot * 0.1 + k * w, _y(v, top)
            dashed = ' stroke="#a06a00" stroke-dasharray="4 3"' if g.noisy else ""
            bars.append(
                f'<rect fill="{colour}"{dashed} x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" '
                f'height="{_y(0, top) - y:.1f}"><title>graph {g.id}: {_e(name)} '
                f"{v:.3f} ms</title></rect>"
            )
    for i, g in enumerate(graphs):
        bars.append(
            f'<text x="{LEFT + i * slot + slot / 2:.1f}" y="{HEIGHT - BOTTOM + 14}" '
            f'font-size="11" text-anchor="middle">{g.id}</text>'
        )
    title = "Where the time goes: latency per graph by backend"
    return _frame(title, "ms per call", top, "".join(bars), "".join(legend))
