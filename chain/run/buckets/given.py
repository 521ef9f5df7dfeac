"""What the buckets are given: the guard as they see it (`General`: the general path now in
use) and the chain's means to build a bucket (`Selection`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import fx

from backends.registry import Backend
from chain.judge.speed import SpeedRules
from chain.report.records import Attempt
from chain.run.watch import Watch
from chain.select.attempt import Reference

Fn = Callable[..., Any]


class General(Protocol):
    """The guard, as the buckets see it: the general path now in use."""

    @property
    def fn(self) -> Fn: ...

    @property
    def winner(self) -> str: ...

    def bucket_watch(self, winner: str, fn: Fn) -> Watch | None:
        """The run-time checks for a bucket won by `winner`, served by `fn` (as for a general
        winner)."""
        ...


@dataclass(frozen=True)
class Selection:
    """The chain's means to build a bucket: eager's reference on concrete inputs, one
    attempt of a backend, the fixed-shape candidates for a general winner, the speed rules,
    strictness, and a hook that saves the report."""

    reference: Callable[[fx.GraphModule, list[Any]], tuple[Reference, list[str]]]
    attempt: Callable[[Backend, fx.GraphModule, list[Any], Reference], tuple[Attempt, Fn | None]]
    candidates: Callable[[str], list[Backend]]
    speed: SpeedRules
    strict: bool
    saved: Callable[[], None]
    # stores the graph's bucket decisions with its remembered decision (chain.memory)
    kept: Callable[[list[dict[str, Any]]], None] | None = None
