"""Outputs handed out twice: a winner that returns memory it returned at an earlier call.

A backend that writes every call's answer into one buffer returns right values each time,
and overwrites every answer the caller still holds (a static output buffer, an output
allocation "reused"). Where eager returns fresh memory, an output in the memory (the
storage) of an output returned at one of the last `RECENT` calls, and still alive (the caller
holds it), is such a write: the winner is demoted at that call, so one earlier answer (the
one it just overwrote) can have been damaged; the selection-time check
(`chain.judge.verify.reused`) catches a backend that does so from its second call. Storages,
not data pointers: the fast path has read them for the aliasing check already, and a view at
another offset of a buffer the caller holds an answer in is that buffer too.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

from chain.run.watch.expect import _storage

RECENT = 4  # calls whose outputs are remembered (weakly): a buffer in turn among a few


class Reuse:
    """The fresh outputs of the last few calls (data pointers and weak references)."""

    __slots__ = ("positions", "recent")

    def __init__(self, positions: Sequence[int]) -> None:
        """`positions`: the flat outputs eager returns in fresh memory (non-empty ones)."""
        self.positions = tuple(positions)
        self.recent: deque[tuple[int, dict[int, list[tuple[int, weakref.ref[Any]]]]]] = deque(
            maxlen=RECENT
        )

    def check(self, n: int, leaves: Sequence[Any]) -> str | None:
        """Why call `n`'s outputs are memory an earlier call returned (None: they are not);
        then remembers them. Call `n` checked again (the general path after the fast path)
        is compared with the calls before it, and remembered once."""
        return self.seen(n, leaves, {i: _storage(leaves[i]) for i in self.positions})

    def seen(self, n: int, leaves: Sequence[Any], storages: dict[int, int]) -> str | None:
        """`check` with the outputs' storages read already (`storages[i]`: output i's, 0 when
        empty). Per earlier call one set intersection of storages: a weak reference is read
        only where two meet."""
        now: dict[int, list[tuple[int, weakref.ref[Any]]]] = {}
        for i in self.positions:
            if ptr := storages[i]:  # two outputs in one storage (a view): both kept
                now.setdefault(ptr, []).append((i, weakref.ref(leaves[i])))
        recent = self.recent
        earlier = [outputs for call, outputs in tuple(recent) if call != n]
        if not recent or recent[-1][0] != n:
            recent.append((n, now))
        for outputs in earlier:
            for ptr in outputs.keys() & now.keys():
                for j, ref in outputs[ptr]:
                    if (held := ref()) is not None and held.numel():
                        return (
                            f"output {now[ptr][0][0]} is the memory of output {j} of an earlier "
                            "call, which the caller still holds: that answer was overwritten"
                        )
        return None
