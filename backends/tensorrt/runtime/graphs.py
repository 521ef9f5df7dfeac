"""TensorRT's CUDA graphs variant: the compiled graph (engines and PyTorch parts) replayed.

As Torch-TensorRT's whole-graph cudagraphs mode does, the engines are enqueued on torch's
current stream (`execute_async_v3`), so a capture on torch's stream records them with the
PyTorch ops around them; here the capture, warm-up, memory pool and static inputs are
torch's cudagraph trees (`backends.common.cudagraph_static.graph_callable`). Parameters
and buffers are static inputs, read in place. Weights frozen into an engine are checked
before each replay (a replay runs no Python inside the graph): a changed one raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from backends.common.cudagraph_static import graph_callable, static_input_positions
from backends.cudagraphs import capture, refuse_unless_graphable
from backends.registry import registry
from backends.tensorrt.backend import tensorrt_backend


class FrozenCheck:
    """Raises before a replay when a weight frozen into an engine was replaced or written."""

    def __init__(self, frozen: tuple[int, ...], example_inputs: list[Any]) -> None:
        self.expected = tuple(
            (i, id(example_inputs[i]), int(example_inputs[i]._version)) for i in frozen
        )

    def __call__(self, args: tuple[Any, ...]) -> None:
        for i, ident, version in self.expected:
            if id(args[i]) != ident or int(args[i]._version) != version:
                raise RuntimeError(
                    f"weight input {i} changed after TensorRT froze it into an engine; "
                    "recompile (torch._dynamo.reset()) to rebuild"
                )


@registry.graphed_variant("tensorrt")
def tensorrt_graphed(gm: fx.GraphModule, example_inputs: list[torch.Tensor], **options: Any) -> Any:
    """The TensorRT backend's compiled graph, captured and replayed on torch's stream."""
    refuse_unless_graphable(gm, example_inputs)
    compiled = tensorrt_backend.compiler(gm, example_inputs, **options)
    static = static_input_positions(gm, example_inputs)
    replay, details = capture(
        lambda: graph_callable(compiled, example_inputs, static), gm, example_inputs
    )
    check = FrozenCheck(tuple(getattr(compiled, "frozen", ())), example_inputs)

    def run(*args: Any) -> Any:
        check(args)
        return replay(*args)

    run.chain_details = {  # type: ignore[attr-defined]
        **dict(getattr(compiled, "chain_details", {}) or {}),
        **details,
    }
    return run
