"""The chain's decision per graph as a torch structured-trace artifact (`TORCH_TRACE=dir`).

tlparse and the raw trace then show, beside dynamo's and inductor's entries for the same
compile id, which backends were tried on the graph, how each ended and why, and what
each cost. Nothing is built unless structured tracing is on.
"""

from __future__ import annotations

import logging
from typing import Any

from torch._logging import trace_structured

from chain.report import json_fields as jf
from chain.report.records import GraphRecord

log = logging.getLogger("chain")

ARTIFACT = "chain_graph_decision"


def decision(record: GraphRecord) -> dict[str, Any]:
    """The graph's decision as JSON-ready data: the graph, the winner, every attempt."""
    return {
        "graph": record.id,
        "compile_id": record.compile_id,
        "origin": record.origin,
        "fingerprint": record.fingerprint,
        "winner": record.winner,
        "eager_ms": record.eager_ms,
        "recompiles": record.recompiles,
        "recompile_reason": record.recompile_reason,
        "notes": list(record.notes),
        "attempts": [
            {
                "backend": a.backend,
                "status": a.status.value,
                "reason": a.reason,
                "error_type": a.error_type,
                "compile_s": a.compile_s,
                "latency_ms": a.latency_ms,
                "speedup": a.speedup,
                "error_ratio": a.error_ratio,
            }
            for a in record.attempts
        ],
    }


def emit(record: GraphRecord) -> None:
    """One `chain_graph_decision` artifact for a finished record (and a debug log line)."""
    log.debug(
        "graph %d decision: %s",
        record.id,
        "; ".join(f"{a.backend}={a.status.value}" for a in record.attempts),
    )
    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": ARTIFACT, "encoding": "json"},
        payload_fn=lambda: jf.dumps(decision(record), default=str),
    )
