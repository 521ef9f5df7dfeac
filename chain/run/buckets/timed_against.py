"""Which general path each shape's bucket was timed against: the guard's callable of that
moment, counted by its switches (`GuardedGraph.switch`: inductor's package handed over, a
promotion by the run-time race, a fallback), and whether it ran inductor's package. A
bucket serves only while the general path is the one it was timed against."""

from __future__ import annotations

from typing import Any

from chain.run.buckets.remembered import from_package
from chain.run.buckets.shapes import Key


class TimedAgainst:
    """Per shape: the general path's switch count and form (package or not) when timed."""

    def __init__(self) -> None:
        self.switches = 0
        self.switched_to = ""  # the general winner since the last switch
        self._keys: dict[Key, tuple[int, bool]] = {}

    def switched(self, winner: str) -> None:
        """The general path now runs `winner`'s callable (a plain counter: no lock)."""
        self.switched_to = winner
        self.switches += 1

    def timing(self, key: Key, general_fn: Any) -> None:
        """`key`'s bucket is timed now, against `general_fn`."""
        self._keys[key] = (self.switches, from_package(general_fn))

    def stale(self, key: Key) -> bool:
        """Whether the general path switched since `key`'s bucket was timed."""
        timed = self._keys.get(key)
        return timed is None or timed[0] != self.switches

    def package(self, key: Key) -> bool:
        """Whether `key`'s bucket was timed against inductor's package."""
        timed = self._keys.get(key)
        return timed is not None and timed[1]

    def forget(self, key: Key) -> None:
        self._keys.pop(key, None)
