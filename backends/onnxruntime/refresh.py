"""New weights for a built ONNX Runtime session, without exporting again where possible.

The exporter bakes a graph's parameters and buffers into the model as initializers named
`_frozen_<position>`; its optimizer folds some of them into others (a linear layer's
transposed weight, BERT's attention projections), and those no longer exist by name. When
every weight that changed since the export still has its initializer, a new session is
built from the same model bytes with those initializers overridden
(`SessionOptions.add_initializer`: ORT folds and pre-packs them as it did the exported
ones), which skips `torch.onnx.export`; otherwise the graph is exported again. The runner
measures both as they happen and takes the cheaper (`Refresher.prefer_update`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from backends.common.onnx_export import OnnxGraph

FROZEN_NAME = re.compile(r"_frozen_(\d+)")


def initializer_positions(graph: OnnxGraph) -> dict[int, str]:
    """Frozen input position -> the initializer that still holds it by name (unfolded)."""
    import onnx  # here: discovering the backends imports no compiler library

    proto = onnx.load_from_string(graph.model)
    frozen = set(graph.frozen)
    found: dict[int, str] = {}
    for init in proto.graph.initializer:
        match = FROZEN_NAME.fullmatch(init.name)
        if match is not None and int(match.group(1)) in frozen:
            found[int(match.group(1))] = init.name
    return found


def cpu_values(tensors: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """Private CPU copies of `tensors` as numpy arrays: ORT reads an added initializer's
    memory in place, so it must not be the caller's (a later in-place write would reach
    the weights ORT did not pre-pack, and not the others)."""
    with torch.no_grad():
        return [t.detach().to("cpu", copy=True).contiguous().numpy() for t in tensors]


@dataclass
class Refresher:
    """How a runner's session gets new weights: initializer updates while they can serve,
    re-exports otherwise, whichever measured cheaper."""

    mapped: dict[int, str]
    dirty: set[int] = field(default_factory=set)  # positions changed since the last export
    update_s: float | None = None  # the latest initializer update's time
    reexport_s: float | None = None  # the latest export + session build's time

    def can_update(self, changed: Sequence[int]) -> bool:
        """Whether every weight changed since the export still has its initializer."""
        return set(changed) | self.dirty <= set(self.mapped)

    def prefer_update(self) -> bool:
        """The initializer update, unless one was measured slower than a re-export."""
        if self.update_s is None or self.reexport_s is None:
            return True
        return self.update_s <= self.reexport_s

    def overrides(self, inputs: Sequence[Any]) -> tuple[list[str], list[np.ndarray]]:
        """The names and current values of every mapped initializer (all of them: the
        model bytes hold the values of the export)."""
        names = list(self.mapped.values())
        values = cpu_values([inputs[i] for i in self.mapped])
        return names, values


def session_with(
    model: bytes,
    make_options: Callable[[], Any],
    providers: Sequence[Any],
    names: Sequence[str],
    values: Sequence[np.ndarray],
) -> tuple[Any, tuple[Any, ...]]:
    """A session of `model` whose initializers `names` hold `values`; with the OrtValues,
    which must outlive the session."""
    import onnxruntime as ort

    from backends.onnxruntime.session import create_session

    options = make_options()
    kept = tuple(ort.OrtValue.ortvalue_from_numpy(v) for v in values)
    for name, value in zip(names, kept, strict=True):
        options.add_initializer(name, value)
    return create_session(model, options, providers), kept
