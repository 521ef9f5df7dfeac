"""Run an ONNX Runtime session on torch tensors without copying them.

CPU: inputs go in as numpy views of the torch tensors, outputs come back as numpy arrays
wrapped by `torch.from_numpy` (no copy either way). CUDA: IOBinding binds torch's memory
by pointer; outputs of known shape are allocated by torch and bound, the others are
allocated by ORT and wrapped through DLPack; the session runs on torch's current stream
(the CUDA EP is created with it as its user compute stream; called from another stream,
the runner first waits for that stream's pending work).

Frozen weights (ONNX initializers) are checked on every call: same tensor object, same
`_version` (bumped by in-place writes), same storage. If the user changed one, the runner
re-exports (`on_weight_change="reexport"`, the default) or raises `FrozenWeightChanged`
(`"raise"`: a chain then falls back to its next candidate, which reads the new weights).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from backends.common.onnx_export import OnnxGraph

log = logging.getLogger(__name__)


class FrozenWeightChanged(RuntimeError):
    """A parameter or buffer baked into the ONNX model changed after export."""


@dataclass(frozen=True)
class OutputSpec:
    """What torch allocates for a bound output on CUDA: None shape when not static."""

    shape: tuple[int, ...] | None
    dtype: torch.dtype | None


@dataclass(frozen=True)
class Compiled:
    """One export + session: what a weight change replaces as a whole."""

    graph: OnnxGraph
    session: Any
    frozen: tuple[tuple[int, torch.Tensor, int, int], ...]  # position, tensor, version, ptr


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype ORT binds for a torch dtype (bfloat16 has none)."""
    return torch.empty((), dtype=dtype).numpy().dtype


def snapshot_frozen(
    graph: OnnxGraph, inputs: Sequence[object]
) -> tuple[tuple[int, torch.Tensor, int, int], ...]:
    """Identity, version and storage of every frozen input, to notice later changes."""
    out = []
    for i in graph.frozen:
        t = inputs[i]
        if isinstance(t, torch.Tensor):
            out.append((i, t, t._version, t.data_ptr()))
    return tuple(out)


class OrtRunner:
    """The compiled callable: feeds the session, checks frozen weights, returns torch tensors."""

    def __init__(
        self,
        compiled: Compiled,
        *,
        device: torch.device,
        outputs: Sequence[OutputSpec],
        single_output: bool,
        rebuild: Callable[[Sequence[object]], Compiled] | None,
        on_weight_change: str = "reexport",
        details: dict[str, Any] | None = None,
        stream: int | None = None,
    ) -> None:
        if on_weight_change not in ("reexport", "raise"):
            raise ValueError(f"on_weight_change {on_weight_change!r}; valid: reexport, raise")
        self._device = device
        self._outputs = tuple(outputs)
        self._single = single_output
        self._rebuild = rebuild
        self._on_change = on_weight_change
        self._stream = stream
        self.chain_details: dict[str, Any] = dict(details or {})
        self.reexports = 0
        self._use(compiled)

    def _use(self, compiled: Compiled) -> None:
        self._compiled = compiled
        graph = compiled.graph
        self._feeds = tuple(zip(graph.input_names, graph.input_positions, strict=True))
        self._names = list(graph.output_names)
        self._scalars = tuple(graph.scalars.items())
        if self._device.type == "cuda":
            self._binding = compiled.session.io_binding()

    @property
    def chain_payload(self) -> bytes:
        """The ONNX model this runner executes (weights included as initializers)."""
        return self._compiled.graph.model

    @property
    def graph(self) -> OnnxGraph:
        """The exported graph this runner executes (export reads its input mapping)."""
        return self._compiled.graph

    @property
    def session(self) -> Any:
        return self._compiled.session

    def feeds(self, args: Sequence[Any]) -> dict[str, np.ndarray]:
        """CPU inputs as numpy views sharing memory with the torch tensors."""
        return {name: args[i].numpy() for name, i in self._feeds}

    def __call__(self, *args: Any) -> Any:
        for i, tensor, version, ptr in self._compiled.frozen:
            arg = args[i]
            if arg is not tensor or arg._version != version or arg.data_ptr() != ptr:
                self._weights_changed(i, args)
                break
        for i, number in self._scalars:
            if args[i].item() != number:
                self._weights_changed(i, args)
                break
        if self._device.type == "cuda":
            outs = self._run_cuda(args)
        else:
            outs = [
                torch.from_numpy(o)
                for o in self._compiled.session.run(self._names, self.feeds(args))
            ]
        return outs[0] if self._single else tuple(outs)

    def _weights_changed(self, position: int, args: Sequence[Any]) -> None:
        message = (
            f"frozen weight (graph input {position}) changed after export "
            "(in-place write or new tensor)"
        )
        if self._on_change == "raise" or self._rebuild is None:
            raise FrozenWeightChanged(message + "; compile again to pick it up")
        log.warning("%s: re-exporting the ONNX model", message)
        self._use(self._rebuild(args))
        self.reexports += 1
        self.chain_details["reexports"] = self.reexports

    def _run_cuda(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """IOBinding on torch memory; outputs of static shape allocated by torch."""
        binding = self._binding
        index = self._device.index or 0
        keep = []
        for name, i in self._feeds:
            t = args[i].contiguous()
            keep.append(t)
            binding.bind_input(
                name, "cuda", index, numpy_dtype(t.dtype), tuple(t.shape), t.data_ptr()
            )
        allocated: list[torch.Tensor | None] = []
        for name, spec in zip(self._names, self._outputs, strict=True):
            if spec.shape is None or spec.dtype is None:
                binding.bind_output(name, "cuda", index)
                allocated.append(None)
                continue
            out = torch.empty(spec.shape, dtype=spec.dtype, device=self._device)
            binding.bind_output(
                name, "cuda", index, numpy_dtype(spec.dtype), spec.shape, out.data_ptr()
            )
            allocated.append(out)
        current = torch.cuda.current_stream(self._device)
        if current.cuda_stream != self._stream:
            current.synchronize()  # ORT runs on another stream: let torch's writes land first
        self._compiled.session.run_with_iobinding(binding)  # ORT syncs its stream on return
        if all(a is not None for a in allocated):
            return allocated  # type: ignore[return-value]
        ort_values = binding.get_outputs()
        return [
            a if a is not None else torch.from_dlpack(v)
            for a, v in zip(allocated, ort_values, strict=True)
        ]
