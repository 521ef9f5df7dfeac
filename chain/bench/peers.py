"""Peer columns the chain is held against: torch.compile's reduce-overhead, ORT on the whole model.

- `inductor[reduce-overhead]`: `torch.compile(model, mode="reduce-overhead")`, inductor
  with its CUDA graphs (on CPU inductor skips the graphs and runs as usual).
- `onnxruntime-direct`: ONNX Runtime on `torch.onnx.export(model, dynamo=True)` of the
  whole model, no dynamo and no chain: the CPU EP with numpy views on CPU, the CUDA EP
  with IOBinding on torch's memory (on torch's stream) on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from backends.common.ort_session import element_type, session_options
from backends.common.quiet import quiet
from backends.onnxruntime.session import default_providers
from backends.registry import lookup_backend
from chain.bench.harness import Candidate, Compiled

REDUCE_OVERHEAD = "inductor[reduce-overhead]"
ORT_DIRECT = "onnxruntime-direct"
PEERS = (REDUCE_OVERHEAD, ORT_DIRECT)


def reduce_overhead() -> Candidate:
    """torch.compile with mode="reduce-overhead", counting nothing: torch's own default."""
    return Candidate(
        REDUCE_OVERHEAD,
        "peer",
        lambda model: Compiled(torch.compile(model, mode="reduce-overhead")),
    )


class DirectSession:
    """Runs an ORT session of the exported whole model on torch tensors (CPU or CUDA)."""

    def __init__(self, model: nn.Module, threads: int | None) -> None:
        self.model = model
        self.threads = threads
        self.session: Any = None

    def _build(self, inputs: Sequence[torch.Tensor]) -> None:
        import onnxruntime as ort

        if inputs[0].device.type == "cuda":  # Unsupported, saying why, without ORT's CUDA EP
            default_providers(inputs[0].device)
        with quiet():
            program = torch.onnx.export(
                self.model, tuple(inputs), dynamo=True, verbose=False, report=False
            )
        device = inputs[0].device
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.type == "cuda":
            stream = torch.cuda.current_stream(device).cuda_stream
            cuda = {
                "device_id": str(device.index or 0),
                "has_user_compute_stream": "1",
                "user_compute_stream": str(stream),
            }
            providers.insert(0, ("CUDAExecutionProvider", cuda))
        options = session_options("all", self.threads, False)
        self.session = ort.InferenceSession(
            program.model_proto.SerializeToString(), options, providers=providers
        )
        self.names = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.device = device

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.session is None:
            self._build(inputs)
        if self.device.type != "cuda":
            feeds = {n: x.numpy() for n, x in zip(self.names, inputs, strict=True)}
            outs = [torch.from_numpy(o) for o in self.session.run(self.outputs, feeds)]
        else:
            outs = self._run_cuda(inputs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run_cuda(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        binding = self.session.io_binding()
        index = self.device.index or 0
        keep = [x.contiguous() for x in inputs]
        for name, x in zip(self.names, keep, strict=True):
            binding.bind_input(
                name, "cuda", index, element_type(x.dtype), tuple(x.shape), x.data_ptr()
            )
        for name in self.outputs:
            binding.bind_output(name, "cuda", index)
        self.session.run_with_iobinding(binding)
        return [torch.from_dlpack(v) for v in binding.get_outputs()]


def onnxruntime_direct(threads: int | None) -> Candidate:
    """ONNX Runtime on the directly exported whole model (built at the first call)."""
    if reason := lookup_backend("onnxruntime").available():
        return Candidate(ORT_DIRECT, "peer", None, "unavailable", reason)
    make: Callable[[nn.Module], Compiled] = lambda model: Compiled(DirectSession(model, threads))  # noqa: E731
    return Candidate(ORT_DIRECT, "peer", make)


def peer_candidates(threads: int | None) -> list[Candidate]:
    """The peer columns, in the order the table shows them."""
    return [reduce_overhead(), onnxruntime_direct(threads)]
