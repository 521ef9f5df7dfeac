"""Weight updates as they happen: noticed before the call, refreshed or served live, recorded.

The guard asks `Updates.seen` before each call (`Weights.same`: the weights' identities and
counters). On an update the winner answers on the new weights: a backend that froze them
(a compiled callable with `chain_refresh(args, force=False, trace=True) -> str | None`, as
ONNX Runtime's runner) refreshes first, and the refresh is timed (`trace=False` once other
threads call: a refresh that would trace the graph again, a re-export, raises instead and
the chain falls back; chain.run.callers); one that reads them live serves as is, and its
first `VERIFY_AFTER` updates are followed by a re-verification of the next call (a backend
that froze the weights without saying so is caught then, and that call is answered by the
next). When updates come so often that refreshing costs more than the winner saves over
eager (`too_often`), the winner steps down for a backend that reads weights live.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends.errors import one_line
from chain.run.callers import may_trace
from chain.run.watch.stats import RunChecks, WeightUpdate
from chain.run.watch.watch import Demoted, Watch
from chain.run.watch.weights import Weights

JUDGED = 3  # updates whose spacing is judged (fewer: too few to call them frequent)
OFTEN_CALLS = 8  # without timings: updates this close (mean calls apart) are frequent
VERIFY_AFTER = 2  # a live-weights winner's first updates are followed by a re-verification


class UpdatesOften(Demoted):
    """A winner that froze the weights, stepping down for one that reads them live: the
    weights change so often that refreshing costs more than it saves."""


@dataclass(frozen=True)
class Refresh:
    """What the winner did about an update: how, in how long (0 for live weights)."""

    how: str
    seconds: float


def too_often(calls: list[int], refresh_s: float, saved_per_call_s: float | None) -> str | None:
    """Why updates at `calls` (call numbers, oldest first) come too often for a winner whose
    refresh takes `refresh_s` and that saves `saved_per_call_s` a call over eager (None:
    not timed); None when refreshing pays."""
    if len(calls) < JUDGED:
        return None
    recent = calls[-JUDGED:]
    gaps = [b - a for a, b in itertools.pairwise(recent)]
    gap = statistics.mean(gaps)
    where = ", ".join(map(str, recent))
    if saved_per_call_s is not None and saved_per_call_s > 0:
        if refresh_s <= saved_per_call_s * gap:
            return None
        return (
            f"weights updated every {gap:.1f} calls (calls {where}): each refresh takes "
            f"{refresh_s * 1e3:.1f} ms, more than the {gap:.1f} calls between updates save "
            f"over eager ({saved_per_call_s * gap * 1e3:.2f} ms); a backend that reads the "
            "weights live serves instead"
        )
    if gap > OFTEN_CALLS:
        return None
    return (
        f"weights updated every {gap:.1f} calls (calls {where}), each followed by a "
        f"{refresh_s * 1e3:.1f} ms refresh; a backend that reads the weights live serves "
        "instead"
    )


class Updates:
    """One graph's updates: the weights' baseline, the call count, what was recorded."""

    def __init__(
        self,
        weights: Weights,
        stats: RunChecks,
        saved_s: Callable[[str], float | None] = lambda name: None,
    ) -> None:
        self.weights = weights
        self.stats = stats
        self.saved_s = saved_s  # per winner: what it saves a call over eager (None: untimed)
        self.calls = itertools.count(1)
        self.call = 0  # the latest call number (approximate under threads)
        self.at: deque[int] = deque(maxlen=JUDGED)  # calls at which updates were seen
        self.verified: dict[str, int] = {}  # per live winner: updates followed by a check
        self.refresh_s: dict[str, float] = {}  # per winner that froze them: its last refresh

    def record(self, winner: str, changed: int, refresh: Refresh) -> WeightUpdate:
        """Keep an update on the graph's record: at which call, who refreshed, how long."""
        update = WeightUpdate(
            call=self.call, backend=winner, weights=changed, how=refresh.how,
            refresh_s=round(refresh.seconds, 6),
        )  # fmt: skip
        self.stats.updates.append(update)
        self.at.append(self.call)
        return update

    def verify_next(self, winner: str) -> bool:
        """Whether to re-verify the call after this update of a live-weights `winner`."""
        seen = self.verified.get(winner, 0)
        self.verified[winner] = seen + 1
        return seen < VERIFY_AFTER

    def apply(
        self,
        fn: Callable[..., Any],
        winner: str,
        watch: Watch | None,
        args: Sequence[Any],
        changed: int,
        force: bool,
    ) -> Exception | None:
        """`winner` (its callable `fn`) meets an update of `changed` weights (`force`: seen by
        value, no counter moved): refreshed and timed, or served live (the next call
        re-verified, for its first updates), recorded. Returns what to fall back on: a
        refresh that failed, or `UpdatesOften` when refreshing is not worth it."""
        refresh = getattr(fn, "chain_refresh", None)
        self.weights.rebase(args)
        if refresh is None:
            how = "reads them live"
            if watch is not None and self.verify_next(winner):
                watch.schedule.due = watch.schedule.mark = watch.stats.calls + 1
                how += " (the next call re-verified)"
            self.record(winner, changed, Refresh(how, 0.0))
            return None
        last = self.refresh_s.get(winner)
        if last is not None and (why := self.frequent(winner, last)):
            self.record(winner, changed, Refresh(f"stepped down: {why}", 0.0))
            return UpdatesOften(self.call, why)
        start = time.perf_counter()
        try:
            how = refresh(args, force=force, trace=may_trace())
        except Exception as exc:  # the winner's failure, recorded; the next one serves
            self.record(winner, changed, Refresh(f"failed to refresh: {one_line(exc)}", 0.0))
            return exc
        took = time.perf_counter() - start
        self.refresh_s[winner] = took
        self.record(winner, changed, Refresh(how or "had nothing frozen to refresh", took))
        return None

    def frequent(self, winner: str, refresh_s: float) -> str | None:
        """Why the updates so far make `winner`'s refreshes not worth it (None: they are)."""
        return too_often([*self.at, self.call], refresh_s, self.saved_s(winner))


def weights_changed(model: torch.nn.Module | Iterable[torch.Tensor]) -> int:
    """Say that `model`'s parameters and buffers (or these tensors) were written behind
    PyTorch's version counters: through `.data`, as PEFT's `merge_adapter()` and
    `unmerge_adapter()` do (`weight.data += delta`). Their counters are moved, so the next
    call of every graph that reads them sees an update (refreshed where a backend froze
    them, recorded), not damage: a write the counters do not show is otherwise taken as a
    backend's, and every later call raises `WeightsDamaged`. Call it between calls, after
    the write. Inference tensors keep no counter (their values are compared instead): they
    are left as they are. How many counters moved."""
    if isinstance(model, torch.nn.Module):
        tensors: list[torch.Tensor] = [*model.parameters(), *model.buffers()]
    else:
        tensors = list(model)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        kinds = sorted({type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)})
        raise TypeError(f"weights_changed takes a module or tensors, got {', '.join(kinds)}")
    counted = [t for t in tensors if not t.is_inference()]
    if counted:
        torch.autograd.graph.increment_version(counted)
    return len(counted)
