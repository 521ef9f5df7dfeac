"""The inputs a graph writes to: kept before a winner's call so a failed call can be undone.

Why a snapshot: a winner that writes and then raises (or is caught wrong) has applied its
write; the next backend would apply it again (`x.add_(1)` twice). Copying only the inputs
eager wrote at selection (found by their version counters) costs one copy of each per call,
and only for graphs that write to their inputs: usually a few small tensors (a counter, a
cache slot). Past `SNAPSHOT_BYTES` the copy could cost more than the graph, so none is
kept: the version counters still show whether a failed call wrote, and if it did the call
fails with `InputsWritten`, which says which inputs are in which state, instead of writing
them twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Any

import torch

from backends.common.versions import NO_VERSION, version

SNAPSHOT_BYTES = 256 * 2**20  # the largest total size of written inputs copied per call


class InputsWritten(RuntimeError):
    """A failed winner may have written inputs that could not be restored: the next backend
    would write them a second time, so the call stops here and says what state they are in."""


class Writes:
    """Positions of the inputs the graph writes to, and how to keep and restore them."""

    def __init__(self, positions: Sequence[int], inputs: Sequence[Any]) -> None:
        self.positions = tuple(positions)
        size = sum(inputs[i].numel() * inputs[i].element_size() for i in self.positions)
        self.snapshots = size <= SNAPSHOT_BYTES
        self.bytes = size

    @classmethod
    def found(
        cls,
        before: Sequence[Any],
        after: dict[int, torch.Tensor],
        base: Mapping[int, int],
        changed: Set[int] = frozenset(),
    ) -> Writes | None:
        """From eager's run at selection on copies (`after`: each copy after the call; `base`:
        its version counter before): the inputs it wrote; None when it wrote none. An
        inference tensor keeps no counter: it is written when its values `changed`."""
        written = [
            i
            for i, t in after.items()
            if (i in changed if t.is_inference() else t._version != base.get(i, 0))
        ]
        return cls(written, before) if written else None

    def keep(self, args: Sequence[Any]) -> dict[int, Any]:
        """Before a call: copies of the written inputs (or their versions, past the cap)."""
        if self.snapshots:
            with torch.no_grad():
                return {i: args[i].clone() for i in self.positions}
        return {i: version(args[i]) for i in self.positions}

    def eager_inputs(self, args: Sequence[Any], kept: dict[int, Any]) -> list[Any]:
        """The args for an eager run as of before the call: fresh copies of what was kept."""
        values = list(args)
        for i, snap in kept.items():
            values[i] = snap.clone() if isinstance(snap, torch.Tensor) else args[i].clone()
        return values

    def restore(self, args: Sequence[Any], kept: dict[int, Any], who: str) -> None:
        """Undo what a failed call wrote; InputsWritten if it wrote what was not kept."""
        if self.snapshots:
            with torch.no_grad():
                for i, snap in kept.items():
                    args[i].copy_(snap)
            return
        moved = [i for i, seen in kept.items() if version(args[i]) != seen or seen == NO_VERSION]
        if moved:
            untouched = [i for i in self.positions if i not in moved]
            raise InputsWritten(
                f"{who} failed after writing input(s) {moved} of this graph "
                f"({self.bytes / 2**20:.0f} MiB of written inputs, past the "
                f"{SNAPSHOT_BYTES // 2**20} MiB snapshot cap): they hold its partial writes "
                f"and were not restored; input(s) {untouched} are as before the call. "
                "Re-create those inputs and call again (the chain has moved on)."
            )
