"""Concrete values for the symbolic sizes dynamo hands a backend (dynamic shapes).

With dynamic shapes, dynamo passes `SymInt`s (and `SymFloat`s, `SymBool`s) among a graph's
example inputs. Each backend compiles the graph as given, symbols and all; but when the
chain runs the graph itself (eager's reference, verification, timing), ATen needs numbers:
the hints dynamo holds for its symbols, which are this call's sizes. An unbacked symbol
(a data-dependent size) has no hint: the chain then cannot run the graph, and says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends.common.fx_utils import SYMBOLIC

_KINDS = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


@dataclass(frozen=True)
class Concrete:
    """The inputs to run the graph on (None when some symbol has no value) and why not."""

    values: tuple[Any, ...] | None
    why_not: str | None = None
    symbolic: int = 0  # how many inputs were symbolic


def concretize(example_inputs: Sequence[Any]) -> Concrete:
    """Each symbolic input replaced by its hint; tensors and plain values as they are."""
    values: list[Any] = []
    symbolic = 0
    for i, value in enumerate(example_inputs):
        if not isinstance(value, SYMBOLIC):
            values.append(value)
            continue
        symbolic += 1
        node = value.node
        if not node.has_hint():
            why = f"input {i} ({value}) is a data-dependent size with no value at compile time"
            return Concrete(None, why, symbolic)
        values.append(_KINDS[type(value)](node.hint))
    return Concrete(tuple(values), None, symbolic)
