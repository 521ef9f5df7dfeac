"""Report writers: the terminal table, CSV, JSON, a markdown summary and a PNG chart.

Files are written atomically (a temporary file renamed over the target), so a crash
leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from backends.common.files import atomic_path, atomic_write
from chain.bench.harness import Result
from chain.report import columns
from chain.report.columns import Column

FIELDS = (
    "model", "candidate", "kind", "status", "median_ms", "iqr_ms", "speedup", "compile_s",
    "max_abs_err", "graphs", "winners", "samples", "reason", "lost",
)  # fmt: skip
# The CSV: every field of a row's `to_dict()`, raw (the tables below format theirs).
CSV_COLUMNS: tuple[Column[dict[str, Any]], ...] = tuple(
    Column(name, operator.itemgetter(name)) for name in FIELDS
)


def to_csv(rows: Sequence[Result]) -> str:
    """One line per (model, candidate); lists (winners in graph order, losses) joined by '; '."""
    return columns.to_csv(CSV_COLUMNS, [r.to_dict() for r in rows])


def to_json(meta: dict[str, Any], rows: Sequence[Result]) -> str:
    """The run's settings and machine under `meta`, every row under `rows`."""
    data = {"meta": meta, "rows": [r.to_dict() for r in rows]}
    return json.dumps(data, indent=2, allow_nan=False)


def geomeans(rows: Sequence[Result]) -> dict[str, tuple[float, int]]:
    """Per candidate: geometric mean of its speedups over eager, and over how many models.

    Only rows whose outputs matched eager count: a wrong answer's speed is no gain.
    """
    logs: dict[str, list[float]] = {}
    for row in rows:
        if row.speedup and row.status == "ok":
            logs.setdefault(row.candidate, []).append(math.log(row.speedup))
    return {c: (math.exp(sum(v) / len(v)), len(v)) for c, v in logs.items()}


def _spread(row: Result) -> str:
    """The interquartile range as a share of the median: how much to trust the figure."""
    if row.iqr_ms is None or not row.median_ms:
        return "-"
    return f"±{50 * row.iqr_ms / row.median_ms:.0f}%"


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}" + ("x" if value else "")


COLUMNS: tuple[Column[Result], ...] = (
    Column("model", lambda r: r.model),
    Column("candidate", lambda r: r.candidate),
    Column("status", lambda r: r.status),
    Column("median ms", lambda r: r.median_ms, ".3f", numeric=True),
    Column("spread", lambda r: r, _spread, numeric=True),
    Column("speedup", lambda r: r.speedup, _speedup, numeric=True),
    Column("compile s", lambda r: r.compile_s, ".2f", numeric=True),
    Column("max abs err", lambda r: r.max_abs_err, ".1e", numeric=True),
    Column("graphs", lambda r: r.graphs, numeric=True),
    Column("winners", lambda r: r.winners, joiner=" "),
    Column("reason / note", lambda r: r.reason, wrap=True),
)
HEADERS = tuple(c.name for c in COLUMNS)


def to_table(rows: Sequence[Result], title: str) -> Table:
    """The rich table printed at the end of a run."""
    table = columns.rich_table(COLUMNS, title=title, show_lines=False)
    model = None
    for row in rows:
        if model is not None and row.model != model:
            table.add_section()
        model = row.model
        style = "" if row.status == "ok" else "dim"
        table.add_row(*columns.cells(COLUMNS, row), style=style)
    return table


def chain_costs(rows: Sequence[Result]) -> list[str]:
    """Markdown: each chain row against its winner run alone, and what the chain rejected."""
    alone = {(r.model, r.candidate): r for r in rows if r.kind == "backend" and r.median_ms}
    out = ["", "## What the chains cost", ""]
    out += ["Compile time of the chain (every backend it tried, verified and measured) and its "
            "latency, against the backend that won every graph, run alone.", ""]  # fmt: skip
    out += ["| model | chain | winner | compile s: chain / alone | latency: chain / alone |"]
    out += ["|---|---|---|---:|---:|"]
    rejected: dict[str, tuple[dict[str, None], dict[str, None]]] = {}  # line -> models, chains
    for row in rows:
        if row.kind != "chain" or not row.median_ms:
            continue
        for line in row.lost:
            models, chains = rejected.setdefault(line, ({}, {}))
            models[row.model] = chains[row.candidate] = None
        winners = set(row.winners)
        label = "dynamo-eager" if winners == {"eager"} else next(iter(winners), "")
        other = alone.get((row.model, label)) if len(winners) == 1 else None
        if other is None or other.median_ms is None:
            continue
        ratio = f"{row.compile_s:.2f} / {other.compile_s:.2f}"
        out.append(f"| {row.model} | {row.candidate} | {label} | {ratio} | "
                   f"{row.median_ms / other.median_ms:.2f}x |")  # fmt: skip
    if rejected:
        out += ["", "Why the other backends of the chains lost:", ""]
        for line, (models, chains) in rejected.items():
            out.append(f"- {line} (on {', '.join(models)}; in {', '.join(chains)})")
    return out


def against_peers(rows: Sequence[Result]) -> list[str]:
    """Markdown: per model and chain, its latency over the best non-chain row's (the best peer).

    Peers are eager, each single backend and the peer columns; only rows that matched
    eager count. Below 1.00x the chain is faster than every peer on that model.
    """
    best: dict[str, Result] = {}
    for row in rows:
        if row.kind == "chain" or row.status != "ok" or not row.median_ms:
            continue
        if row.model not in best or row.median_ms < (best[row.model].median_ms or 0):
            best[row.model] = row
    chains = [r for r in rows if r.kind == "chain" and r.status == "ok" and r.median_ms]
    if not chains or not any(r.kind == "peer" for r in rows):
        return []
    out = ["", "## The chains against the best peer", ""]
    out += ["Chain latency over the best peer's latency, per model (below 1.00x: the chain is "
            "faster than every peer).", ""]  # fmt: skip
    out += ["| model | chain | best peer | peer ms | chain ms | chain / best peer |"]
    out += ["|---|---|---|---:|---:|---:|"]
    for row in chains:
        peer = best.get(row.model)
        if peer is None or not peer.median_ms or not row.median_ms:
            continue
        out.append(f"| {row.model} | {row.candidate} | {peer.candidate} | {peer.median_ms:.3f} "
                   f"| {row.median_ms:.3f} | {row.median_ms / peer.median_ms:.2f}x |")  # fmt: skip
    unavailable = [r for r in rows if r.status == "unavailable" and r.kind == "eager"]
    if unavailable:
        out += ["", "Models not run here:", ""]
        out += [f"- {r.model}: {r.reason}" for r in unavailable]
    return out


def to_markdown(meta: dict[str, Any], rows: Sequence[Result]) -> str:
    """A summary: the settings, geometric-mean speedups per candidate, then every row."""
    out = [
        "# Benchmark summary",
        "",
        f"`{meta['command']}` on {meta['machine']}: device {meta['device']}, dtype "
        f"{meta['dtype']}, {meta['repeats']} interleaved repeats after {meta['warmup']} "
        "warm-up rounds; median latency; spread = half the interquartile range over the median; "
        "speedup = eager median / candidate median (same run); compile time = the first call; "
        f"load average {meta['load_before']} before, {meta['load_after']} after.",
        "",
        "## Geometric mean of speedups over eager",
        "",
        "| candidate | geomean speedup | models |",
        "|---|---:|---:|",
    ]
    for cand, (mean, n) in geomeans(rows).items():
        out.append(f"| {cand} | {mean:.2f}x | {n} |")
    out += chain_costs(rows)
    out += against_peers(rows)
    out += ["", "## All runs", ""]
    out += columns.markdown(COLUMNS, columns.texts(COLUMNS, rows))
    return "\n".join(out) + "\n"


def relative_spread(row: Result, eager: Result | None) -> float | None:
    """Half the IQR over the median, the candidate's plus eager's (a speedup has both)."""
    if row.iqr_ms is None or not row.median_ms:
        return None
    spread = 0.5 * row.iqr_ms / row.median_ms
    if eager is not None and eager is not row and eager.iqr_ms is not None and eager.median_ms:
        spread += 0.5 * eager.iqr_ms / eager.median_ms
    return spread


def chart_title(meta: dict[str, Any]) -> str:
    """What the figures were measured on: device, dtype, threads, machine."""
    threads = meta.get("threads")
    where = f"{meta.get('device', '?')} {meta.get('dtype', '?')}"
    where += f", {threads} threads" if threads else ""
    return f"speedup over eager ({where})\n{meta.get('machine', '')}".strip()


def missing_backends(rows: Sequence[Result]) -> list[str]:
    """One line per candidate that could not run here, with its reason."""
    lines = {
        f"{r.candidate}: {r.status} ({r.reason})": None
        for r in rows
        if r.status in ("unavailable", "not_registered")
    }
    return list(lines)


def draw(meta: dict[str, Any], rows: Sequence[Result]) -> Any:
    """The chart as a matplotlib Figure: bars with spread whiskers, title, what did not run."""
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    eager = {r.model: r for r in rows if r.kind == "eager"}
    ok = {(r.model, r.candidate): r for r in rows if r.speedup and r.status == "ok"}
    cands = list(dict.fromkeys(c for _, c in ok if c != "eager"))
    width = 0.8 / max(len(cands), 1)
    missing = missing_backends(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(models)), 4.4 + 0.18 * len(missing)))
    for i, cand in enumerate(cands):
        xs = [m + i * width for m in range(len(models))]
        found = [ok.get((m, cand)) for m in models]
        heights = [r.speedup if r and r.speedup else 0.0 for r in found]
        spreads = [relative_spread(r, eager.get(r.model)) if r else None for r in found]
        low = [h - h / (1 + s) if s else 0.0 for h, s in zip(heights, spreads, strict=True)]
        high = [h * s if s else 0.0 for h, s in zip(heights, spreads, strict=True)]
        ax.bar(xs, heights, width, yerr=[low, high], capsize=2, label=cand)
    ax.axhline(1.0, color="black", linewidth=0.8, label="eager = 1")
    ax.set_xticks([m + 0.4 - width / 2 for m in range(len(models))], models)
    ax.set_ylabel("speedup over eager (x)")
    ax.set_title(chart_title(meta), fontsize="medium")
    ax.legend(fontsize="small", ncols=2)
    note = "whiskers: half the interquartile range of candidate and eager, relative, added"
    lines = [note] + (["not run here:"] + [f"  {m}" for m in missing] if missing else [])
    fig.text(0.01, 0.01, "\n".join(lines), fontsize="x-small", va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.04 + 0.035 * len(lines), 1, 1))
    return fig


def write_png(path: Path, meta: dict[str, Any], rows: Sequence[Result]) -> str | None:
    """The chart as a PNG; a reason if it cannot be drawn (no matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install 'backend-chain[bench]'): no chart"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw(meta, rows)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    finally:
        plt.close(fig)
    return None


def write_all(
    out: Path, meta: dict[str, Any], rows: Sequence[Result]
) -> tuple[list[Path], str | None]:
    """Every output file into `out`; returns the paths written and why the chart was skipped."""
    out.mkdir(parents=True, exist_ok=True)
    writers: dict[str, Callable[[], str]] = {
        "results.csv": lambda: to_csv(rows),
        "results.json": lambda: to_json(meta, rows),
        "summary.md": lambda: to_markdown(meta, rows),
    }
    paths = []
    for name, render in writers.items():
        atomic_write(out / name, render())
        paths.append(out / name)
    skipped = write_png(out / "speedups.png", meta, rows)
    if skipped is None:
        paths.append(out / "speedups.png")
    return paths, skipped
