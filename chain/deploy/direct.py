"""A loaded program that is one CPU payload call on its inputs: its runner, called directly.

A serving process calls between requests: after an idle gap every line of Python and every
torch call runs from cold caches (here, 20 ms idle: an empty function 13 us, one tiny
`torch.add` 0.12 ms). The graph path (the lifted graph's code, the op's dispatch, the
runner's lookup, its `detach`/`contiguous`) then cost 0.14-0.23 ms over ONNX Runtime
itself on tiny models (`benchmarks/export_overhead.py --gap-ms 20`). When the program is
that one call, the payload's session is the whole program: for plain CPU tensors that need
no gradient (strided or not), under no dispatch or function mode, functorch transform or
compile, `LeanModule` calls the runner's `plain` entry (the session run on numpy views)
and skips the graph; any other call takes the graph, which handles everything.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.export.exported_program import ExportedProgram, InputKind

import chain.deploy.ops as ops
from backends.common.payload import check_outputs, declared_specs, tensor_bytes, unpack
from chain.deploy.inputs import InputCheck
from chain.deploy.numpy_call import NumpyRun, compiling, numpy_fused

_Tensor = torch.Tensor
_requires_grad = torch._C.TensorBase.requires_grad.__get__
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_transforms = torch._C._are_functorch_transforms_active
_compiling = compiling  # torch.compiler.is_compiling less its TorchScript frame
_OP = torch.ops.backend_chain.run_payload.default  # registered by `ops`


_is_neg = torch._C.TensorBase.is_neg
_is_conj = torch._C.TensorBase.is_conj


def _plain(x: Any) -> bool:
    """A plain tensor the runner's numpy view can read: no gradient, no lazy negative or
    conjugate bit (a `x.neg()` view: numpy cannot read it; the graph resolves it)."""
    return type(x) is _Tensor and not _requires_grad(x) and not _is_neg(x) and not _is_conj(x)


def _other_mode() -> bool:
    """A compile, dispatch or function mode, or a functorch transform, is on: the graph."""
    return _compiling() or bool(_dispatch_modes() or _function_modes() or _transforms())


class Direct:
    """The payload's runner for a program that is one CPU payload call (`direct_call`)."""

    def __init__(
        self,
        positions: tuple[int, ...],
        plain: Callable[..., Any],
        index: tuple[int, ...],
        outputs: str = "",
        arrays: tuple[NumpyRun, list[str], tuple[str, ...]] | None = None,
    ) -> None:
        self.run = plain  # unchecked: `fused` checks its results inline
        self.arrays = arrays  # the runner's (run, output names, input names) on numpy views
        self.want = _static_outputs(outputs) if outputs else None
        self.plain = _checked(plain, outputs, self.want) if self.want is not None else plain
        self.outputs = outputs
        self.positions = positions
        self.pick = _getter(positions)
        self.choose: Callable[[Any], tuple[Any, ...]] = (
            tuple if index == tuple(range(len(index))) else _getter(index)
        )

    def __call__(self, flat: Sequence[Any]) -> tuple[torch.Tensor, ...] | None:
        """The flat outputs of checked flat inputs; None when this call needs the graph."""
        if _other_mode():
            return None
        xs = self.pick(flat)
        if not all(map(_plain, xs)):
            return None
        return self.choose(self.plain(xs))

    def fused(
        self, check: InputCheck, unflatten: Callable[[Any], Any], graph: Callable[..., Any]
    ) -> Callable[..., Any] | None:
        """One closure for positional calls of a program with static CPU tensor inputs: the
        input check and the plain test in one pass, then the runner; anything else (and any
        input the fast test does not pass, to get its error) goes to `graph(*args, **kwargs)`.
        None when the program's inputs are not all static CPU tensors given flat."""
        leaves = check.leaves
        if check.symbolic or not check.flat_tops or not all(leaf.is_tensor for leaf in leaves):
            return None
        if any(leaf.example.device.type != "cpu" for leaf in leaves):
            return None
        facts = tuple((leaf.example.dtype, leaf.static) for leaf in leaves)
        count, choose, run, want = len(facts), self.choose, self.run, self.want
        pick = None if self.positions == tuple(range(count)) else self.pick
        outputs = self.outputs
        if pick is None and self.arrays is not None:
            on_arrays = numpy_fused(facts, want, self.arrays, choose, unflatten, graph, outputs)
            if on_arrays is not None:
                return on_arrays  # the same checks on numpy views (`numpy_call.py`)
        # one frame for the common call: the mode tests, the input tests, the runner's
        # results against the declared outputs (as `_checked`), then the structure
        compiling, dispatch, function, transforms = (
            _compiling,
            _dispatch_modes,
            _function_modes,
            _transforms,
        )
        tensor, requires_grad, is_neg, is_conj = _Tensor, _requires_grad, _is_neg, _is_conj

        def call(*args: Any, **kwargs: Any) -> Any:
            if (
                kwargs
                or len(args) != count
                or compiling()
                or dispatch()
                or function()
                or transforms()
            ):
                return graph(*args, **kwargs)
            for x, (dtype, size) in zip(args, facts, strict=False):  # len(args) == count
                if (
                    type(x) is not tensor
                    or x.dtype is not dtype
                    or x.shape != size
                    or not x.is_cpu
                    or requires_grad(x)
                    or is_neg(x)
                    or is_conj(x)
                ):
                    return graph(*args, **kwargs)
            xs = args if pick is None else pick(args)
            results = run(xs)
            if want is not None:  # a loop, not any(): no generator frame per call
                if len(results) != len(want):
                    check_outputs(list(results), outputs, list(xs))  # raises, naming it
                for r, (shape, dtype) in zip(results, want, strict=False):
                    if r.shape != shape or r.dtype is not dtype:
                        check_outputs(list(results), outputs, list(xs))  # raises, naming it
            return unflatten(choose(results))

        return call


def _static_outputs(outputs: str) -> list[tuple[torch.Size, torch.dtype]] | None:
    """The declared outputs' (shape, dtype), or None when one has a symbolic size."""
    specs = declared_specs(outputs)
    if not all(s.static for s in specs):
        return None
    return [(torch.Size(s.shape), s.torch_dtype) for s in specs]


def _checked(
    plain: Callable[..., Any], outputs: str, want: list[tuple[torch.Size, torch.dtype]]
) -> Callable[..., Any]:
    """`plain` whose results are checked against the node's declared outputs (shape and
    dtype, static specs: a tuple compare per output), as the op checks them."""

    def run(xs: Any) -> Any:
        results = plain(xs)
        if len(results) != len(want) or any(
            r.shape != shape or r.dtype is not dtype
            for r, (shape, dtype) in zip(results, want, strict=False)
        ):
            check_outputs(list(results), outputs, list(xs))  # raises, naming what differs
        return results

    return run


def _getter(positions: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """seq -> the items at `positions`, as a tuple (one C call)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda seq: (seq[only],)
    if not positions:
        return lambda seq: ()
    return operator.itemgetter(*positions)  # type: ignore[return-value]


def direct_call(program: ExportedProgram) -> Direct | None:
    """The program's `Direct` call, or None when it is not one CPU payload call whose
    runner has a `plain` entry."""
    shape = _one_call(program)
    if shape is None:
        return None
    positions, payload, outputs, index = shape
    header, _ = unpack(tensor_bytes(payload))
    if header.device != "cpu":
        return None
    runner = ops.runner_for(payload, torch.device("cpu"), outputs)
    plain = getattr(runner, "plain", None)
    if plain is None:
        return None
    parts = getattr(runner, "numpy_parts", None)
    return Direct(positions, plain, index, outputs, parts() if parts is not None else None)


def _one_call(
    program: ExportedProgram,
) -> tuple[tuple[int, ...], torch.Tensor, str, tuple[int, ...]] | None:
    """(user input positions, payload, outputs string, output indices) when the graph is
    placeholders, one `run_payload` on user inputs, `getitem`s of it, and an output of them."""
    signature = program.graph_signature
    users = {name: k for k, name in enumerate(signature.user_inputs)}
    constants = {
        s.arg.name: s.target for s in signature.input_specs if s.kind == InputKind.CONSTANT_TENSOR
    }
    call: Any = None
    items: dict[Any, int] = {}
    result: Any = None
    for node in program.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "call_function" and node.target is _OP and call is None:
            call = node
        elif (
            node.op == "call_function"
            and node.target is operator.getitem
            and call is not None
            and node.args[0] is call
            and isinstance(node.args[1], int)
        ):
            items[node] = node.args[1]
        elif node.op == "output":
            result = node.args[0]
        else:
            return None
    if call is None or call.kwargs or not isinstance(result, (tuple, list)):
        return None
    inputs, payload_node, outputs = call.args
    if not all(getattr(a, "name", None) in users for a in inputs):
        return None
    target = constants.get(getattr(payload_node, "name", None))
    payload = program.constants.get(target) if target is not None else None
    if not isinstance(payload, torch.Tensor) or not all(r in items for r in result):
        return None
    return (
        tuple(users[a.name] for a in inputs),
        payload,
        outputs,
        tuple(items[r] for r in result),
    )
