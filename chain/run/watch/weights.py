"""The weights a winner reads, between calls and across them: updates are the user's,
writes during the winner's call are damage.

Weights belong to the user: a fine-tuning step, a LoRA merge (`p.add_(delta)`), an EMA
`copy_`, `load_state_dict` or a swapped `nn.Parameter` between two calls is an update, and
the chain serves it (a backend that froze the weights refreshes before it answers). Only
a change made while the winner's call runs is damage.

Every call reads the weights' identities and version counters before the winner runs
(two C-level maps; `same`): a difference is an update, seen before the answer. The
re-verified calls also read the fingerprints of one part of the weights before and after
the winner's call (`across`): values that change across the call, or counters that move,
are damage. Writes that bypass the counters (`.data`, raw pointers) between calls show as
a fingerprint that moved *before* a re-verified call: damage too, since nothing tells
them from a winner's call in flight on another thread; only weights that keep no
counter (inference tensors) take such a move as the user's update.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import torch

from backends.common.versions import version
from chain.select.isolation import (
    SAMPLES,
    Fingerprint,
    WeightsDamaged,
    _groups,
    _joined,
)

_version = torch._C.TensorBase._version.__get__  # the C getter, mapped over the weights

__all__ = ["SAMPLES", "Weights"]


class Weights:
    """One graph's weights (positions among its inputs) as the chain last saw them."""

    def __init__(
        self, positions: Sequence[int], names: Sequence[str], args: Sequence[Any], parts: int
    ) -> None:
        self.positions = tuple(positions)
        self.names = dict(zip(self.positions, names, strict=True))
        self.parts = parts
        self._get = operator.itemgetter(*self.positions) if len(self.positions) > 1 else None
        self.lock = threading.RLock()  # one update (or baseline comparison) at a time
        self.turn = 0
        self.epoch = 0  # baselines taken: an update seen during a call voids its verdict
        self._take(args)

    def _take(self, args: Sequence[Any]) -> None:
        """Baseline: `args`' weights, their counters and fingerprints."""
        self.epoch = getattr(self, "epoch", 0) + 1
        tensors = self._got(args)
        self.tensors = tensors
        self.inference = any(t.is_inference() for t in tensors)
        self.versions = self._versions(tensors)
        self.prints = {i: Fingerprint.of(t) for i, t in zip(self.positions, tensors, strict=True)}
        floating = [t for t in tensors if t.is_floating_point()]
        self.groups: list[tuple[torch.Tensor, ...]] = []
        if floating and len({t.device for t in floating}) == 1:
            self.groups = _groups(floating, self.parts)
        self.group_prints = [_joined(g) for g in self.groups]

    def _got(self, args: Sequence[Any]) -> tuple[Any, ...]:
        if self._get is not None:
            return tuple(self._get(args))
        return tuple(args[i] for i in self.positions)

    def _versions(self, tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
        if self.inference:
            return tuple(version(t) for t in tensors)
        return tuple(map(_version, tensors))

    def same(self, args: Sequence[Any]) -> bool:
        """Whether `args` hold the weights as last seen: the same tensors, counters unmoved
        (every call, before the winner runs)."""
        got = self._get(args) if self._get is not None else self._got(args)
        if not all(map(operator.is_, got, self.tensors)):
            return False
        if self.inference:
            return self._versions(got) == self.versions
        return tuple(map(_version, got)) == self.versions

    def changed(self, args: Sequence[Any]) -> list[int]:
        """The positions whose tensor or counter differs from the baseline."""
        got = self._got(args)
        now = self._versions(got)
        return [
            i
            for i, t, seen, v, was in zip(
                self.positions, got, self.tensors, now, self.versions, strict=True
            )
            if t is not seen or v != was
        ]

    def rebase(self, args: Sequence[Any]) -> None:
        """The weights in `args` are the user's from now on (after an update)."""
        with self.lock:
            self._take(args)

    def before(self, args: Sequence[Any], who: str) -> tuple[int, torch.Tensor | None, bool, int]:
        """Before a re-verified call: (the part whose fingerprint is compared, its print now,
        whether it moved since the baseline with no counter moving: for inference tensors,
        which keep no counter, an update taken as the user's and made the baseline).
        WeightsDamaged for such a move in weights that keep counters: nobody can say whose
        it is (a `.data` write, or a winner's call in flight on another thread), and every
        update the user makes with tensor ops (optimizer steps, `load_state_dict`, `add_`,
        `copy_`, a swapped Parameter) moves a counter or the identity."""
        with self.lock:  # not halfway through another call's new baseline
            if not self.groups:
                return -1, None, False, self.epoch
            k, self.turn = self.turn, (self.turn + 1) % len(self.groups)
            now = _joined(self.groups[k])
            quiet = not torch.equal(now, self.group_prints[k])
            if quiet and not self.inference:
                raise self.damaged(args, f"{who} (or a `.data` write between calls)", [])
            if quiet:
                self.rebase(args)
                now = self.group_prints[k] if k < len(self.group_prints) else now
            return k, now, quiet, self.epoch

    def across(
        self, args: Sequence[Any], token: tuple[int, torch.Tensor | None, bool, int], who: str
    ) -> str | None:
        """After the winner's re-verified call: None when it left the weights as they were;
        a reason (values unchanged, a counter moved) to demote it; WeightsDamaged when their
        values changed (no copy is kept to restore them)."""
        with self.lock:  # against another call's new baseline
            k, print_before, _, epoch = token
            if epoch != self.epoch:  # another call saw an update meanwhile: not this call's doing
                return None
            moved = self.changed(args)
            values = moved and any(
                not Fingerprint.of(args[i]).same_values(self.prints[i]) for i in moved
            )
            if k >= 0 and print_before is not None and k < len(self.groups):
                values = values or not torch.equal(_joined(self.groups[k]), print_before)
            if not moved and not values:
                return None
            if not values:
                named = ", ".join(self.names[i] for i in moved)
                self.rebase(args)
                return f"changed weight {named} in place during its call (values unchanged)"
            raise self.damaged(args, who, moved)

    def damaged(self, args: Sequence[Any], who: str, moved: Sequence[int]) -> WeightsDamaged:
        """The error for weights whose values `who` changed during its call."""
        changed = [
            i for i in self.positions if not Fingerprint.of(args[i]).same_values(self.prints[i])
        ] or list(moved)
        named = ", ".join(self.names[i] for i in changed)
        after = {i: (args[i], version(args[i])) for i in changed}
        prints = dict(self.prints)

        def intact() -> bool:
            """Whole again: the old values back, or the user wrote them since (a counter
            moved: the chain's own restores write behind the counters). Values that moved
            with no counter are not enough: a winner's call in flight on another thread may
            be writing them."""
            return all(
                version(t) != v or Fingerprint.of(t).same_values(prints[i])
                for i, (t, v) in after.items()
            )

        return WeightsDamaged(
            f"{who} changed weight(s) {named} in place during its call, and the chain kept "
            "no copy to restore them: the model's weights are no longer what they were; "
            "reload them (or load new ones)",
            intact=intact,
        )
