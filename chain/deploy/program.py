"""What `chain.load` returns: the ExportedProgram, whose `module()` is a lean callable.

torch's `ExportedProgram.module()` unlifts the graph into a GraphModule whose call adds
~50 us (the deploy path's whole gap to ONNX Runtime, `benchmarks/export_overhead.py`): an
input-structure pre-hook (pytree flatten with paths, spec comparison), `_guards_fn`
(one `torch._assert` per dimension), nn.Module hooks and pytree flatten/unflatten in its
code. `LeanModule` runs the program's own lifted graph (`program.graph_module`) with the
parameters, buffers and constants passed in, behind `InputCheck` (`inputs.py`: the same
facts, read once at load); a program that is one CPU payload call skips the graph for
plain inputs (`direct.py`: 0.14-0.23 ms a call after an idle gap). A program it cannot
cover exactly (buffer mutations, effect tokens, custom objects, sizes given by
expressions) gets torch's module, with a warning saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.export.exported_program import ExportedProgram, InputKind, OutputKind
from torch.utils import _pytree as pytree

from chain.deploy.direct import direct_call
from chain.deploy.inputs import InputCheck, Unsupported
from chain.deploy.rebuild import rebuilder

log = logging.getLogger(__name__)

_LIFTED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _lifted_values(program: ExportedProgram) -> list[torch.Tensor]:
    """The graph's lifted inputs, in order, as torch's `module()` registers them."""
    signature = program.graph_signature
    non_persistent = set(signature.non_persistent_buffers)
    values = []
    for spec in signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in _LIFTED or spec.target is None:
            raise Unsupported(f"a lifted input of kind {spec.kind.name}")
        if spec.kind == InputKind.PARAMETER or (
            spec.kind == InputKind.BUFFER and spec.target not in non_persistent
        ):
            values.append(program.state_dict[spec.target])
            continue
        value = program.constants[spec.target]
        if not isinstance(value, torch.Tensor):
            raise Unsupported(f"a constant of type {type(value).__name__}")
        # torch's module() detaches a constant that requires grad (it is not a parameter)
        values.append(value.detach() if value.requires_grad else value)
    return values


def _unflattener(spec: pytree.TreeSpec) -> Callable[[Any], Any]:
    """The outputs' structure from the graph's flat tuple; a plain tuple is returned as is."""
    if spec.is_leaf():
        return lambda flat: flat[0]
    if spec.type is tuple and all(c.is_leaf() for c in spec.children()):
        return lambda flat: flat
    if spec.type is list and all(c.is_leaf() for c in spec.children()):
        return list
    return rebuilder(spec)  # prepared once: tree_unflatten walks the spec every call


class LeanModule(torch.nn.Module):
    """The loaded program as a callable: its lifted graph behind `InputCheck` (module doc).

    Inference only: `eval()` is a no-op, `train()` and device or dtype moves raise (load
    the program where it runs; its compiled parts were built for one device).
    """

    def __init__(self, program: ExportedProgram, *, direct: bool = True) -> None:
        super().__init__()
        signature = program.graph_signature
        kinds = [s.kind for s in signature.input_specs]
        first_user = next((i for i, k in enumerate(kinds) if k == InputKind.USER_INPUT), None)
        if first_user is not None and any(k != InputKind.USER_INPUT for k in kinds[first_user:]):
            raise Unsupported("lifted inputs after user inputs")
        if any(s.kind != OutputKind.USER_OUTPUT for s in signature.output_specs):
            raise Unsupported("outputs that mutate buffers or inputs")
        if any(isinstance(x, torch.nn.Module) for x in pytree.tree_leaves(program.example_inputs)):
            raise Unsupported("a module among the inputs")
        signature_names = program.module_call_graph[0].signature
        names = signature_names.forward_arg_names if signature_names else None
        self._check = InputCheck(program, names)
        self._lifted = tuple(_lifted_values(program))
        self._graph = program.graph_module.forward  # a bound method: not a submodule
        out_spec = program.call_spec.out_spec
        if out_spec is None:
            raise Unsupported("a program without an output spec")
        self._unflatten = _unflattener(out_spec)
        self._program_graph = program.graph_module  # kept alive, printed by `code`
        # one CPU payload call: its runner called directly for plain inputs (`direct.py`)
        self._direct = direct_call(program) if direct else None
        fused = (
            self._direct.fused(self._check, self._unflatten, self._general)
            if self._direct
            else None
        )
        self._call = fused or self._general
        self.training = False

    @property
    def code(self) -> str:
        """The lifted graph's Python code (the unlifted module's `code`, less the wrappers)."""
        return self._program_graph.code

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Check the inputs, run the graph on the lifted values and them (or the payload's
        runner directly), rebuild the outputs."""
        return self._call(*args, **kwargs)

    __call__ = forward  # no nn.Module hooks: the call is the graph's (what torch.export gave)

    def _general(self, *args: Any, **kwargs: Any) -> Any:
        flat = self._check(args, kwargs)
        if self._direct is not None:
            out = self._direct(flat)
            if out is not None:
                return self._unflatten(out)
        return self._unflatten(self._graph(*self._lifted, *flat))

    def train(self, mode: bool = True) -> LeanModule:
        """`eval()` (mode False) is a no-op; a loaded program cannot train."""
        if mode:
            raise NotImplementedError(
                "a loaded program is inference only: train the model itself in PyTorch"
            )
        return self

    def _apply(self, fn: Any, recurse: bool = True) -> LeanModule:
        raise NotImplementedError(
            "a loaded program cannot be moved or cast: its compiled parts were built for "
            "one device and dtype (export again for another)"
        )


class LoadedProgram(ExportedProgram):
    """The ExportedProgram `chain.load` returns; `module()` is the lean callable.

    `module(lean=False)` gives torch's own unlifted module (for comparison).
    """

    def module(self, check_guards: bool = True, *, lean: bool = True) -> torch.nn.Module:
        """The program as a callable: `LeanModule` when it covers the program exactly."""
        if lean and check_guards:
            try:
                return LeanModule(self)
            except Unsupported as why:
                log.warning(
                    "loaded program runs through torch's module() (~50 us more a call): %s",
                    why,
                )
        return super().module(check_guards=check_guards)


def as_loaded(program: ExportedProgram) -> LoadedProgram:
    """The same program object, its class made `LoadedProgram` (no copy of its state)."""
    program.__class__ = LoadedProgram
    return program  # type: ignore[return-value]
