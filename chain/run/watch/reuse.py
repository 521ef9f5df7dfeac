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
    """The fresh outputs of the last few calls, by storage: weak references, so that an answer
    the caller has dropped is no longer held against the winner."""

    __slots__ = ("held", "positions", "recent")

    def __init__(self, positions: Sequence[int]) -> None:
        """`positions`: the flat outputs eager returns in fresh memory (non-empty ones)."""
        self.positions = tuple(positions)
        self.recent: deque[tuple[int, tuple[int, ...]]] = deque()  # (call, its storages)
        # storage -> (call, output, weak reference) of the last RECENT calls' outputs in it
        self.held: dict[int, list[tuple[int, int, weakref.ref[Any]]]] = {}

    def check(self, n: int, leaves: Sequence[Any]) -> str | None:
        """Why call `n`'s outputs are memory an earlier call returned (None: they are not);
        then remembers them. Call `n` checked again (the general path after the fast path)
        is compared with the calls before it, and remembered once."""
        return self.seen(n, leaves, {i: _storage(leaves[i]) for i in self.positions})

    def seen(self, n: int, leaves: Sequence[Any], storages: dict[int, int]) -> str | None:
        """`check` with the outputs' storages read already (`storages[i]`: output i's, 0 when
        empty): one dict lookup per output; an earlier answer found dropped is forgotten."""
        held, reason, mine = self.held, None, []
        for i in self.positions:
            if not (ptr := storages[i]):
                continue
            mine.append((ptr, i))
            earlier = held.get(ptr)
            if earlier is None or reason is not None:
                continue
            alive = [e for e in earlier if e[0] == n or _alive(e[2])]
            if len(alive) < len(earlier):
                held[ptr] = alive
            j = next((j for call, j, _ in alive if call != n), None)
            if j is not None:
                reason = (
                    f"output {i} is the memory of output {j} of an earlier call, "
                    "which the caller still holds: that answer was overwritten"
                )
        recent = self.recent
        if not recent or recent[-1][0] != n:  # remembered once
            for ptr, i in mine:
                held.setdefault(ptr, []).append((n, i, weakref.ref(leaves[i])))
            recent.append((n, tuple(ptr for ptr, _ in mine)))
            if len(recent) > RECENT:
                old, ptrs = recent.popleft()
                for ptr in ptrs:
                    kept = [e for e in held.get(ptr, ()) if e[0] != old]
                    if kept:
                        held[ptr] = kept
                    else:
                        held.pop(ptr, None)
        return reason


def _alive(ref: weakref.ref[Any]) -> bool:
    """Whether the caller still holds an earlier answer (an empty one holds no memory)."""
    held = ref()
    return held is not None and bool(held.numel())
