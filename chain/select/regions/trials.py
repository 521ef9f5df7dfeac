"""Each distinct region compiled, verified and timed under each candidate of the chain on
the region's recorded real inputs: the chain's own selection (`fastest` mode, interleaved
rounds against eager), run on the region's graph. Regions sharing a key share one trial."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import fx

from chain.judge.speed import EAGER
from chain.judge.timing import Timing
from chain.report.records import Attempt, Status

if TYPE_CHECKING:
    from chain.select.candidates import Selection


@dataclasses.dataclass(frozen=True)
class Trial:
    """One region's trial: every candidate's attempt, the callables that passed
    verification and timing (eager's own forward among them), and eager's timing."""

    attempts: tuple[Attempt, ...]
    fns: dict[str, Callable[..., Any]]
    eager: Timing | None
    notes: tuple[str, ...] = ()

    def costs(self) -> dict[str, float]:
        """Seconds per call of each backend that passed on this region (eager included),
        in the chain's order: what the assignment chooses among."""
        out: dict[str, float] = {}
        for a in self.attempts:
            ran = a.status in (Status.WON, Status.SLOWER) and a.backend in self.fns
            if ran and a.latency_ms is not None:
                out[a.backend] = a.latency_ms / 1000
        if EAGER not in out and self.eager is not None:
            out[EAGER] = self.eager.median_ms / 1000
        return out

    def fn(self, backend: str, sub: fx.GraphModule) -> Callable[..., Any]:
        """The callable that ran `backend` in this trial (eager: the region's forward)."""
        if backend == EAGER:
            return self.fns.get(EAGER) or sub.forward
        return self.fns[backend]


def trial(selection: Selection, sub: fx.GraphModule, inputs: list[Any]) -> Trial:
    """`sub` (a region) through the chain's selection in `fastest` mode on its `inputs`."""
    region = dataclasses.replace(selection, mode="fastest", regions=False)
    reference, notes = region.reference(sub, inputs)
    if not reference.runnable or reference.unverified:
        why = reference.unverified or "the region cannot be run here"
        return Trial((), {}, None, (why,))
    attempts, fns, eager = region.run(sub, inputs, reference)
    return Trial(tuple(attempts), dict(fns), eager, tuple(notes))
