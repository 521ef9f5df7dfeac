"""Which graph inputs stay at fixed addresses under CUDA graphs, and safe outputs for replays.

Dynamo hands a module's parameters and buffers to a backend as graph inputs. Under a CUDA
graph, an input that is not declared static is copied into the graph's own buffer on every
replay: for weights that is a copy of the whole model per call. Dynamo marks the tensors
it knows to be parameters or buffers (`_dynamo_static_input_type`, also kept in the
placeholder's `meta["tensor_dict"]`); aot_autograd reads that mark to build inductor's
`static_input_indices`. `static_input_positions` reads the same marks (plus
`nn.Parameter` for graphs that did not come from dynamo), so every graphed variant
declares the same inputs static as inductor's reduce-overhead mode does. torch's
cudagraph trees re-record (not copy) when a static input's address changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

STATIC_MARK = "_dynamo_static_input_type"  # set by torch._dynamo.mark_static_address


def is_static_input(placeholder: fx.Node | None, example: Any) -> bool:
    """A parameter, a buffer, or a tensor marked static: its address does not move per call."""
    if not isinstance(example, torch.Tensor):
        return False
    if isinstance(example, torch.nn.Parameter) or getattr(example, STATIC_MARK, None):
        return True
    if placeholder is None:
        return False
    tensor_dict = placeholder.meta.get("tensor_dict") or {}
    return bool(tensor_dict.get(STATIC_MARK))


def static_input_positions(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[int]:
    """Positions of the inputs that CUDA graphs must read in place (weights), never copy."""
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    return [
        i
        for i, example in enumerate(example_inputs)
        if is_static_input(placeholders[i] if i < len(placeholders) else None, example)
    ]


def input_storages(inputs: Sequence[Any]) -> set[int]:
    """Data pointers of the storages of the tensors among `inputs`."""
    return {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}


def clone_mask(outputs: Any, inputs: Sequence[Any]) -> list[bool]:
    """Per flat output: True when it lives in a replay's buffer (not an alias of an input)."""
    flat, _ = tree_flatten(outputs)
    aliases = input_storages(inputs)
    return [
        isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in aliases for x in flat
    ]


def clone_outputs(compiled: Callable[..., Any], mask: list[bool]) -> Callable[..., Any]:
    """Wrap `compiled` so that the flat outputs marked in `mask` are fresh copies.

    A replay writes its outputs into the same buffers each time, so an output held from
    call N would be overwritten by call N+1; the copy is what the caller keeps.
    """

    def run(*args: Any) -> Any:
        flat, spec = tree_flatten(compiled(*args))
        flat = [x.clone() if clone else x for x, clone in zip(flat, mask, strict=True)]
        return tree_unflatten(flat, spec)

    return run


def graph_callable(
    fn: Callable[..., Any], example_inputs: Sequence[Any], static: Sequence[int]
) -> Callable[..., Any]:
    """Replay `fn(*inputs)` through torch's cudagraph trees; `static` inputs read in place.

    For compiled callables that are not FX graphs of their own (a TensorRT module that
    mixes engines and PyTorch ops): the trees warm up, record on their own stream and
    memory pool, copy only the non-static inputs per replay and re-record when a static
    input's address moves. Outputs are flattened for the trees and rebuilt after.
    """
    from torch._inductor.cudagraph_trees import cudagraphify_impl

    devices = {t.device for t in example_inputs if isinstance(t, torch.Tensor) and t.is_cuda}
    if len(devices) != 1:
        raise ValueError(f"CUDA graphs need inputs on one CUDA device, got {sorted(devices)}")
    spec: list[Any] = []

    def boxed(args: list[Any]) -> list[Any]:
        inputs = list(args)
        args.clear()  # the boxed convention: the trees may free inputs they no longer need
        flat, out_spec = tree_flatten(fn(*inputs))
        spec[:] = [out_spec]
        return flat

    replay = cudagraphify_impl(
        boxed,
        list(example_inputs),
        list(static),
        device_index=devices.pop().index or 0,
        is_backward=False,
        is_inference=True,
    )

    def run(*args: Any) -> Any:
        return tree_unflatten(list(replay(list(args))), spec[0])

    return run
