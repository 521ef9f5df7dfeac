"""The loaded program's input check: the facts torch's `module()` checks, at a few us a call.

torch's wrapper re-flattens every call's inputs with paths and compares tree specs (a
pre-hook), then runs `_guards_fn` (one `torch._assert` per dimension): ~35 us of a
~50 us wrapper. This check reads the same facts once, at load, from the program's input
spec and its placeholders' example values, and per call compares each input with them:
the number and names of the inputs, their pytree structure (a dict's keys, a tuple where a
tensor was), tensor-ness, dtype, device, rank, and each size (equal to the exported one,
or within the range constraints of its symbol, with one value per symbol). A mismatch is
an `InputMismatch` of one line naming the input.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.export.exported_program import ExportedProgram, InputKind
from torch.fx import _pytree as fx_pytree
from torch.fx.experimental.proxy_tensor import _pytree_subclasses_that_lose_info
from torch.utils import _pytree as pytree

from chain.deploy.structure import is_stand_in

_Tensor = torch.Tensor


class InputMismatch(ValueError):
    """A call's inputs differ from those the program was exported for (one line, naming one)."""


class Unsupported(Exception):
    """A program this check cannot cover exactly (its caller falls back to torch's check)."""


def _describe(value: Any) -> str:
    if isinstance(value, _Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"{type(value).__name__} {value!r:.40}"


def _spec_text(spec: pytree.TreeSpec) -> str:
    if spec.is_leaf():
        return "a tensor or value"
    if spec.type is dict:
        return f"a dict with keys {sorted(map(str, spec.context))}"
    if spec.type in (list, tuple):
        return f"a {spec.type.__name__} of {spec.num_children}"
    return f"a {spec.type.__name__}"


def _kind(cls: Any) -> Any:
    """The type a structure is compared as: torch.Size as tuple, a stand-in as dict."""
    return dict if is_stand_in(cls) else _pytree_subclasses_that_lose_info.get(cls, cls)


def _same_structure(a: pytree.TreeSpec, b: pytree.TreeSpec) -> bool:
    """torch's `eq_spec`: torch.Size matches tuple, a dict's keys in any order; and a
    stand-in (`structure.py`) matches a dict with its keys (the caller has not its class)."""
    if a.is_leaf() or b.is_leaf():
        return a.is_leaf() and b.is_leaf()
    if _kind(a.type) is not _kind(b.type):
        return False
    if _kind(a.type) is dict:
        if set(a.context) != set(b.context):
            return False
        order = {k: i for i, k in enumerate(b.context)}
        pairs = [(ca, b.child(order[k])) for k, ca in zip(a.context, a.children(), strict=True)]
    elif a.context != b.context or a.num_children != b.num_children:
        return False
    else:
        pairs = list(zip(a.children(), b.children(), strict=True))
    return all(_same_structure(x, y) for x, y in pairs)


@dataclass(frozen=True)
class Leaf:
    """One flat input: a tensor (dtype, device, sizes: an int, or a symbol with its range),
    or a constant value the program was specialized on."""

    name: str
    example: Any  # the placeholder's example value: a FakeTensor, an int, a float, ...
    dims: tuple[int | sympy.Symbol, ...] = ()
    ranges: tuple[tuple[float, float] | None, ...] = ()

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.example, _Tensor)

    @property
    def static(self) -> torch.Size | None:
        """The exact sizes when no dimension is symbolic (the per-call fast test)."""
        if self.is_tensor and all(isinstance(d, int) for d in self.dims):
            return torch.Size(self.dims)
        return None

    def check(self, value: Any, bound: dict[sympy.Symbol, int]) -> None:
        """Raise `InputMismatch` unless `value` fits; `bound` holds this call's symbols."""
        if not self.is_tensor:
            same = type(value) is type(self.example) and (
                value == self.example
                or (isinstance(value, float) and math.isnan(value) and math.isnan(self.example))
            )
            if not same:
                raise InputMismatch(
                    f"input {self.name!r}: the program was exported for the constant "
                    f"{self.example!r}, got {_describe(value)}"
                )
            return
        example = self.example
        if not isinstance(value, _Tensor):
            raise InputMismatch(f"input {self.name!r}: expected a tensor, got {_describe(value)}")
        if value.dtype != example.dtype:
            raise InputMismatch(
                f"input {self.name!r}: expected dtype {example.dtype}, got {value.dtype}"
            )
        if value.device != example.device:
            raise InputMismatch(
                f"input {self.name!r}: expected a tensor on {example.device}, got one on "
                f"{value.device}"
            )
        if value.dim() != len(self.dims):
            raise InputMismatch(
                f"input {self.name!r}: expected {len(self.dims)} dimensions "
                f"{self._sizes()}, got {value.dim()} {tuple(value.shape)}"
            )
        for axis, (want, got, span) in enumerate(
            zip(self.dims, value.shape, self.ranges, strict=True)
        ):
            if isinstance(want, int):
                if got != want:
                    raise InputMismatch(
                        f"input {self.name!r}: size {got} at dimension {axis}, the program "
                        f"was exported for {want} (shape {self._sizes()}, got "
                        f"{tuple(value.shape)})"
                    )
                continue
            low, high = span if span is not None else (0, math.inf)
            if not low <= got <= high:
                raise InputMismatch(
                    f"input {self.name!r}: size {got} at dimension {axis} is outside the "
                    f"range {low}..{high} of {want}"
                )
            seen = bound.setdefault(want, got)
            if seen != got:
                raise InputMismatch(
                    f"input {self.name!r}: size {got} at dimension {axis} must equal the "
                    f"other sizes of {want} ({seen})"
                )

    def _sizes(self) -> tuple[int | str, ...]:
        return tuple(d if isinstance(d, int) else str(d) for d in self.dims)


def _dims(
    example: Any, ranges: dict[sympy.Symbol, Any]
) -> tuple[tuple[int | sympy.Symbol, ...], tuple[tuple[float, float] | None, ...]]:
    dims: list[int | sympy.Symbol] = []
    spans: list[tuple[float, float] | None] = []
    for size in example.shape:
        if isinstance(size, int):
            dims.append(size)
            spans.append(None)
            continue
        expr = size.node.expr
        if isinstance(expr, sympy.Integer):
            dims.append(int(expr))
            spans.append(None)
        elif isinstance(expr, sympy.Symbol):
            span = ranges.get(expr)
            dims.append(expr)
            spans.append(None if span is None else (float(span.lower), float(span.upper)))
        else:
            raise Unsupported(f"a size given by an expression ({expr})")
    return tuple(dims), tuple(spans)


def _dummy(spec: pytree.TreeSpec) -> Any:
    """A value of structure `spec` (zeros at the leaves): for the leaves' key paths."""
    return pytree.tree_unflatten([0] * spec.num_leaves, spec)


def _guards(codes: Sequence[str], paths: list[tuple[Any, ...]]) -> Callable[..., None] | None:
    """The program's guards beyond each input's sizes (relations between sizes, checks the
    model made), compiled into one function of the flat inputs the way torch's `module()`
    compiles them; None when there are none (a program exported with static shapes)."""
    if not codes:
        return None
    from torch.export import _unlift  # torch's own translation of its guard code

    codes = _unlift._force_ep_signature_match(list(codes), paths)
    named = [pytree.keystr(p) for p in paths]
    left = [c for c in codes if "L[" in _strip(c, named)]
    if left:
        raise Unsupported(f"a guard on something other than the inputs ({left[0]})")
    return _unlift._convert_guards_code_to_fn(codes, paths).forward


def _strip(code: str, named: list[str]) -> str:
    for name in sorted(named, key=len, reverse=True):
        code = code.replace(f"L{name}", "")
    return code


class InputCheck:
    """Binds a call's arguments to the program's flat inputs, checking each (see module doc)."""

    def __init__(self, program: ExportedProgram, names: Sequence[str] | None) -> None:
        spec = program.call_spec.in_spec
        if spec is None or spec.type is not tuple or spec.num_children != 2:
            raise Unsupported("an input spec that is not (args, kwargs)")
        args_spec, kwargs_spec = spec.children()
        if args_spec.type is not tuple or kwargs_spec.type is not dict:
            raise Unsupported("an input spec that is not (args, kwargs)")
        tops = [*args_spec.children(), *kwargs_spec.children()]
        keys = [str(k) for k in kwargs_spec.context]
        default = [f"arg_{i}" for i in range(args_spec.num_children)] + keys
        self.names: tuple[str, ...] = tuple(names or default)
        if len(self.names) != len(tops):
            raise Unsupported("argument names that do not match the input spec")
        self.specs: tuple[pytree.TreeSpec, ...] = tuple(tops)
        # each flat input's key path from the arguments by name, as torch's guards name it
        self.paths: list[tuple[Any, ...]] = [
            (pytree.MappingKey(name), *path)
            for name, top in zip(self.names, tops, strict=True)
            for path, _ in pytree.tree_leaves_with_path(_dummy(top))
        ]
        self.flat_names = [path[0].key + pytree.keystr(path[1:]) for path in self.paths]
        self.guards = _guards(program._guards_code, self.paths)
        specs = program.graph_signature.input_specs
        user = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
        placeholders = {n.name: n for n in program.graph.find_nodes(op="placeholder")}
        if len(user) != len(self.flat_names):
            raise Unsupported("a different number of flat inputs and user inputs")
        ranges = dict(program.range_constraints)
        leaves = []
        for name, arg in zip(self.flat_names, user, strict=True):
            example = placeholders[arg].meta.get("val")
            if isinstance(example, torch.SymInt):
                raise Unsupported(f"a symbolic integer input ({name})")
            if isinstance(example, _Tensor):
                leaves.append(Leaf(name, example, *_dims(example, ranges)))
            elif example is None or isinstance(example, (int, float, str, bool)):
                leaves.append(Leaf(name, example))
            else:
                raise Unsupported(f"an input of type {type(example).__name__} ({name})")
        self.leaves: tuple[Leaf, ...] = tuple(leaves)
        self.flat_tops = all(s.is_leaf() for s in tops)  # every argument is one leaf
        symbolic = any(leaf.static is None for leaf in leaves if leaf.is_tensor)
        self.symbolic = symbolic or self.guards is not None  # the full check, per leaf
        # per leaf, what the fast test compares: (dtype, device, sizes) or None (full check)
        self.fast: tuple[tuple[Any, Any, torch.Size] | None, ...] = tuple(
            (leaf.example.dtype, leaf.example.device, leaf.static)
            if leaf.static is not None
            else None
            for leaf in leaves
        )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        """The flat inputs of a call, checked; `InputMismatch` naming the first wrong one."""
        if kwargs or len(args) != len(self.names):
            args = self.bind(args, kwargs)
        flat = args if self.flat_tops else self.flatten(args)
        if len(flat) != len(self.fast):  # a programming error in bind/flatten
            raise InputMismatch(f"expected {len(self.fast)} flat inputs, got {len(flat)}")
        if self.symbolic:
            bound: dict[sympy.Symbol, int] = {}
            for value, leaf in zip(flat, self.leaves, strict=True):
                leaf.check(value, bound)
            if self.guards is not None:
                try:
                    self.guards(*flat)
                except AssertionError as error:  # torch._assert's way of saying "no"
                    raise InputMismatch(str(error).splitlines()[0]) from None
            return flat
        for value, fast, leaf in zip(flat, self.fast, self.leaves, strict=True):
            if (
                fast is None
                or type(value) is not _Tensor
                or value.dtype is not fast[0]
                or value.shape != fast[2]
                or value.device != fast[1]
            ):
                leaf.check(value, {})  # raises, or passes a subclass / a constant
        return flat

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """Positional and keyword arguments, in the program's order (torch's forward binds
        them the same way: every input may be passed by name)."""
        names = self.names
        if len(args) > len(names):
            raise InputMismatch(
                f"the program takes {len(names)} inputs ({', '.join(names)}), got "
                f"{len(args)} positional"
            )
        values = list(args)
        for name in names[len(args) :]:
            if name not in kwargs:
                raise InputMismatch(f"input {name!r} is missing (inputs: {', '.join(names)})")
            values.append(kwargs[name])
        extra = [k for k in kwargs if k not in names[len(args) :]]
        if extra:
            twice = [k for k in extra if k in names]
            what = "given twice" if twice else "not an input of the program"
            raise InputMismatch(
                f"input {(twice or extra)[0]!r}: {what} (inputs: {', '.join(names)})"
            )
        return tuple(values)

    def flatten(self, args: tuple[Any, ...]) -> list[Any]:
        """The leaves of nested arguments, each argument's structure compared with its spec."""
        flat: list[Any] = []
        for name, value, spec in zip(self.names, args, self.specs, strict=True):
            if spec.is_leaf():
                flat.append(value)
                continue
            got = pytree.tree_structure(value)
            if not _same_structure(got, spec):
                raise InputMismatch(
                    f"input {name!r}: expected {_spec_text(spec)} (structure {spec}), got "
                    f"{_describe(value)}".replace("\n", " ")
                )
            flat.extend(fx_pytree.tree_flatten_spec(value, spec))  # a dict's keys in spec order
        return flat
