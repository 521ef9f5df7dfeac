"""ONNX Runtime's CUDA graphs variant: `enable_cuda_graph` with IOBinding on fixed addresses.

ONNX Runtime captures a CUDA graph itself when the CUDA EP is created with
`enable_cuda_graph=1` (the TensorRT EP: `trt_cuda_graph_enable=1`): two regular runs
(its arena allocates then), a capture on the third, replays after, all on the calling
thread. It demands what a replay needs: every node on the GPU EP (else the session is
refused, which becomes `Unsupported` with ORT's words), static shapes, and inputs and
outputs bound through IOBinding at the same addresses on every run.

So this runner allocates one static torch tensor per ONNX input and output, binds them
once, and per call copies the caller's activations into the static inputs on torch's
stream, runs, and returns clones of the static outputs (an output held from one call is
never overwritten by the next replay). Parameters and buffers are ONNX initializers
inside the session: never fed, never copied. A frozen weight changed after export
raises `FrozenWeightChanged` (the chain then falls back to its next candidate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from backends.common.onnx_export import OnnxGraph, export_onnx
from backends.common.ort_session import element_type, session_options
from backends.cudagraphs import refuse_unless_graphable
from backends.errors import Unsupported
from backends.onnxruntime.facts import (
    check_inference,
    details,
    device_of,
    output_nodes,
    output_specs,
)
from backends.onnxruntime.frozen import snapshot_frozen
from backends.onnxruntime.runtime import FrozenWeightChanged, OutputSpec, check_fixed
from backends.onnxruntime.session import (
    Provider,
    create_session,
    default_providers,
    provider_names,
    user_stream,
)
from backends.registry import registry

GRAPH_SWITCH = {
    "CUDAExecutionProvider": "enable_cuda_graph",
    "TensorrtExecutionProvider": "trt_cuda_graph_enable",
}
WARM_RUNS = 3  # ORT: two regular runs (arena allocations), the capture on the third


def graphed_providers(providers: Sequence[Provider]) -> list[Provider]:
    """The providers with CUDA graph capture switched on for each EP that has the switch."""
    out: list[Provider] = []
    for provider in providers:
        name, opts = (provider, {}) if isinstance(provider, str) else provider
        out.append((name, {**opts, GRAPH_SWITCH[name]: "1"}) if name in GRAPH_SWITCH else provider)
    if not any(not isinstance(p, str) and p[0] in GRAPH_SWITCH for p in out):
        raise Unsupported(
            f"no execution provider that captures CUDA graphs among {provider_names(providers)}"
        )
    return out


class GraphedOrtRunner:
    """Feeds fixed-address inputs, replays ORT's captured graph, returns cloned outputs."""

    def __init__(
        self,
        graph: OnnxGraph,
        session: Any,
        example_inputs: Sequence[Any],
        outputs: Sequence[OutputSpec],
        single_output: bool,
        device: torch.device,
        stream: int | None,
        chain_details: dict[str, Any],
    ) -> None:
        self.graph, self.session = graph, session
        self._single, self._device, self._stream = single_output, device, stream
        self._frozen = snapshot_frozen(graph, example_inputs)
        self._scalars = tuple(graph.scalars.items())
        self._fixed = tuple(graph.fixed.items())
        self._binding = session.io_binding()
        index = device.index or 0
        self._inputs: list[tuple[int, torch.Tensor]] = []
        for name, i in zip(graph.input_names, graph.input_positions, strict=True):
            example = example_inputs[i]
            static = torch.empty(example.shape, dtype=example.dtype, device=device)
            self._binding.bind_input(
                name, "cuda", index, element_type(static.dtype), tuple(static.shape),
                static.data_ptr(),
            )  # fmt: skip
            self._inputs.append((i, static))
        self._outputs: list[torch.Tensor] = []
        self._formats = tuple(  # each clone in eager's layout: channels_last costs nothing more
            torch.channels_last if spec.channels_last else torch.contiguous_format
            for spec in outputs
        )
        for name, spec in zip(graph.output_names, outputs, strict=True):
            if spec.shape is None or spec.dtype is None:
                raise Unsupported(f"output {name} has no static shape to bind at a fixed address")
            out = torch.empty(spec.shape, dtype=spec.dtype, device=device)
            self._binding.bind_output(
                name, "cuda", index, element_type(out.dtype), tuple(out.shape), out.data_ptr()
            )
            self._outputs.append(out)
        self.chain_details = {
            **chain_details,
            "cuda_graphs": True,
            "inputs_copied_per_replay": len(self._inputs),
            "weights_as_initializers": graph.num_initializers,
        }

    @property
    def chain_payload(self) -> bytes:
        """The ONNX model this runner executes (weights included as initializers)."""
        return self.graph.model

    def _check_weights(self, args: Sequence[Any]) -> None:
        check_fixed(self._fixed, args)
        for i, tensor, version, ptr in self._frozen:
            arg = args[i]
            if arg is not tensor or arg._version != version or arg.data_ptr() != ptr:
                raise FrozenWeightChanged(
                    f"frozen weight (graph input {i}) changed after it was captured in a CUDA "
                    "graph; compile again to pick it up"
                )
        for i, number in self._scalars:
            if args[i].item() != number:
                raise FrozenWeightChanged(f"module constant (graph input {i}) changed")

    def __call__(self, *args: Any) -> Any:
        self._check_weights(args)
        for i, static in self._inputs:
            static.copy_(args[i])  # activations only: weights live in the session
        current = torch.cuda.current_stream(self._device)
        if current.cuda_stream != self._stream:
            current.synchronize()  # ORT runs on another stream: let the copies land first
        self.session.run_with_iobinding(self._binding)  # ORT syncs its stream on return
        outs = tuple(
            o.clone(memory_format=f) for o, f in zip(self._outputs, self._formats, strict=True)
        )
        return outs[0] if self._single else outs


@registry.graphed_variant("onnxruntime")
def onnxruntime_graphed(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    *,
    providers: Sequence[Provider] | None = None,
    on_weight_change: str = "reexport",
    **session: Any,
) -> GraphedOrtRunner:
    """The ONNX Runtime backend's export, run as a CUDA graph ORT captures itself.

    Its options are the backend's (checked there); `session` holds those of the session.
    """
    del on_weight_change  # a captured graph cannot re-export: a changed weight always raises
    refuse_unless_graphable(gm, example_inputs)
    check_inference(example_inputs)
    device = device_of(example_inputs)
    outputs, single = output_nodes(gm)
    specs = output_specs(outputs)
    chosen = graphed_providers(
        list(providers) if providers is not None else default_providers(device)
    )
    options = session_options(**session)
    graph = export_onnx(gm, example_inputs, fix_ints=True)
    session = create_graphed_session(graph.model, options, chosen)
    runner = GraphedOrtRunner(
        graph,
        session,
        example_inputs,
        specs,
        single,
        device,
        user_stream(chosen),
        details(graph, chosen, session),
    )
    for _ in range(WARM_RUNS):  # regular runs, then the capture: replays from here on
        runner(*example_inputs)
    torch.cuda.synchronize(device)
    return runner


def create_graphed_session(model: bytes, options: Any, providers: Sequence[Provider]) -> Any:
    """A session with graph capture on; ORT's refusal of capture becomes Unsupported."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    try:
        return create_session(model, options, providers)
    except state.Fail as error:  # e.g. "nodes not partitioned to the CUDA EP"
        text = str(error)
        if "graph" not in text.lower():
            raise
        line = next((s for s in text.splitlines() if s.strip()), type(error).__name__)
        raise Unsupported(f"onnxruntime refused CUDA graphs: {line[:200]}", detail=text) from error
