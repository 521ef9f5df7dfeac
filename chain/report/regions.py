"""The text report of mixed regions (chain.select.regions): per graph that tried them, each
region with its winner and every candidate's time on it, the crossings and the plan,
read from the `regions` attempt's details (data from a file: read defensively)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chain.report.records import Attempt, GraphRecord

REGIONS = "regions"  # the attempt of a graph served (or not) by mixed regions


def _ms(value: Any) -> str:
    return f"{value:.3f} ms" if isinstance(value, int | float) else "?"


def _region_line(row: Mapping[str, Any]) -> str:
    """`  submod_1 encoder.layer.0 (25 ops) -> inductor: inductor 0.120 ms, eager 0.300 ms;
    wrong_b mismatch`"""
    times = row.get("ms") if isinstance(row.get("ms"), Mapping) else {}
    failed = row.get("failed") if isinstance(row.get("failed"), Mapping) else {}
    ranked = sorted(times.items(), key=lambda kv: kv[1] if isinstance(kv[1], int | float) else 0)
    figures = ", ".join(f"{b} {_ms(t)}" for b, t in ranked)
    lost = "; ".join(f"{b} {str(why).split(':', 1)[0]}" for b, why in failed.items())
    head = f"  {row.get('name', '?')} {row.get('path', '?')} ({row.get('ops', '?')} ops)"
    return f"{head} -> {row.get('backend', '?')}: {figures}" + (f"; {lost}" if lost else "")


def graph_lines(graph: GraphRecord, attempt: Attempt) -> list[str]:
    """One graph's regions: a head line (outcome, counts, plan), a line per region, the
    crossings."""
    d = attempt.details if isinstance(attempt.details, Mapping) else {}
    rows = [r for r in d.get("regions", ()) if isinstance(r, Mapping)]
    head = f"graph {graph.id}: regions {attempt.status.value} ({attempt.reason})"
    if rows:
        head += (
            f"; {len(rows)} regions, {d.get('unique', '?')} distinct; planned "
            f"{_ms(d.get('planned_ms'))} (crossings {_ms(d.get('planned_crossings_ms'))})"
        )
    out = [head, *map(_region_line, rows)]
    parts = [p for p in d.get("parts", ()) if isinstance(p, Mapping)]
    if parts:
        out.append("  parts (consecutive regions of one backend joined): " + "; ".join(
            f"{p.get('name', '?')} {p.get('path', '?')} ({p.get('ops', '?')} ops) -> "
            f"{p.get('backend', '?')}" for p in parts
        ))  # fmt: skip
    crossings = d.get("crossings_ms")
    if isinstance(crossings, Mapping) and crossings:
        out.append("  crossings: " + ", ".join(f"{k} {_ms(v)}" for k, v in crossings.items()))
    notes = d.get("notes")
    if isinstance(notes, list):
        out += [f"  note: {n}" for n in notes if isinstance(n, str)]
    return out


def region_lines(graphs: Iterable[GraphRecord]) -> list[str]:
    """Every graph's regions (those whose selection tried mixing)."""
    out: list[str] = []
    for graph in graphs:
        for attempt in graph.attempts:
            if attempt.backend == REGIONS:
                out += graph_lines(graph, attempt)
    return out
