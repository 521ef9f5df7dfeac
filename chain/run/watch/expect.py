"""What eager's outputs look like, and a per-call check that a winner's outputs still do.

Recorded once at selection from eager's run: the output structure, and per tensor output
its dtype, device, shape, which input it aliases (a view of it, as `x.view(-1)` is) and
whether it is channels_last. For dynamic graphs a shape is kept as the expressions dynamo
recorded (its `example_value`/`val` meta: SymInts), each turned into a small function of
the symbols' sources in this call's arguments (an int argument, or a dim of a tensor
argument); a dim whose expression cannot be evaluated so is left unchecked, and listed.

Aliasing is checked against the non-parameter tensor inputs only (a few per graph), and
against those of the output's dtype and device (sharing memory across dtypes takes a
reinterpreting view no compiler makes of an input); an output aliasing a parameter is left
to re-verification. NaN/inf is looked for only in CPU
outputs (on a GPU, reading the answer would synchronize every call); finding one makes the
call suspect (re-verified at once), not wrong: eager may produce NaN too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from chain.judge.verify import channels_last

Dim = int | Callable[[Sequence[Any]], int] | None  # fixed, from this call's args, unchecked


@dataclass(frozen=True)
class OutputSpec:
    """One tensor output of eager: what every winner's output at this position must match."""

    index: int
    dtype: torch.dtype
    device: torch.device
    shape: tuple[Dim, ...]
    static: tuple[int, ...] | None  # the whole shape, when no dim is symbolic
    alias: int | None  # the input it is a view of in eager (None: fresh memory)
    fresh_of: tuple[int, ...]  # inputs it must not alias (fresh in eager): same dtype, device
    channels_last: bool
    finite_cpu: bool  # a CPU floating output, finite in eager: NaN/inf in it is suspect

    on_cpu: bool = field(init=False)
    layout: bool = field(init=False)  # aliasing or channels_last to check (most: neither)

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_cpu", self.device.type == "cpu")
        layout = self.alias is not None or bool(self.fresh_of) or self.channels_last
        object.__setattr__(self, "layout", layout)


def _finite(t: torch.Tensor) -> bool:
    """No NaN/inf in `t`, read from its sum (one kernel, where isfinite().all() takes two): a
    NaN or inf makes the sum non-finite; a sum that overflows only makes the call suspect."""
    if t.requires_grad:  # else no detach: a view made per call costs ~3 us after a forward
        t = t.detach()
    if t.dtype in (torch.float16, torch.bfloat16):
        return math.isfinite(float(t.sum(dtype=torch.float64)))
    return math.isfinite(float(t.sum()))  # no dtype keyword: a quicker dispatch


def _storage(t: torch.Tensor) -> int:
    """Where a tensor's memory starts (0 for an empty one: it aliases nothing)."""
    return t.untyped_storage().data_ptr() if t.numel() else 0


def _sources(gm: fx.GraphModule) -> dict[sympy.Symbol, Callable[[Sequence[Any]], int]]:
    """For each plain symbol of the graph's inputs, how to read its value from the args."""
    found: dict[sympy.Symbol, Callable[[Sequence[Any]], int]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
            found.setdefault(val.node.expr, lambda args, i=i: int(args[i]))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Symbol):
                    found.setdefault(size.node.expr, lambda args, i=i, d=d: args[i].shape[d])
    return found


# torch's own sympy functions in size expressions (torch.utils._sympy.functions), on ints
_SIZE_FUNCTIONS: dict[str, Callable[..., int]] = {
    "FloorDiv": lambda a, b: a // b,
    "CleanDiv": lambda a, b: a // b,
    "CeilDiv": lambda a, b: -(-a // b),
    "IntTrueDiv": lambda a, b: a / b,
    "ModularIndexing": lambda x, d, m: (x // d) % m,
    "Mod": lambda a, b: a % b,
    "PythonMod": lambda a, b: a % b,
    "Max": max,
    "Min": min,
    "TruncToInt": int,
    "FloorToInt": math.floor,
    "CeilToInt": math.ceil,
}


def _dim(size: Any, sources: dict[sympy.Symbol, Callable[[Sequence[Any]], int]]) -> Dim:
    """A dim of an output's recorded shape as a fixed int, a function of the args, or None."""
    if isinstance(size, int):
        return size
    expr = size.node.expr if isinstance(size, torch.SymInt) else None
    if expr is None or not expr.free_symbols <= sources.keys():
        return None
    symbols = sorted(expr.free_symbols, key=str)
    try:
        fn = sympy.lambdify(symbols, expr, modules=[_SIZE_FUNCTIONS, "math"])
    except (TypeError, ValueError, NameError, SyntaxError):
        return None
    reads = [sources[s] for s in symbols]
    return lambda args: int(fn(*(read(args) for read in reads)))


def _evaluate(dim: Callable[[Sequence[Any]], int], inputs: Sequence[Any]) -> int | None:
    """A dim's function on eager's own inputs; None when it cannot be evaluated there."""
    try:
        return dim(inputs)
    except Exception:  # any failure (a function lambdify did not know): the caller lists
        return None  # the dim as unchecked, with its expression, rather than check it


def _output_vals(gm: fx.GraphModule) -> list[Any] | None:
    """The recorded (fake) values of the graph's outputs, flattened; None when not recorded."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None:
        return None
    vals = []
    for leaf in pytree.tree_leaves(out.args[0]):
        if not isinstance(leaf, fx.Node):
            vals.append(leaf)
            continue
        if "example_value" not in leaf.meta and "val" not in leaf.meta:
            return None
        vals.append(leaf.meta.get("example_value", leaf.meta.get("val")))
    return vals


class Expected:
    """Eager's outputs, described; `check(args, out)` says what a winner's output gets wrong."""

    def __init__(
        self, gm: fx.GraphModule, inputs: Sequence[Any], outputs: Any, watched: Sequence[int]
    ) -> None:
        """`inputs`: what eager ran on; `outputs`: what it returned; `watched`: positions of
        the non-parameter tensor inputs (aliasing is checked against these)."""
        self.flat = isinstance(outputs, tuple | list)
        leaves, self.spec = pytree.tree_flatten(_as_tuple(outputs))
        self.count = len(leaves)
        self.watched = tuple(watched)
        self.unchecked: list[str] = []
        vals = _output_vals(gm)
        if vals is not None and len(vals) != len(leaves):
            vals = None
        sources = _sources(gm)
        storages = {
            _storage(x): i
            for i, x in enumerate(inputs)
            if isinstance(x, torch.Tensor) and x.numel()
        }
        specs = []
        constants = constant_outputs(gm, len(leaves))
        fresh: list[int] = []  # outputs in memory of their own (no input's, no constant's)
        for i, out in enumerate(leaves):
            if not isinstance(out, torch.Tensor):
                continue
            if out.numel() and _storage(out) not in storages and i not in constants:
                fresh.append(i)
            recorded = vals[i] if vals is not None else None
            shape: tuple[Dim, ...]
            if isinstance(recorded, torch.Tensor) and len(recorded.shape) == out.dim():
                dims = [_dim(s, sources) for s in recorded.shape]
                for d, size in enumerate(recorded.shape):
                    # a dim the check would get wrong on eager's own run is not checked
                    if callable(dims[d]) and _evaluate(dims[d], inputs) != out.shape[d]:
                        dims[d] = None
                    if dims[d] is None:
                        self.unchecked.append(f"output {i} dim {d} ({size}): not evaluable")
                shape = tuple(dims)
            else:
                shape = tuple(out.shape)
            static = tuple(shape) if all(isinstance(d, int) for d in shape) else None
            alias = storages.get(_storage(out)) if out.numel() else None
            if alias is not None and alias not in self.watched:
                self.unchecked.append(f"output {i} aliases input {alias}, a parameter")
                alias = None
            specs.append(
                OutputSpec(
                    index=i,
                    dtype=out.dtype,
                    device=out.device,
                    shape=shape,
                    static=static,  # type: ignore[arg-type]
                    alias=alias,
                    fresh_of=()
                    if alias is not None
                    else tuple(
                        j
                        for j in self.watched
                        if inputs[j].dtype == out.dtype and inputs[j].device == out.device
                    ),
                    channels_last=channels_last(out),
                    finite_cpu=out.device.type == "cpu"
                    and out.is_floating_point()
                    and _finite(out),
                )
            )
        self.specs = tuple(specs)
        self.aliasing = any(s.alias is not None for s in specs)
        self.fresh = tuple(fresh)

    @property
    def scans(self) -> bool:
        """Whether any output is scanned for NaN/inf (a CPU floating one, finite in eager)."""
        return any(s.finite_cpu for s in self.specs)

    def finite(self, out: Any) -> bool:
        """Whether the scanned outputs of `out` (of eager's structure) hold no NaN/inf."""
        flat = self.flat and isinstance(out, tuple | list)
        leaves = out if flat else pytree.tree_leaves(_as_tuple(out))
        return all(_finite(leaves[s.index]) for s in self.specs if s.finite_cpu)

    def check(self, args: Sequence[Any], out: Any, scan: bool = True) -> tuple[str | None, bool]:
        """(what is wrong with `out`, or None; whether it is suspect: NaN/inf to re-verify).
        `scan`: whether to look for NaN/inf in this call's CPU outputs (`chain.watch.Watch`
        samples it where it would cost more than a small share of the call).

        Runs after every call of a winner, right after the graph's own ops, when nothing it
        touches is in cache (a tiny BERT: 1.6 us for one output's dtype and shape): the usual
        case reads each output's dtype, device and shape in one condition, and `_wrong`
        works out the message only for an output that fails it."""
        if self.flat and isinstance(out, (tuple, list)) and len(out) == self.count:
            leaves = out
        else:
            reason, leaves = self._leaves(out)
            if reason is not None:
                return reason, False
        suspect = False
        for s in self.specs:
            t = leaves[s.index]
            if not (
                isinstance(t, torch.Tensor)
                and t.dtype == s.dtype
                and (t.is_cpu if s.on_cpu else t.device == s.device)
                and (t.shape == s.static if s.static is not None else _fits(t, s, args))
            ):
                return _wrong(t, s, args), False
            if s.layout and (reason := _layout(t, s, args)) is not None:
                return reason, False
            if scan and s.finite_cpu and not suspect and not _finite(t):
                suspect = True
        return None, suspect

    def leaves(self, out: Any) -> Sequence[Any]:
        """`out` flattened as eager's outputs are (after `check` passed it)."""
        if self.flat and isinstance(out, tuple | list):
            return out
        return pytree.tree_leaves(_as_tuple(out))

    def _leaves(self, out: Any) -> tuple[str | None, Any]:
        """The outputs flattened, or why their structure is not eager's."""
        if self.flat and isinstance(out, tuple | list):
            return f"{len(out)} output(s) where eager has {self.count}", None
        leaves, spec = pytree.tree_flatten(_as_tuple(out))
        if spec != self.spec:
            return f"output structure {spec} where eager has {self.spec}", None
        return None, leaves


def _want(s: OutputSpec, args: Sequence[Any]) -> tuple[int | None, ...]:
    """An output's expected shape for this call (None: a dim left unchecked)."""
    return tuple(d if d is None or isinstance(d, int) else d(args) for d in s.shape)


def _fits(t: torch.Tensor, s: OutputSpec, args: Sequence[Any]) -> bool:
    """Whether a symbolic output's shape is what this call's sizes give."""
    want = _want(s, args)
    return len(t.shape) == len(want) and all(
        w is None or w == g for w, g in zip(want, t.shape, strict=True)
    )


def _wrong(t: Any, s: OutputSpec, args: Sequence[Any]) -> str:
    """What is wrong with output `s.index`, which failed the usual case's condition."""
    i = s.index
    if not isinstance(t, torch.Tensor):
        return f"output {i} is a {type(t).__name__} where eager has a tensor"
    if t.dtype != s.dtype:
        return f"output {i} has dtype {t.dtype} where eager has {s.dtype}"
    if t.device != s.device:
        return f"output {i} is on {t.device} where eager's is on {s.device}"
    eager = s.static if s.static is not None else _want(s, args)
    return f"output {i} has shape {tuple(t.shape)}, eager {eager}"


def _layout(t: torch.Tensor, s: OutputSpec, args: Sequence[Any]) -> str | None:
    """Aliasing as eager's, and channels_last where eager's is (None: as eager's)."""
    i = s.index
    if s.alias is not None:
        if _storage(t) != _storage(args[s.alias]):
            return f"output {i} does not alias input {s.alias} as eager's does"
    elif s.fresh_of and t.numel():
        where = _storage(t)
        for j in s.fresh_of:
            if _storage(args[j]) == where:
                return f"output {i} aliases input {j}; eager's is fresh memory"
    if s.channels_last and not t.is_contiguous(memory_format=torch.channels_last):
        return f"output {i} is not channels_last as eager's is"
    return None


def constant_outputs(gm: fx.GraphModule, count: int) -> set[int]:
    """Flat outputs the graph returns straight from its attributes (the same each call)."""
    out = next((n for n in gm.graph.nodes if n.op == "output"), None)
    if out is None:
        return set()
    leaves = pytree.tree_leaves(out.args[0])
    if len(leaves) != count:
        return set()
    return {i for i, n in enumerate(leaves) if isinstance(n, fx.Node) and n.op == "get_attr"}


def _as_tuple(out: Any) -> Any:
    return tuple(out) if isinstance(out, list) else out
