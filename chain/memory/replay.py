"""What a remembered decision becomes in this process: its attempts replayed around the
winner compiled now, and the graph's notes on a hit and on a miss."""

from __future__ import annotations

import dataclasses

from chain.memory.remember import Recall
from chain.report.records import Attempt, Status


def replay(recall: Recall, fresh: Attempt) -> tuple[Attempt, ...] | None:
    """The graph's attempts on a hit: the winner compiled and verified now (`fresh`) with
    the decision's latency and speedup, the others as decided; None if `fresh` failed.

    Every attempt carries `details["remembered"]` = {decided_at, host, pid, key, compiled}:
    `compiled` is True only for the winner, the one backend compiled in this process.
    """
    decision = recall.decision
    if decision is None or fresh.status is not Status.WON:
        return None
    meta = {
        "decided_at": decision.decided_at,
        "host": decision.host,
        "pid": decision.pid,
        "key": recall.key,
    }
    out = []
    for a in decision.attempts:
        if a.backend == decision.winner:
            a = dataclasses.replace(
                fresh,
                reason=fresh.reason or a.reason,
                latency_ms=a.latency_ms,
                speedup=a.speedup,
                spread_ms=a.spread_ms,
                details={
                    **fresh.details,
                    "remembered": {**meta, "compiled": True, "decided_compile_s": a.compile_s},
                },
            )
        else:
            remembered = {**meta, "compiled": False}
            a = dataclasses.replace(a, details={**a.details, "remembered": remembered})
        out.append(a)
    return tuple(out)


def hit_note(recall: Recall) -> str:
    """The graph's note on a hit: whose decision, and what was (not) done this time."""
    decision = recall.decision
    if decision is None:
        return ""
    return (
        f"remembered: {decision.winner} as decided {decision.where()} (key {recall.key}); "
        "only it was compiled and verified, nothing timed: figures are the decision's"
    )


def miss_note(recall: Recall, failed: Attempt) -> str:
    """The graph's note when the remembered winner failed now: selected anew, entry replaced."""
    return (
        f"memory: remembered winner {failed.backend} failed now ({failed.status}: "
        f"{failed.reason}); selected anew and replaced the entry"
    )
