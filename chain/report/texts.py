"""What the report's forms say of an attempt or a graph beyond its fields: its speed
against eager, its timing's evidence, its recompile, and the buckets' columns. The table,
markdown and HTML forms (chain.report.report, chain.report.look.html) all read these."""

from __future__ import annotations

from chain.report.bucket_stats import Bucket, race_text
from chain.report.columns import Column, texts
from chain.report.records import REFERENCE, Attempt, GraphRecord


def against_eager(attempt: Attempt) -> str | None:
    """The speed verdict with its 99% interval: `faster 1.38-1.52x`, `reference` for eager
    itself; None when not timed."""
    if attempt.verdict is None:
        return None
    if attempt.speedup_lo is None or attempt.speedup_hi is None or attempt.verdict == REFERENCE:
        return attempt.verdict
    return f"{attempt.verdict} {attempt.speedup_lo:.2f}-{attempt.speedup_hi:.2f}x"


def timing_text(record: GraphRecord) -> str | None:
    """How the graph's figures were timed, `noisy: why` first when they may not hold."""
    timing = record.timing
    return None if timing is None else str(timing)


def noise_flag(record: GraphRecord) -> str | None:
    """The tables' short form: `noisy: why` when the figures may not hold, else `ok`."""
    timing = record.timing
    if timing is None:
        return None
    return f"noisy: {'; '.join(timing.noisy)}" if timing.noisy else f"ok ({timing.rounds} rounds)"


def recompile_text(record: GraphRecord) -> str | None:
    """`graph N: why` for a recompile (why: dynamo's failed guard), None for a first compile."""
    if record.recompiles is None:
        return None
    return f"graph {record.recompiles}: {record.recompile_reason or 'reason not recorded'}"


def _decided(bucket: Bucket) -> str:
    """Where a bucket was decided: `here`, or `remembered <when>` (chain.memory)."""
    if bucket.remembered is None:
        return "here"
    return f"remembered {bucket.remembered.get('decided_at') or ''}".rstrip()


BUCKET_COLUMNS: tuple[Column[tuple[GraphRecord, Bucket]], ...] = (
    Column("graph", lambda gb: gb[0].id),
    Column("shape", lambda gb: gb[1].shape, wrap=True),
    Column("state", lambda gb: gb[1].state),
    Column("winner", lambda gb: gb[1].winner or f"general:{gb[1].general}"),
    Column("calls", lambda gb: gb[1].calls, numeric=True),
    Column(
        "speedup",
        lambda gb: gb[1].speedup,
        lambda v: "-" if v is None else f"{v:.2f}x",
        numeric=True,
    ),
    Column("decided", lambda gb: _decided(gb[1])),
    Column("race", lambda gb: race_text(gb[1].race) if gb[1].race else None, wrap=True),
    Column("reason", lambda gb: gb[1].reason, wrap=True, stretch=True),
)


def bucket_rows(graphs: list[GraphRecord]) -> list[list[str]]:
    """One row per bucket of `graphs`: graph, shape, state, who serves it, calls, speedup,
    where it was decided, its run-time race against the general path, and why it lost."""
    return texts(BUCKET_COLUMNS, [(g, b) for g in graphs if g.buckets for b in g.buckets.buckets])
