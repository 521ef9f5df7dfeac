"""The tensors an ONNX Runtime session baked in as initializers, as they were at export:
their identity and version counter, to notice a later change (a user's update to refresh
for, or a write the session would not see)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from backends.common.onnx_export import OnnxGraph
from backends.errors import Unsupported

_version = torch._C.TensorBase._version.__get__  # the C getter, mapped over many tensors


@dataclass(frozen=True)
class Frozen:
    """The tensors baked into the model as initializers, as they were at export."""

    positions: tuple[int, ...]
    tensors: tuple[torch.Tensor, ...]
    versions: tuple[int, ...]

    @classmethod
    def snapshot(cls, positions: Sequence[int], inputs: Sequence[object]) -> Frozen:
        """The frozen tensors among `inputs`, their identity and version now."""
        kept = [i for i in positions if isinstance(inputs[i], torch.Tensor)]
        tensors = tuple(inputs[i] for i in kept)
        inference = [i for i, t in zip(kept, tensors, strict=True) if t.is_inference()]
        if inference:  # no version counter: a later write to them could not be seen
            raise Unsupported(
                f"weights {inference[:3]} are inference tensors (the model was built under "
                "torch.inference_mode()): frozen into the model, a change to them could not "
                "be seen; build the model outside inference_mode"
            )
        return cls(tuple(kept), tensors, tuple(map(_version, tensors)))  # type: ignore[arg-type]

    def getter(self) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """args -> the frozen positions' arguments, as a tuple (one C call)."""
        if not self.positions:
            return lambda args: ()
        get = operator.itemgetter(*self.positions)
        if len(self.positions) == 1:
            return lambda args: (get(args),)
        return get

    def changed(self, got: Sequence[Any]) -> tuple[int, str] | None:
        """The first frozen input whose values may differ from the exported ones, and how."""
        every = self.all_changed(got)
        return every[0] if every else None

    def all_changed(self, got: Sequence[Any]) -> list[tuple[int, str]]:
        """Every frozen input whose values may differ from the exported ones, and how."""
        found: list[tuple[int, str]] = []
        for i, tensor, version, arg in zip(
            self.positions, self.tensors, self.versions, got, strict=True
        ):
            if _version(tensor) != version:
                found.append((i, "written in place"))
                continue
            if arg is tensor:
                continue
            same = (
                isinstance(arg, torch.Tensor)
                and arg.shape == tensor.shape
                and arg.dtype == tensor.dtype
                and arg.device == tensor.device
                and torch.equal(arg, tensor)
            )
            if not same:
                found.append((i, "replaced by a different tensor"))
        return found


def snapshot_frozen(graph: OnnxGraph, inputs: Sequence[object]) -> Frozen:
    """Identity and version of every frozen input, to notice later changes."""
    return Frozen.snapshot(graph.frozen, inputs)
