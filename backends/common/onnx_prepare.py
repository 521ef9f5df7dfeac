"""Turn a dynamo graph into one the ONNX exporter takes well: weights frozen, SymInts derived.

Dynamo hands nn.Module parameters and buffers to a backend as graph inputs. Exported that
way they become ONNX graph inputs, and ONNX Runtime can neither fold nor pre-pack them
(measured: 3x slower on a small ResNet). `fx_utils.weight_inputs` finds them; `prepare_graph`
builds a new graph module (the given one is never mutated) where they are constants,
where SymInt inputs are read from the tensor shapes they come from, and where PyTorch's
fused inference fast paths (which have no ONNX translation) are spelled out in plain ops.

A SymInt that no tensor input's size carries (a cache position, a length) is either a
number already (dynamo specialized its symbol and guards on it: inlined) or, when the
caller asks (`carry_ints`), fed through a size carrier: a zero-element tensor of shape
`(n, 0)` whose dim 0 is the symbol, read back with `aten.sym_size.int`, so the exporter's
dynamic dims and ONNX's Shape op carry it (no memory moves: it has no elements).
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from backends.common.fast_paths import encoder_layer, native_mha
from backends.common.fx_utils import KEPT_GRAPHARG, grapharg
from backends.errors import Unsupported


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _traced(node: fx.Node, default: object = None) -> object:
    """The node's traced value: dynamo's `example_value`, else torch.export's `val` (the
    blocks of an exported ATen graph, as the TensorRT backend partitions them)."""
    return node.meta.get("example_value", node.meta.get("val", default))


def _is_symbolic(size: object) -> bool:
    return (
        isinstance(size, torch.SymInt)
        and not size.node.is_constant()
        and bool(size.node.expr.free_symbols)
    )


def symbolic_dims(
    gm: fx.GraphModule, example_inputs: Sequence[object]
) -> dict[int, tuple[int, ...]]:
    """Input position -> the dims dynamo marked dynamic (symbolic in the placeholder's meta)."""
    dims: dict[int, tuple[int, ...]] = {}
    for i, node in enumerate(_placeholders(gm)):
        value = node.meta.get("example_value", example_inputs[i])
        if isinstance(value, torch.Tensor):
            sym = tuple(d for d, s in enumerate(value.shape) if _is_symbolic(s))
            if sym:
                dims[i] = sym
    return dims


def module_scalars(gm: fx.GraphModule, example_inputs: Sequence[object]) -> dict[int, float]:
    """Python float attributes dynamo passes as 0-d tensors (dynamic=True: a norm's eps, a
    rotary scaling, `config.hidden_dropout`), by position: read from an attribute (of the
    module, its submodules or its config), never a float the caller passes. The runners
    check each call that the value is still the one inlined."""
    from torch._dynamo.source import AttrSource

    found: dict[int, float] = {}
    for i, (node, value) in enumerate(zip(_placeholders(gm), example_inputs, strict=True)):
        arg = grapharg(node)
        if not getattr(arg, "pass_arg_as_tensor", False):
            continue
        if (
            isinstance(arg.source, AttrSource)
            and isinstance(value, torch.Tensor)
            and value.dim() == 0
            and value.dtype.is_floating_point
        ):
            found[i] = value.item()
    return found


@dataclass(frozen=True)
class PreparedGraph:
    """A new graph module that takes only the kept tensor inputs, and how it maps back."""

    module: fx.GraphModule
    kept: tuple[int, ...]  # positions of the original inputs still fed at run time
    frozen: tuple[int, ...]  # positions turned into constants (ONNX initializers)
    derived: tuple[int, ...]  # SymInt positions now read from a tensor's shape (or inlined)
    scalars: Mapping[int, float]  # module floats (0-d tensor inputs) inlined as numbers
    decomposed: tuple[str, ...]  # fused fast-path ops spelled out in plain ops
    carriers: tuple[int, ...] = ()  # SymInt positions fed as (n, 0) tensors, after `kept`
    fixed: Mapping[int, int] = dataclasses.field(default_factory=dict)  # plain ints inlined

    @property
    def fed(self) -> tuple[int, ...]:
        """The original positions behind the module's inputs, in its order."""
        return self.kept + self.carriers


CARRIER_DTYPE = torch.int64  # a carrier's dtype (it holds no element: any would do)


def size_carrier(n: int) -> torch.Tensor:
    """The tensor that carries the int `n` as its dim 0: shape (n, 0), no memory."""
    return torch.empty((n, 0), dtype=CARRIER_DTYPE)


def input_name(node: fx.Node) -> str:
    """A placeholder in words: its name and, for dynamo's graphs, where its value comes from."""
    source = getattr(getattr(grapharg(node), "source", None), "name", None)
    source = source() if callable(source) else source
    return f"{node.name} ({source})" if source else node.name


def _size_source(
    sym: torch.SymInt, nodes: Sequence[fx.Node], kept: Sequence[int]
) -> tuple[fx.Node, int] | None:
    """A kept tensor placeholder and dim whose size is exactly this SymInt."""
    expr = sym.node.expr
    for i in kept:
        value = _traced(nodes[i])
        if not isinstance(value, torch.Tensor):
            continue
        for d, s in enumerate(value.shape):
            if isinstance(s, torch.SymInt) and s.node.expr == expr:
                return nodes[i], d
    return None


def _inline_scalar(graph: fx.Graph, node: fx.Node, value: float) -> None:
    """Replace `node.item()` calls by the Python number itself (exporters want constants)."""
    for user in list(node.users):
        if user.op == "call_method" and user.target == "item":
            user.replace_all_uses_with(value)  # type: ignore[arg-type]
            graph.erase_node(user)


def prepare_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[object],
    frozen: Sequence[int],
    scalars: Mapping[int, float] | None = None,
    returns: Sequence[int] = (),
    carry_ints: bool = False,
    fix_ints: bool = False,
) -> PreparedGraph:
    """Copy `gm` with `frozen` inputs as constants and SymInt inputs read from shapes.

    `scalars`: positions of module floats passed as 0-d tensors; their `.item()` calls
    become the number itself, and they are frozen like weights. `returns`: inputs the
    graph writes in place, returned after its own outputs (their values after the writes).
    `carry_ints`: a symbolic int no tensor size carries becomes an input of its own (a
    size carrier, `size_carrier`), which the caller feeds at every call; without it, such
    an int is refused with a reason naming the input. `fix_ints`: a plain int input (a
    graph specialized for one shape, as a per-shape bucket is: `chain.run.buckets.shapes`)
    is inlined, and `PreparedGraph.fixed` names it for the runner to check at every call;
    without it, such an int is refused.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    out = graph.graph_copy(gm.graph, env, return_output_node=True)
    result = out[0] if isinstance(out, tuple) else out
    originals = _placeholders(gm)  # their meta names where dynamo took each input from
    nodes = [env[n] for n in originals]
    if returns:
        own = tuple(result) if isinstance(result, tuple | list) else (result,)
        result = own + tuple(nodes[i] for i in returns)
    graph.output(result)
    module = fx.GraphModule(gm, graph)
    scalars = dict(scalars or {})
    frozen_set = set(frozen) | set(scalars)
    for i, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor | torch.SymInt | int):
            raise Unsupported(f"graph input {i} is a {type(value).__name__}, not a tensor")
    symints = {i for i, v in enumerate(example_inputs) if isinstance(v, torch.SymInt | int)}
    kept = tuple(i for i in range(len(nodes)) if i not in frozen_set and i not in symints)
    # new nodes go right after the last placeholder (a graph may list one after an op)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = placeholders[-1].next if placeholders else next(iter(graph.nodes))
    for i, number in scalars.items():
        _inline_scalar(graph, nodes[i], number)
    for i in sorted(frozen_set):
        if not nodes[i].users:
            continue
        name = f"_frozen_{i}"
        module.register_buffer(name, example_inputs[i].detach(), persistent=True)  # type: ignore[union-attr]
        with graph.inserting_before(first_op):
            attr = graph.get_attr(name)
        attr.meta = {k: v for k, v in nodes[i].meta.items() if k not in ("grapharg", KEPT_GRAPHARG)}
        nodes[i].replace_all_uses_with(attr)
    carriers: list[int] = []
    read: list[int] = []  # the int inputs the graph reads (derived, inlined or carried)
    fixed: dict[int, int] = {}  # plain ints inlined (fix_ints), checked by the runner
    for i in sorted(symints):
        if not nodes[i].users:
            continue  # e.g. a dynamic stride dynamo guards on but the graph never reads
        value = _traced(nodes[i], example_inputs[i])
        if not isinstance(value, torch.SymInt):
            if not fix_ints:
                raise Unsupported(
                    f"graph input {i} {input_name(originals[i])} is a plain int: only "
                    "symbolic ints (dynamo's SymInts) are supported"
                )
            fixed[i] = int(value)  # type: ignore[call-overload]
            nodes[i].replace_all_uses_with(fixed[i])  # type: ignore[arg-type]
            continue
        read.append(i)
        meta = {k: v for k, v in nodes[i].meta.items() if k not in ("grapharg", KEPT_GRAPHARG)}
        if value.node.expr.is_number:  # specialized: dynamo guards on this very value
            nodes[i].replace_all_uses_with(int(value.node.expr))  # type: ignore[arg-type]
            continue
        found = _size_source(value, nodes, kept)
        if found is None and not carry_ints:
            raise Unsupported(
                f"dynamic shapes: graph input {i} {input_name(originals[i])} is a symbolic int "
                "that no tensor input's size carries, and this exporter reads sizes from "
                "tensor shapes only; onnxruntime feeds such ints as inputs of their own, or "
                "keep the value static (dynamic=False, or torch._dynamo.mark_static)"
            )
        if found is None:
            with graph.inserting_after(placeholders[-1]):
                carrier = graph.placeholder(f"_size_of_{nodes[i].name}")
            placeholders.append(carrier)
            carrier.meta = {}
            carriers.append(i)
            found = (carrier, 0)
        with graph.inserting_before(first_op):
            size = graph.call_function(torch.ops.aten.sym_size.int, found)
        size.meta = meta
        nodes[i].replace_all_uses_with(size)
    for i in sorted(frozen_set | symints):
        graph.erase_node(nodes[i])
    decomposed = _decompose_fast_paths(graph) + _sym_roots(graph)
    graph.lint()
    module.recompile()
    frozen_tensors = tuple(sorted(frozen_set - set(scalars)))
    derived = tuple(i for i in read if i not in carriers)  # an unread int is not fed at all
    return PreparedGraph(
        module, kept, frozen_tensors, derived, scalars, decomposed, tuple(carriers), fixed
    )


_FAST_PATHS = {
    torch._transformer_encoder_layer_fwd: (encoder_layer, 18),
    torch.ops.aten._transformer_encoder_layer_fwd.default: (encoder_layer, 18),
    torch._native_multi_head_attention: (native_mha, 9),
    torch.ops.aten._native_multi_head_attention.default: (native_mha, 9),
}


def _reads_weights(node: fx.Node) -> bool:
    """Whether anything reads the attention weights (output 1) of a native MHA call."""
    return any(
        user.op != "call_function" or user.target is not operator.getitem or user.args[1] != 0
        for user in node.users
    )


def _decompose_fast_paths(graph: fx.Graph) -> tuple[str, ...]:
    """Retarget mask-free fused fast-path calls to their plain-op spelling (in place)."""
    done: list[str] = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _FAST_PATHS:
            continue
        fn, mask_at = _FAST_PATHS[node.target]
        mask = node.args[mask_at] if len(node.args) > mask_at else node.kwargs.get("mask")
        if mask is not None or (fn is native_mha and _reads_weights(node)):
            continue  # left as is: the exporter then says it has no translation for it
        done.append(getattr(node.target, "__name__", str(node.target)))
        node.target = fn
    return tuple(done)


_SQRT = {torch._sym_sqrt, math.sqrt}  # type: ignore[attr-defined]


def _sym_roots(graph: fx.Graph) -> tuple[str, ...]:
    """`math.sqrt` of a symbolic size (dynamo's `torch._sym_sqrt`: a scale by the square root
    of a dim) as `size ** 0.5`, which the exporter translates; it has no `_sym_sqrt`."""
    done = []
    for node in graph.nodes:
        if node.op == "call_function" and node.target in _SQRT and len(node.args) == 1:
            node.target = operator.pow
            node.args = (node.args[0], 0.5)
            done.append("_sym_sqrt")
    return tuple(done)
