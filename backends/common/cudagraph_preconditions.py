"""Can an FX graph be replayed as a CUDA graph? Pure checks that return the reason it cannot.

`check_preconditions(gm, example_inputs)` reads the graph (and the example inputs, which
it never runs or changes) and returns None or one readable line. It works on dynamo graphs
(fake values in `meta["example_value"]`), ATen graphs (`meta["val"]`) and hand-built graphs
without metadata, so every rule is testable on a CPU machine. The order of the rules is
the order of `CHECKS`; the device rule comes last so that a CPU or meta graph still reports
its structural problem (mutation, RNG, ...) first.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from backends.common.fx_utils import GATED_RANDOM_OPS, RANDOM_OPS, grad_inputs, symbolic_inputs
from backends.common.fx_utils import bare_op_name as op_name


def words(text: str) -> frozenset[str]:
    """A set of op names written as one space-separated string."""
    return frozenset(text.split())


# Ops that return a view of their first argument: writing to the view writes the input.
VIEW_OPS = words(
    "getitem __getitem__ view view_as reshape reshape_as transpose t permute select narrow "
    "squeeze unsqueeze expand expand_as flatten unflatten as_strided split chunk unbind "
    "diagonal detach movedim swapaxes swapdims real imag unfold"
)
# In-place dunders and `operator` functions (in place on tensors).
INPLACE_OPERATORS = words(
    "setitem iadd isub imul itruediv ifloordiv imod ipow iand ior ixor ilshift irshift"
)
# Ops whose output shape or value must be read back on the host: no fixed replay exists.
DATA_DEPENDENT_OPS = words(
    "nonzero argwhere masked_select unique unique_consecutive bincount repeat_interleave "
    "item tolist _local_scalar_dense"
)
# Random ops by name (torch-level graphs): RANDOM_OPS, GATED_RANDOM_OPS (fx_utils); ATen ops
# carry the nondeterministic_seeded tag.


def describe(node: fx.Node, gm: fx.GraphModule) -> str:
    """What a node calls, and its name when that differs: 'dropout at node input_2'."""
    if node.op == "call_module":
        what = type(gm.get_submodule(str(node.target))).__name__
    else:
        what = op_name(node)
    return what if node.name.strip("_") == what.strip("_") else f"{what} at node {node.name}"


def value(node: fx.Node) -> Any:
    """The node's example value: `val` (ATen graphs) or `example_value` (dynamo graphs)."""
    return node.meta.get("val", node.meta.get("example_value"))


def named_args(node: fx.Node, gm: fx.GraphModule) -> dict[str, Any]:
    """A call's arguments by name (defaults included where a signature gives them)."""
    target: Any = node.target
    if isinstance(target, torch._ops.OpOverload):
        named = {a.name: a.default_value for a in target._schema.arguments if a.has_default_value()}
        named.update(zip((a.name for a in target._schema.arguments), node.args, strict=False))
        return {**named, **node.kwargs}
    if node.op == "call_module":
        target = gm.get_submodule(str(target)).forward
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        return dict(node.kwargs)
    bound = inspect.signature(target).bind(*node.args, **node.kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def written_args(node: fx.Node, gm: fx.GraphModule) -> list[Any]:
    """The arguments a node writes in place (empty for pure nodes)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return []
    target, args = node.target, named_args(node, gm)
    if isinstance(target, torch._ops.OpOverload):
        schema_args = target._schema.arguments
        return [args[a.name] for a in schema_args if a.alias_info and a.alias_info.is_write]
    name = op_name(node)
    inplace_method = name.endswith("_") and not name.startswith("__")
    inplace_operator = (name.startswith("__") and name.strip("_") in INPLACE_OPERATORS) or (
        node.op == "call_function" and target in {getattr(operator, n) for n in INPLACE_OPERATORS}
    )
    if node.op == "call_module":
        args.setdefault("inplace", getattr(gm.get_submodule(str(target)), "inplace", False))
    first = node.args[0] if node.args else None
    written = [first] if inplace_method or inplace_operator or args.get("inplace") is True else []
    if args.get("out") is not None:
        written.append(args["out"])
    return written


def aliased_input(arg: Any, input_storages: dict[int, fx.Node]) -> fx.Node | None:
    """The placeholder `arg` is a view of, through its fake storage or a chain of view ops."""
    if not isinstance(arg, fx.Node):
        return None
    if isinstance(val := value(arg), torch.Tensor):  # recorded values: storage decides
        return input_storages.get(id_of_storage(val))
    if arg.op == "placeholder":
        return arg
    if arg.op in ("call_method", "call_function") and op_name(arg) in VIEW_OPS and arg.args:
        return aliased_input(arg.args[0], input_storages)
    return None


def id_of_storage(t: torch.Tensor) -> int:
    """Identity of a (fake or real) tensor's storage: views of one tensor share it."""
    return t.untyped_storage()._cdata


def check_input_mutation(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Input mutation: a replay writes into static copies of the inputs, not the caller's."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    storages = {
        id_of_storage(v): p for p in placeholders if isinstance(v := value(p), torch.Tensor)
    }
    for node in gm.graph.nodes:
        for arg in written_args(node, gm):
            if (source := aliased_input(arg, storages)) is not None:
                return f"input mutation: {describe(node, gm)} writes input {source.name} in place"
    for p in placeholders:  # dynamo's fake inputs count the in-place writes it traced
        if isinstance(v := value(p), torch.Tensor) and v._version > 0:
            return f"input mutation: input {p.name} is written in place"
    return None


def check_data_dependent(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Data-dependent ops: output shapes or host reads that one recorded replay cannot fix."""
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        if op_name(node) in DATA_DEPENDENT_OPS:
            return f"data-dependent op: {describe(node, gm)}"
        if (val := value(node)) is not None and free_unbacked_symbols(val):
            return f"data-dependent shape: {describe(node, gm)}"
        has_meta = all(value(n) is not None for n in node.all_input_nodes)
        aten = isinstance(node.target, torch._ops.OpOverload)
        if aten and has_meta and is_cudagraph_unsafe_fx_node(node):
            return f"op torch marks unsafe for CUDA graphs: {describe(node, gm)}"
    return None


def check_random(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """RNG: each replay draws new numbers, so the result cannot be verified against eager."""
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        target, name = node.target, op_name(node)
        if isinstance(target, torch._ops.OpOverload):
            seeded = torch.Tag.nondeterministic_seeded in target.tags
            if seeded and (name != "dropout" or named_args(node, gm).get("train") is not False):
                return f"random op: {describe(node, gm)}"
        elif node.op in ("call_function", "call_method") and name in RANDOM_OPS:
            return f"random op: {describe(node, gm)}"
        elif node.op == "call_function" and name in GATED_RANDOM_OPS:
            if named_args(node, gm).get("training") is not False:
                return f"random op: {describe(node, gm)} in training mode"
        elif node.op == "call_module":
            module = gm.get_submodule(str(target))
            if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.training:
                return f"random op: {describe(node, gm)} in training mode"
    return None


def check_static_shapes(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Dynamic shapes: a CUDA graph is recorded for one set of shapes."""
    symbolic = symbolic_inputs(gm, example_inputs)
    return f"dynamic shapes: {symbolic[0]}" if symbolic else None


def check_inference(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Training graphs: activations saved for backward keep cudagraph trees re-recording.

    Read from the outputs' recorded values (they require grad when the graph was traced in
    grad mode with trainable inputs); without them, from the grad mode in force and the
    example inputs, as aot_autograd decides.
    """
    hint = "compile and run under torch.no_grad() or torch.inference_mode()"
    outputs = [(n, value(n)) for n in gm.graph.output_node().all_input_nodes]
    if any(val is not None for _, val in outputs):
        for node, val in outputs:
            if isinstance(val, torch.Tensor) and val.requires_grad:
                return f"training graph: output {node.name} requires grad ({hint})"
        return None
    placeholders = gm.graph.find_nodes(op="placeholder")
    needing = [i for i in grad_inputs(example_inputs) if i < len(placeholders)]
    if needing:
        name = placeholders[needing[0]].name
        return f"training graph: input {name} requires grad in grad mode ({hint})"
    return None


def tensor_devices(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Iterator[tuple[str, Any]]:
    """(what is where, device) for every tensor and device argument the graph holds or makes."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    for p, example in zip(placeholders, example_inputs, strict=False):
        if isinstance(example, torch.Tensor):
            yield f"input {p.name} is on {example.device}", example.device
    for node in gm.graph.nodes:
        kind = "input" if node.op == "placeholder" else "node"
        vals = value(node)
        for val in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(val, torch.Tensor):
                yield f"{kind} {node.name} is on {val.device}", val.device
        if node.op == "get_attr":
            attr = operator.attrgetter(str(node.target))(gm)
            if isinstance(attr, torch.Tensor):
                yield f"constant {node.name} is on {attr.device}", attr.device
        if node.op in ("call_function", "call_method"):
            if op_name(node) in ("cpu", "numpy"):
                yield f"{describe(node, gm)} moves a tensor to the host", torch.device("cpu")
            for arg in (*node.args[1:], *node.kwargs.values()):
                if isinstance(arg, (str, torch.device)) and str(arg).split(":")[0] == "cpu":
                    yield f"{describe(node, gm)} puts a tensor on cpu", torch.device("cpu")


def check_one_cuda_device(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """Devices: CUDA graphs capture CUDA work on one device; a CPU tensor breaks the replay."""
    cuda: set[torch.device] = set()
    other: str | None = None
    for where, device in tensor_devices(gm, example_inputs):
        device = torch.device(device)
        if device.type == "cpu":
            return f"CPU tensor in the graph: {where}"
        if device.type == "cuda":
            cuda.add(device)
        elif device.type != "meta":
            other = other or where
    if other:
        return f"not a CUDA graph: {other}"
    indexed = {d for d in cuda if d.index is not None}
    if len(indexed) > 1:
        return f"tensors on several CUDA devices: {', '.join(sorted(map(str, indexed)))}"
    if not cuda:
        return "no CUDA tensor in the graph"
    return None


CHECKS: tuple[Callable[[fx.GraphModule, Sequence[Any]], str | None], ...] = (
    check_input_mutation,
    check_data_dependent,
    check_random,
    check_static_shapes,
    check_inference,
    check_one_cuda_device,
)


def check_preconditions(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
    """The first reason this graph cannot be a CUDA graph, or None when it can."""
    for check in CHECKS:
        if reason := check(gm, example_inputs):
            return reason
    return None
