"""The HTML report's drawing of a graph's mixed regions (chain.select.regions): one inline
SVG strip, a block per region in call order, as wide as its winner's time and coloured
by its backend, then a table of every region's candidates. Read from the `regions`
attempt's details, defensively (a report file is a stranger's data)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from chain.report.look.svg import PALETTE
from chain.report.records import GraphRecord
from chain.report.regions import REGIONS

WIDTH, HEIGHT = 720, 34


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _rows(graph: GraphRecord) -> tuple[Any, list[Mapping[str, Any]]]:
    """The graph's regions attempt and its region rows ((None, []) without one)."""
    attempt = next((a for a in graph.attempts if a.backend == REGIONS), None)
    details = attempt.details if attempt is not None else None
    rows = details.get("regions") if isinstance(details, Mapping) else None
    return attempt, [r for r in rows or () if isinstance(r, Mapping)]


def strip(rows: list[Mapping[str, Any]]) -> str:
    """Regions left to right, each as wide as its winner's time, coloured by backend."""
    times = []
    for row in rows:
        ms = row.get("ms") if isinstance(row.get("ms"), Mapping) else {}
        times.append(_number(ms.get(str(row.get("backend")))) or 0.0)
    total = sum(times) or 1.0
    colours: dict[str, str] = {}
    x, blocks = 0.0, []
    for row, t in zip(rows, times, strict=True):
        backend = str(row.get("backend", "?"))
        colour = colours.setdefault(backend, PALETTE[len(colours) % len(PALETTE)])
        w = max(1.0, WIDTH * t / total)
        tip = f"{row.get('path', '?')}: {backend}, {t:.3f} ms"
        blocks.append(
            f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="{HEIGHT - 14}" fill="{colour}" '
            f'stroke="#fff"><title>{_e(tip)}</title></rect>'
        )
        x += w
    legend = "".join(
        f'<text x="{8 + 150 * i}" y="{HEIGHT - 2}" font-size="11" fill="{c}">{_e(b)}</text>'
        for i, (b, c) in enumerate(colours.items())
    )
    return (
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg"><title>regions by backend'
        f"</title>{''.join(blocks)}{legend}</svg>"
    )


def section(graph: GraphRecord) -> str:
    """The graph's regions: the outcome, the strip, a row per region ('' without any)."""
    attempt, rows = _rows(graph)
    if attempt is None:
        return ""
    head = f"Mixed regions ({attempt.status.value}): {attempt.reason}"
    if not rows:
        return f'<div id="regions-{graph.id}"><p>{_e(head)}</p></div>'
    body = []
    for row in rows:
        ms = row.get("ms") if isinstance(row.get("ms"), Mapping) else {}
        failed = row.get("failed") if isinstance(row.get("failed"), Mapping) else {}
        numbers = {b: _number(t) for b, t in ms.items()}
        figures = ", ".join(f"{b} {t:.3f} ms" for b, t in numbers.items() if t is not None)
        lost = "; ".join(f"{b}: {why}" for b, why in failed.items())
        cells = (row.get(k) for k in ("name", "path", "ops", "backend"))
        cells = (*cells, figures, lost)
        body.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    heads = ("region", "module", "ops", "served by", "times", "failed")
    table = (
        '<table class="regions"><thead><tr>' + "".join(f"<th>{h}</th>" for h in heads)
        + f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )  # fmt: skip
    return f'<div id="regions-{graph.id}"><p>{_e(head)}</p>{strip(rows)}{table}</div>'
