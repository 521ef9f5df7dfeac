"""Outputs handed out twice: a winner that returns memory it returned at an earlier call.

A backend that writes every call's answer into one buffer returns right values each time,
and overwrites every answer the caller still holds (a static output buffer, an output
allocation "reused"). Where eager returns fresh memory, an output whose memory is that of an
output returned at one of the last `RECENT` calls, and still alive (the caller holds it), is
such a write: the winner is demoted at that call, so one earlier answer (the one it just
overwrote) can have been damaged; the selection-time check (`chain.judge.verify.reused`) catches
a backend that does so from its second call.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

RECENT = 4  # calls whose outputs are remembered (weakly): a buffer in turn among a few


class Reuse:
    """The fresh outputs of the last few calls (weak references and data pointers)."""

    __slots__ = ("positions", "recent")

    def __init__(self, positions: Sequence[int]) -> None:
        """`positions`: the flat outputs eager returns in fresh memory (non-empty ones)."""
        self.positions = tuple(positions)
        self.recent: deque[tuple[int, tuple[tuple[int, int, weakref.ref[Any]], ...]]] = deque(
            maxlen=RECENT
        )

    def check(self, n: int, leaves: Sequence[Any]) -> str | None:
        """Why call `n`'s outputs are memory an earlier call returned (None: they are not);
        then remembers them. Call `n` checked again (the general path after the fast path)
        is compared with the calls before it, and remembered once."""
        now = tuple(
            (i, t.data_ptr(), weakref.ref(t)) for i in self.positions if (t := leaves[i]).numel()
        )
        earlier = [outputs for call, outputs in tuple(self.recent) if call != n]
        if not self.recent or self.recent[-1][0] != n:
            self.recent.append((n, now))
        ptrs = {ptr: i for i, ptr, _ in now}
        for outputs in earlier:
            for j, ptr, ref in outputs:
                if ptr in ptrs and (held := ref()) is not None and held.numel():
                    return (
                        f"output {ptrs[ptr]} is the memory of output {j} of an earlier call, "
                        "which the caller still holds: that answer was overwritten"
                    )
        return None
