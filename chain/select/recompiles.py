"""Which compile of which frame a graph comes from, and why dynamo recompiled it.

Dynamo numbers each compile `frame/attempt` ("0/1": frame 0's second compile, a
recompile). A recompile happens when a guard of every earlier compile of that frame fails
(a new shape, dtype, or a size now dynamic); dynamo keeps the first failing guard in the
metrics of the compile in progress, read here without turning on its recompile logging.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch._guards import CompileContext


@dataclass(frozen=True)
class CompileOrigin:
    """Dynamo's compile id of the graph in hand, and its recompile reason if it is one."""

    compile_id: str | None = None
    frame: int | None = None
    recompile: bool = False
    reason: str | None = None
    attempt: int = 0  # which compile of its frame (0: the first)


def current() -> CompileOrigin:
    """The compile dynamo is running now (empty outside dynamo: a graph handed over by hand)."""
    compile_id = CompileContext.current_compile_id()
    frame = getattr(compile_id, "frame_id", None)
    if compile_id is None or frame is None:
        return CompileOrigin()
    attempt = getattr(compile_id, "frame_compile_id", 0) or 0
    recompile = attempt > 0
    return CompileOrigin(
        str(compile_id), frame, recompile, _reason() if recompile else None, attempt
    )


def limit_note(origin: CompileOrigin) -> str | None:
    """Said on a frame's last compile under dynamo's `recompile_limit`: a later call that
    fits none of its compiles runs uncompiled, which no report of the chain would show."""
    import torch._dynamo.config as config

    limit = config.recompile_limit
    if origin.compile_id is None or origin.attempt + 1 < limit:
        return None
    return (
        f"compile {origin.attempt + 1} of this frame: dynamo's recompile_limit is {limit}, "
        "so a later call that fits none of its compiles (a new shape, dtype or grad mode) "
        "runs uncompiled, in eager, outside the chain (raise "
        "torch._dynamo.config.recompile_limit, or mark sizes dynamic)"
    )


def _reason() -> str | None:
    """The guard that failed, as dynamo recorded it ("0/0: tensor 'x' size mismatch ...")."""
    from torch._dynamo.utils import get_metrics_context

    context = get_metrics_context()
    if not context.in_progress():
        return None
    # no public reader: the metrics context keeps its values in `_metrics`
    reason = getattr(context, "_metrics", {}).get("recompile_reason")
    if not reason:
        return None
    first = str(reason).strip().splitlines()[0].split("  # ")[0]  # less the source comment
    first = re.sub(r"^\d+/\d+: ", "", first)  # the compile it names is the graph recompiled
    return " ".join(first.split())
