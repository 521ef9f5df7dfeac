"""Facts about an FX graph for its record: fingerprint, origin, op histogram, input specs."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import os
import re
import sys
import sysconfig
import types
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.operator_schemas import normalize_function

from backends.common.fx_utils import (
    GATED_RANDOM_OPS,
    RANDOM_OPS,
    SYMBOLIC,
    bare_op_name,
    op_name,
)

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def op_histogram(gm: fx.GraphModule) -> dict[str, int]:
    """How many times each op is called, most common first."""
    ops = Counter(
        op_name(n)
        for n in gm.graph.nodes
        if n.op in ("call_function", "call_method", "call_module")
    )
    return dict(ops.most_common())


def _gate(node: fx.Node) -> dict[str, Any] | None:
    """The node's arguments by name (defaults filled in), or None when they cannot be bound."""
    try:
        bound = normalize_function(
            node.target,  # type: ignore[arg-type]
            node.args,
            node.kwargs,
            normalize_to_only_use_kwargs=True,
        )
    except (RuntimeError, TypeError, ValueError):
        return None
    return dict(bound.kwargs) if bound is not None else None


def _active(node: fx.Node) -> str | None:
    """Why a gated op (dropout, rrelu) is random here, or None when it is the identity.

    Inactive only when the graph says so with constants: `training`/`train` False, or
    dropout with p == 0. A flag or p that is a graph value (not a constant) counts as active.
    """
    args = _gate(node)
    if args is None:
        return "arguments not bound"
    flag = next((k for k in ("training", "train") if k in args), None)
    if flag is not None and args[flag] is False:
        return None
    p = args.get("p")
    if "dropout" in op_name(node) and isinstance(p, int | float) and p == 0:
        return None
    parts = [f"{flag}={args[flag]}" if flag else "", f"p={p}" if p is not None else ""]
    return ", ".join(x for x in parts if x) or "active"


@dataclass(frozen=True)
class RandomNode:
    """A node whose output differs from run to run: its name, its op and, if gated, why."""

    node: str
    op: str
    why: str = ""

    def __str__(self) -> str:
        return f"{self.op} at node {self.node}" + (f" ({self.why})" if self.why else "")


def random_nodes(gm: fx.GraphModule) -> list[RandomNode]:
    """The nodes that make the graph random; [] when it is not.

    Dropout-like ops count only when active: eval-mode `F.dropout(x, p, training=False)`,
    as transformers calls it, is the identity and leaves the graph verifiable.
    """
    found = []
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        name, base = op_name(node), bare_op_name(node)
        if base in RANDOM_OPS:
            found.append(RandomNode(node.name, name))
        elif base in GATED_RANDOM_OPS:
            why = "method call" if node.op == "call_method" else _active(node)
            if why is not None:
                found.append(RandomNode(node.name, name, why))
    return found


def random_ops(gm: fx.GraphModule) -> list[str]:
    """Names of the active random ops in the graph (their outputs differ from run to run)."""
    return [r.op for r in random_nodes(gm)]


# The `operator` functions that write to an operand (`and_`, `or_`, `not_` do not).
_OPERATOR_WRITES = frozenset(
    {"setitem", "delitem", "iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imatmul",
     "imod", "imul", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"}
)  # fmt: skip


def mutates_inputs(gm: fx.GraphModule) -> bool:
    """Whether any op writes in place (so eager must run on cloned inputs)."""
    return any(_writes(node) for node in gm.graph.nodes)


# ops whose output may be a view of their first operand: a write to it writes there
_VIEWS = frozenset(
    {"view", "reshape", "transpose", "permute", "expand", "expand_as", "view_as", "unsqueeze", "t",
     "squeeze", "narrow", "select", "flatten", "unflatten", "as_strided", "getitem", "slice",
     "__getitem__", "split", "chunk", "unbind", "diagonal", "detach", "contiguous", "movedim",
     "swapaxes", "unfold", "_unsafe_view", "alias"}
)  # fmt: skip


def writes_placeholders(gm: fx.GraphModule) -> bool:
    """Whether an op writes in place to an input of the graph or a view of one (writes to
    the graph's own intermediates do not count)."""
    return any(_writes(n) and n.args and _from_placeholder(n.args[0]) for n in gm.graph.nodes)


def _from_placeholder(arg: Any) -> bool:
    """Whether `arg` is a placeholder, or a view of one through `_VIEWS`."""
    while isinstance(arg, fx.Node):
        if arg.op == "placeholder":
            return True
        target = arg.target  # a method's name, or a function (aten overloads: view.default)
        name = str(target if isinstance(target, str) else getattr(target, "__name__", ""))
        view = name.split(".")[0] in _VIEWS
        if arg.op not in ("call_method", "call_function") or not view or not arg.args:
            return False
        arg = arg.args[0]
    return False


def _writes(node: fx.Node) -> bool:
    """Whether `node` writes in place to its first operand (or any, for mutable aten ops)."""
    if node.op == "call_method":
        return str(node.target).endswith("_")
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        return True
    name = getattr(target, "__name__", "")
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        return name in _OPERATOR_WRITES
    return name.endswith("_") and not name.endswith("__")


def _spec(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {
            "shape": [d if isinstance(d, int) else str(d) for d in value.shape],
            "dtype": str(value.dtype).removeprefix("torch."),
            "device": str(value.device),
            "parameter": isinstance(value, torch.nn.Parameter),
        }
    spec = {"type": type(value).__name__, "value": repr(value)[:40]}
    if isinstance(value, SYMBOLIC) and value.node.has_hint():
        spec["hint"] = value.node.hint  # this call's value of the symbol (for repros)
    return spec


def input_specs(example_inputs: Sequence[Any]) -> list[dict[str, Any]]:
    """Shape, dtype and device of each input (symbolic dims as text)."""
    return [_spec(x) for x in example_inputs]


def _graph_lines(gm: fx.GraphModule) -> list[str]:
    """One line per node: op, target, arguments (nodes by position, symbols by kind)."""
    index = {node: i for i, node in enumerate(gm.graph.nodes)}

    def arg(a: Any) -> Any:
        return fx.node.map_aggregate(
            a,
            lambda v: (
                f"%{index[v]}"
                if isinstance(v, fx.Node)
                else type(v).__name__
                if isinstance(v, SYMBOLIC)
                else v
            ),
        )

    return [
        f"{node.op}|{op_name(node) if node.op.startswith('call') else ''}|"
        f"{arg(node.args)!r}|{arg(node.kwargs)!r}"
        for node in gm.graph.nodes
    ]


def _digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def graph_hash(gm: fx.GraphModule) -> str:
    """A structural hash of the graph alone, to check that a backend left it as it was.

    Symbolic sizes count by kind, not by name or value: a compiler may legitimately teach
    dynamo's shape environment a fact (inductor specializes a size it guards on), which
    changes how a symbol prints but not the graph.
    """
    return _digest(_graph_lines(gm))


def fingerprint(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """A structural hash: the same graph on the same input specs gives the same value."""
    return _digest(_graph_lines(gm) + [repr(_spec(x)) for x in example_inputs])


# Libraries that models are built from: their frames are not "the user's code".
MODEL_LIBRARIES = (
    "torch",
    "torchvision",
    "torchaudio",
    "transformers",
    "timm",
    "diffusers",
    "accelerate",
    "peft",
    "sentence_transformers",
    "torch_tensorrt",
)


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    """Install folders of MODEL_LIBRARIES found here (found without importing them)."""
    dirs = []
    for name in MODEL_LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a broken install: its frames count as the user's
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.join(os.path.realpath(folder), ""))
    return tuple(dirs)


@functools.cache
def _stdlib_dirs() -> tuple[str, tuple[str, ...]]:
    """The standard library's folder, and the package folders that may sit inside it
    (site-packages of a system Python): those hold other people's code, not the stdlib's."""
    paths = sysconfig.get_paths()
    packages = {os.path.join(os.path.realpath(paths[k]), "") for k in ("purelib", "platlib")}
    return os.path.join(os.path.realpath(paths["stdlib"]), ""), tuple(packages)


def _is_library(file: str) -> bool:
    """A frame of torch, of a model library, of the standard library (functools, contextlib:
    decorators' frames are nobody's model) or of generated code (`<eval_with_key>`)."""
    if file.startswith("<"):
        return True
    real = os.path.realpath(file)
    stdlib, packages = _stdlib_dirs()
    return real.startswith(_library_dirs()) or (
        real.startswith(stdlib) and not real.startswith(packages)
    )


def _frames(gm: fx.GraphModule) -> list[tuple[str, str, str]]:
    """(file, line, function) of the first node that has a stack trace, outermost first."""
    for node in gm.graph.nodes:
        frames = _FRAME.findall(node.meta.get("stack_trace") or "")
        if frames:
            return frames
    return []


def _where(func: str, file: str, line: int | str) -> str:
    """`func (file.py:line)`, the file by its base name."""
    return f"{func} ({os.path.basename(file)}:{line})"


_by_file: dict[str, types.ModuleType] = {}  # a module's `__file__` -> the module
_indexed: list[int] = [0]  # how many modules sys.modules held when _by_file was built


def _module_of(file: str) -> types.ModuleType | None:
    """The imported module whose source is `file`, or None (a script run as __main__ too).

    An index of sys.modules by file, rebuilt when modules were imported since: a graph's
    origin looks up a few frames, and a scan of thousands of modules each time costs.
    """
    if file not in _by_file and len(sys.modules) != _indexed[0]:
        _by_file.clear()
        for module in list(sys.modules.values()):
            source = getattr(module, "__file__", None)
            if isinstance(source, str):
                _by_file.setdefault(source, module)
        _indexed[0] = len(sys.modules)
    return _by_file.get(file) or _by_file.get(os.path.realpath(file))


def _code_span(fn: object) -> tuple[str, int, int] | None:
    """(file, first line, last line) of a function's code, decorators unwrapped; None when
    `fn` is not a Python function."""
    try:
        code = getattr(inspect.unwrap(fn), "__code__", None)  # type: ignore[arg-type]
    except ValueError:  # a __wrapped__ cycle
        return None
    if not isinstance(code, types.CodeType):
        return None
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return code.co_filename, code.co_firstlineno, max(lines, default=code.co_firstlineno)


def _module_method(file: str, line: int) -> str | None:
    """`Class.method` of the nn.Module class whose method holds `file:line` (the tightest
    one), or None: maps a frame of a model library to the model class it runs."""
    module = _module_of(file)
    if module is None:
        return None
    real, best, width = os.path.realpath(file), None, None
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            continue
        for name, fn in vars(cls).items():
            span = _code_span(fn)
            if span is None or os.path.realpath(span[0]) != real:
                continue
            if span[1] <= line <= span[2] and (width is None or span[2] - span[1] < width):
                best, width = f"{cls.__name__}.{name}", span[2] - span[1]
    return best


def _model_frame(frames: Sequence[tuple[str, str, str]]) -> str | None:
    """The outermost frame inside a method of an nn.Module class (the compiled model's
    `forward`, past the decorators that wrap it), as `Class.method (file:line)`."""
    for file, line, _func in frames:
        method = _module_method(file, int(line))
        if method is not None:
            return _where(method, file, line)
    return None


def _outer_module(gm: fx.GraphModule) -> str:
    """The outermost module a node was traced in, `Class.forward (file:line)` where its
    source is known: for a graph whose nodes carry no stack trace."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        for _path, cls in stack.values():
            name = f"{getattr(cls, '__name__', cls)}.forward"
            span = _code_span(getattr(cls, "forward", None))
            return _where(name, span[0], span[1]) if span else name
    return ""


def _origin_frame(gm: fx.GraphModule) -> str:
    """Where the graph's code is: the innermost frame of the user's own code; else the model
    class's method (a transformers model compiled as it is), never a decorator's wrapper;
    else the outermost module's forward; else the innermost frame."""
    frames = _frames(gm)
    user = [f for f in frames if not _is_library(f[0])]
    if user:
        file, line, func = user[-1]
        return _where(func, file, line)
    found = (_model_frame(frames) if frames else None) or _outer_module(gm)
    if found or not frames:
        return found
    file, line, func = frames[-1]
    return _where(func, file, line)


def origin(gm: fx.GraphModule) -> str:
    """Where the graph came from: `function (file:line)`, plus why dynamo broke it there.

    The frame is the innermost one outside torch, the standard library and the model
    libraries (transformers, timm, ...): the user's line that called into them. A graph
    traced entirely inside a library (a transformers model compiled as it is) gets the
    model class's method, `BertModel.forward (modeling_bert.py:640)`, not the decorators
    around it; a graph without stack traces, its outermost module's forward.
    """
    where = _origin_frame(gm)
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is not None and getattr(reason, "graph_break", False):
        first = str(reason.reason).strip().splitlines()[0] if reason.reason else "graph break"
        where = f"{where}; ends at a graph break: {first}" if where else first
    return where or "unknown"
