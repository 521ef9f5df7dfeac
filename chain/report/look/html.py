"""The report as one self-contained HTML page: summary, timeline, time chart, attempts.

Charts are inline SVG drawn here (chain.report.look.svg): no charting library, no script,
nothing loaded when the page is viewed, a page of tens of kB. Noisy graphs are drawn
hatched and left out of the headline figure.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from backends.common.files import atomic_write
from chain.judge.accuracy import MULTIPLE
from chain.judge.race import RaceStats
from chain.report.bucket_stats import BucketStats
from chain.report.look import regions, svg
from chain.report.records import Attempt, GraphRecord, Status
from chain.report.texts import (
    BUCKET_COLUMNS,
    against_eager,
    bucket_rows,
    recompile_text,
    timing_text,
)

log = logging.getLogger("chain")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330}
h1{font-size:22px;margin:0 0 12px} h2{font-size:17px;margin:28px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{border:1px solid #d8dde6;border-radius:8px;padding:10px 16px;min-width:120px}
.card b{display:block;font-size:22px}
table{border-collapse:collapse;margin:6px 0 14px}
th,td{border-bottom:1px solid #e3e6ec;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f3f5f8} td.n{text-align:right;font-variant-numeric:tabular-nums}
.won{color:#0a7a2f;font-weight:600} .slower{color:#a06a00} .not_tried,.unavailable{color:#8a909c}
.unsupported,.compile_error,.runtime_error,.mismatch{color:#b42318}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#e7f6ec;color:#0a7a2f;
font-weight:600}
.none{background:#fdecea;color:#b42318}
.bar{display:inline-block;height:8px;background:#4c78a8;border-radius:2px;vertical-align:middle}
.bar.over{background:#b42318}
.noisy{color:#a06a00;font-weight:600}
.note{background:#fff7e0;border:1px solid #f0d48a;padding:8px 12px;border-radius:6px}
.repro{color:#5a6270;font-size:12px}
details{margin:4px 0} summary{cursor:pointer} pre{white-space:pre-wrap;font-size:12px}
"""


def _e(value: object) -> str:
    """HTML-escaped text of `value` (empty for None): reasons come from compilers."""
    return "" if value is None else html.escape(str(value), quote=True)


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _speedup(graph: GraphRecord) -> float | None:
    won = graph.winning_attempt
    return won.speedup if won is not None else None


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """A table of already-escaped cells; a cell starting with "\\x00n" is right-aligned."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        tds = []
        for cell in row:
            if cell.startswith("\x00n"):
                tds.append(f'<td class="n">{cell[2:]}</td>')
            else:
                tds.append(f"<td>{cell}</td>")
        body.append(f"<tr>{''.join(tds)}</tr>")
    return f'<table class="{cls}"><tr>{head}</tr>{"".join(body)}</table>'


def _n(text: str) -> str:
    return "\x00n" + text


class Report(Protocol):
    """What the page reads of a report (chain.report.report.Report): its graphs and summary."""

    graphs: list[GraphRecord]

    def summary(self) -> dict[str, Any]: ...
    def summary_line(self) -> str: ...


def _summary(report: Report) -> str:
    s = report.summary()
    cards = [("graphs", str(s["graphs"]))]
    if s["speedup"] is not None:
        cards += [
            ("end to end (timing holds)", f"{s['speedup']:.2f}x"),
            ("eager", f"{s['eager_ms']:.3f} ms"),
            ("winners", f"{s['winner_ms']:.3f} ms"),
        ]
    if s["noisy_speedup"] is not None:
        cards.append(("noisy, left out", f"{s['noisy_speedup']:.2f}x?"))
    recompiled = sum(g.recompiles is not None for g in report.graphs)
    cards.append(("recompiles", str(recompiled)))
    winners = ", ".join(f"{_e(k)}: {v}" for k, v in s["winners"].items()) or "none"
    html_cards = "".join(f'<div class="card">{_e(k)}<b>{_e(v)}</b></div>' for k, v in cards)
    return (
        f'<section id="summary"><h2>Summary</h2><div class="cards">{html_cards}</div>'
        f"<p>Winners: {winners}</p><p>{_e(report.summary_line())}</p></section>"
    )


def _timeline_rows(report: Report) -> list[list[str]]:
    rows = []
    for g in report.graphs:
        won = g.winning_attempt
        badge = (
            f'<span class="badge">{_e(g.winner)}</span>'
            if g.winner
            else '<span class="badge none">none</span>'
        )
        speedup = _speedup(g)
        rows.append(
            [
                f'<a href="#graph-{g.id}">{g.id}</a>',
                _e(g.compile_id or ""),
                _e(g.origin),
                _n(str(g.num_nodes)),
                badge,
                _n(f"<b>{speedup:.2f}x</b>" if speedup is not None else ""),
                _n(_num(g.eager_ms, ".3f")),
                _n(_num(won.latency_ms if won else None, ".3f")),
                _timing_cell(g),
                _e(recompile_text(g) or ""),
            ]
        )
    return rows


def _timing_cell(graph: GraphRecord) -> str:
    """The graph's timing evidence; a noisy one flagged so that it stands out."""
    text = timing_text(graph)
    if text is None:
        return ""
    return f'<span class="noisy">{_e(text)}</span>' if graph.noisy else _e(text)


def _error_cell(a: Attempt) -> str:
    """error / eager error against the allowance (MULTIPLE), drawn as a small bar."""
    if a.error_ratio is None:
        return ""
    width = min(a.error_ratio / MULTIPLE, 1.5) * 60
    over = " over" if a.error_ratio > MULTIPLE else ""
    return (
        f'<span class="bar{over}" style="width:{width:.0f}px"></span> '
        f"{a.error_ratio:.2f} / {MULTIPLE:g}"
    )


REPRODUCIBLE = (Status.UNSUPPORTED, Status.COMPILE_ERROR, Status.RUNTIME_ERROR, Status.MISMATCH)


def _attempt_rows(graph: GraphRecord) -> list[list[str]]:
    rows = []
    for a in graph.attempts:
        status = a.status.value
        reason = _e(a.reason)
        if graph.code is not None and a.status in REPRODUCIBLE:
            command = f"python -m chain repro REPORT.json {graph.id} {a.backend} -o repro/"
            reason += f'<div class="repro">repro: <code>{_e(command)}</code></div>'
        if a.traceback:
            reason += f"<details><summary>traceback</summary><pre>{_e(a.traceback)}</pre></details>"
        rows.append(
            [
                _e(a.backend),
                f'<span class="{_e(status)}">{_e(status)}</span>',
                _n(_num(a.compile_s, ".2f")),
                _n(_num(a.latency_ms, ".3f")),
                _n(_num(a.speedup, ".2f")),
                _e(against_eager(a) or ""),
                _n(_num(a.max_abs_err, ".1e")),
                _error_cell(a),
                reason,
            ]
        )
    return rows


def _graph_section(graph: GraphRecord) -> str:
    parts = [f'<details id="graph-{graph.id}" open><summary><b>graph {graph.id}</b> ']
    parts.append(f"{_e(graph.origin)}: winner <b>{_e(graph.winner or 'none')}</b>")
    if (speedup := _speedup(graph)) is not None:
        parts.append(f" ({speedup:.2f}x)")
    parts.append("</summary>")
    facts = [f"{graph.num_nodes} nodes", f"compile id {graph.compile_id or 'none'}"]
    parts.append(f"<p>{_e(', '.join(facts))}</p>")
    if (text := recompile_text(graph)) is not None:
        parts.append(f"<p>Recompiles {_e(text)}</p>")
    if (timing := timing_text(graph)) is not None:
        cls = ' class="note"' if graph.noisy else ""
        parts.append(f"<p{cls}>Timing: {_e(timing)}</p>")
    if graph.notes:
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in graph.notes) + "</ul>")
    headers = (
        "backend",
        "status",
        "compile s",
        "latency ms",
        "speedup",
        "vs eager (99% CI)",
        "max err",
        f"err / eager err (allowed {MULTIPLE:g})",
        "reason",
    )
    parts.append(_table(headers, _attempt_rows(graph), "attempts"))
    if graph.buckets is not None and graph.buckets.buckets:
        parts.append(_buckets(graph, graph.buckets))
    if graph.race is not None:
        parts.append(_race(graph, graph.race))
    parts.append(regions.section(graph))  # mixed regions, where the selection tried them
    return "".join(parts) + "</details>"


def _race(graph: GraphRecord, race: RaceStats) -> str:
    """The graph's run-time race (chain.judge.race): who serves and challenges, the evidence
    per challenger, and each event with its call number."""
    share = race.race_s / race.served_s if race.served_s else 0.0
    head = (
        f"Run-time race ({race.state}): {race.server} serves; challengers "
        f"{', '.join(race.challengers) or 'none'}; {race.pairs} paired calls, "
        f"{share:.1%} of serving time"
    )
    evidence = "".join(f"<li>{_e(k)}: {_e(v)}</li>" for k, v in race.evidence.items())
    rows = [[_n(str(e.call)), _e(e.what), _e(e.backend), _e(e.why)] for e in race.events]
    table = _table(("call", "event", "backend", "why"), rows, "race") if rows else ""
    return (
        f'<div id="race-{graph.id}"><p>{_e(head)}</p>'
        f"{f'<ul>{evidence}</ul>' if evidence else ''}{table}</div>"
    )


def _buckets(graph: GraphRecord, stats: BucketStats) -> str:
    """The graph's per-shape buckets (chain.run.buckets): the report's bucket columns."""
    numeric = {c.name for c in BUCKET_COLUMNS if c.numeric}
    rows = [
        [
            _n(_e(t)) if c.name in numeric else _e(t)
            for c, t in zip(BUCKET_COLUMNS, row, strict=True)
        ]
        for row in bucket_rows([graph])
    ]
    title = (
        f"Buckets (after {stats.bucket_after} calls of a shape, at most {stats.max_buckets}; "
        f"{stats.compiles()} compile(s) in this run)"
    )
    headers = [c.name for c in BUCKET_COLUMNS]
    return (
        f'<div id="buckets-{graph.id}"><p>{_e(title)}</p>{_table(headers, rows, "buckets")}</div>'
    )


def _charts(report: Report) -> list[str]:
    """Two inline SVG charts (chain.report.look.svg): speedup per graph, noisy ones
    hatched and labelled; latency per graph by backend."""
    speedups = [_speedup(g) for g in report.graphs]
    return [svg.speedups(report.graphs, speedups), svg.latencies(report.graphs)]


def _timeline(report: Report) -> str:
    """The section of one row per graph, in call order."""
    timeline = _table(
        (
            "graph",
            "compile id",
            "origin",
            "nodes",
            "winner",
            "speedup",
            "eager ms",
            "winner ms",
            "timing",
            "recompiles",
        ),
        _timeline_rows(report),
        "timeline",
    )
    return f'<section id="timeline"><h2>Graphs in call order</h2>{timeline}</section>'


def _graphs(report: Report) -> str:
    """The section of every graph's attempts."""
    sections = "".join(_graph_section(g) for g in report.graphs)
    return f'<section id="graphs"><h2>Attempts per graph</h2>{sections}</section>'


def render(report: Report, title: str = "backend-chain report", charts: bool = True) -> str:
    """The whole page; `charts=False` gives tables only. No script: nothing runs or loads."""
    body = [f"<h1>{_e(title)}</h1>", _summary(report), _timeline(report)]
    if charts and report.graphs:
        body.append('<section id="charts"><h2>Charts</h2>' + "".join(_charts(report)))
        body.append("</section>")
    body.append(_graphs(report))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


SCOPE = "backend-chain-report"  # the class of the fragment's <div>: its styles stop there


def _scoped(css: str) -> str:
    """`css` with every selector under `.SCOPE` (`body` becoming `.SCOPE` itself), so that
    the fragment's styles leave the rest of a notebook alone."""
    rules = []
    for rule in css.replace("\n", "").split("}"):
        if "{" not in rule:
            continue
        selectors, declarations = rule.split("{", 1)
        scoped = [
            f".{SCOPE}" if sel.strip() == "body" else f".{SCOPE} {sel.strip()}"
            for sel in selectors.split(",")
        ]
        rules.append(f"{','.join(scoped)}{{{declarations}}}")
    return "\n".join(rules)


def fragment(report: Report) -> str:
    """The page's summary and tables as one <div>, without charts or any script, its styles
    scoped to it: what a notebook shows for a report (`Report._repr_html_`)."""
    body = _summary(report) + _timeline(report) + _graphs(report)
    return f'<div class="{SCOPE}"><style>{_scoped(_CSS)}</style>{body}</div>'


def save(report: Report, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """Write the page atomically (a crash leaves the old file or the new one), to a regular
    file only: a symlink, FIFO, device or folder at `path` is UnsafeFile, left as it was.
    A missing folder is created, as `Report.save` does, with a warning naming it."""
    target = Path(path)
    if not target.parent.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        log.warning("Report.save_html: created the missing directory %s", target.parent)
    return atomic_write(target, render(report, **kwargs))
