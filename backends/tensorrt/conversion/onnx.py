"""Block -> ONNX through the ORT backend's exporter, so TensorRT parses what ORT verifies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

from backends.common.onnx_export import export_onnx
from backends.errors import Unsupported


@dataclass(frozen=True)
class OnnxModel:
    """A serialized ONNX model and the names of its graph inputs and outputs, in order."""

    data: bytes
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_positions: tuple[int, ...] | None = None  # block input feeding each; None: in order


def export_block(
    block: fx.GraphModule, example_inputs: Sequence[torch.Tensor | int], dynamic: bool = False
) -> OnnxModel:
    """Export one TensorRT block; its weights are buffers already, so they become initializers.

    Every tensor input must stay an ONNX input (the engine binds them by position).
    `dynamic`: the block's symbolic dims become dynamic axes (the common exporter's own
    handling for ONNX Runtime), and its SymInt inputs are read from tensor shapes.
    """
    placeholders_first(block)
    dims = block_dynamic_dims(block) if dynamic else {}
    try:
        graph = export_onnx(block, list(example_inputs), freeze=(), dynamic_dims=dims)
    except Unsupported as e:
        raise Unsupported(f"ONNX export of a TensorRT block failed: {e.reason}", e.detail) from e
    tensors = [i for i, v in enumerate(example_inputs) if isinstance(v, torch.Tensor)]
    if sorted(graph.input_positions) != tensors:  # ints: read from shapes, or not at all
        raise Unsupported(
            f"ONNX export of a TensorRT block dropped inputs: kept {graph.input_positions} "
            f"of {len(example_inputs)}"
        )
    everything = list(graph.input_positions) == list(range(len(example_inputs)))
    positions = None if everything else graph.input_positions
    return OnnxModel(graph.model, graph.input_names, graph.output_names, positions)


def placeholders_first(block: fx.GraphModule) -> None:
    """Move the block's placeholders (in order) before its other nodes, in place: the
    partitioner leaves them among get_attr and ops, and the exporter's preparation reads
    SymInt inputs from tensor sizes at the first node that is not an input."""
    nodes = list(block.graph.nodes)
    anchor = next((n for n in nodes if n.op != "placeholder"), None)
    if anchor is None:
        return
    for node in nodes[nodes.index(anchor) :]:
        if node.op == "placeholder":
            anchor.prepend(node)
    block.recompile()


def block_dynamic_dims(block: fx.GraphModule) -> dict[int, tuple[int, ...]]:
    """Input position -> the dims that are symbolic in the block's traced values (export's
    `val`: the blocks of a dynamic ATen graph carry export's symbols)."""
    dims: dict[int, tuple[int, ...]] = {}
    for i, node in enumerate(block.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            symbolic = tuple(d for d, s in enumerate(value.shape) if isinstance(s, torch.SymInt))
            if symbolic:
                dims[i] = symbolic
    return dims
