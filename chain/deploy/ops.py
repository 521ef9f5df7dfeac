"""The custom op `backend_chain::run_payload`: a compiled part inside an ExportedProgram.

`run_payload(inputs, payload, outputs) -> list[Tensor]`: `payload` is the uint8 tensor
constant (see `backends.common.payload`), `outputs` the JSON output specs the fake implementation
reads (a fake payload tensor has no bytes to parse). Importing `chain` registers the op,
which is what `torch.export.load` needs. Sessions and engines are built at the first run of
a payload, by the loader of the backend its header names (found in the registry), and
cached per process, keyed by the body's SHA-256 and the device.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from backends.common.parts import Runner
from backends.common.payload import (
    Binding,
    Header,
    PayloadError,
    PayloadMismatch,
    binding_from_str,
    check_binding,
    check_outputs,
    declared_specs,
    specs_from_str,
    tensor_bytes,
    unpack,
    verify_body,
)
from backends.registry import registry

OP_NAME = "backend_chain::run_payload"

_lock = threading.Lock()
_runners: dict[tuple[str, str], Runner] = {}  # (sha256, device) -> runner
_by_tensor: dict[tuple[int, str, str], tuple[weakref.ref[torch.Tensor], Runner]] = {}
_stats = {"built": 0}


def _device_of(inputs: Sequence[torch.Tensor]) -> torch.device:
    return inputs[0].device if inputs else torch.device("cpu")


def build_runner(header: Header, body: bytes, device: torch.device) -> Runner:
    """The runner of a payload, from the loader of the backend that built it."""
    loader = registry.loader(header.backend)
    if loader is None:
        known = ", ".join(registry.exportable_names()) or "none"
        raise PayloadError(
            f"payload for unknown backend {header.backend!r}: no registered backend loads "
            f"it (loaders: {known}); import the package that registers {header.backend!r}"
        )
    return loader(header, body, device)


def runner_for(payload: torch.Tensor, device: torch.device, outputs: str = "") -> Runner:
    """The cached runner of `payload` on `device`; built (and checked) at the first call.

    `outputs` is the node's string argument: the payload must be the one it is bound to.
    """
    key = (id(payload), str(device), outputs)
    hit = _by_tensor.get(key)
    if hit is not None and hit[0]() is payload:
        return hit[1]
    with _lock:
        data = tensor_bytes(payload)
        check_binding(binding_from_str(outputs), data)
        header, body = unpack(data)
        cache_key = (header.sha256, str(device))
        runner = _runners.get(cache_key)
        if runner is None:
            verify_body(header, body)
            runner = build_runner(header, bytes(body), device)
            _runners[cache_key] = runner
            _stats["built"] += 1
        check_bound(runner, binding_from_str(outputs), outputs)
        _by_tensor[key] = (weakref.ref(payload), runner)
    return runner


def check_bound(runner: Runner, binding: Binding, outputs: str) -> None:
    """A runner whose payload carries a signed binding (`runner.bound`: inductor's packages)
    serves only the node that binding names: its part, its program id and its declared
    output specs (shape and dtype); PayloadMismatch otherwise."""
    bound = getattr(runner, "bound", None)
    if bound is None:
        return
    where = f"payload of part {binding.part or '?'}"
    if bound.get("part") != binding.part or bound.get("program") != binding.program:
        raise PayloadMismatch(
            f"{where} is signed for part {str(bound.get('part'))[:40]!r} of program "
            f"{str(bound.get('program'))[:16]!r}, this node is part {binding.part[:40]!r} of "
            f"program {binding.program[:16]!r}: refused (a package moved between programs)"
        )
    declared = [(list(s.shape), s.dtype) for s in declared_specs(outputs)]
    signed = [(list(s.get("shape", [])), s.get("dtype")) for s in bound.get("outputs", [])]
    if declared != signed:
        raise PayloadMismatch(
            f"{where}: the program declares outputs {declared[:4]}, its signed binding "
            f"{signed[:4]}: refused (edited program or swapped payload)"
        )


def check_bound_inputs(runner: Runner, specs: Sequence[Any], where: str) -> None:
    """The program's input specs of a node (shape, dtype, strides per input, from its
    graph) are those the runner's signed binding names; PayloadMismatch otherwise."""
    bound = getattr(runner, "bound", None)
    if bound is None:
        return
    signed = [(list(s["shape"]), s["dtype"], list(s["stride"])) for s in bound["inputs"]]
    if list(specs) != signed:
        raise PayloadMismatch(
            f"{where}: the program feeds it {list(specs)[:4]}, its signed binding says "
            f"{signed[:4]}: refused (a package bound to another program)"
        )


def preload(header: Header, body: bytes, device: torch.device) -> Runner:
    """Build (or reuse) the runner of a payload being exported, so its first run is free."""
    with _lock:
        key = (header.sha256, str(device))
        if key not in _runners:
            _runners[key] = build_runner(header, body, device)
            _stats["built"] += 1
        return _runners[key]


def cache_info() -> dict[str, int]:
    """How many runners were built in this process and how many are cached (for tests)."""
    return {"built": _stats["built"], "cached": len(_runners)}


def clear_cache() -> None:
    """Drop every cached session and engine (they are rebuilt at the next run)."""
    with _lock:
        _runners.clear()
        _by_tensor.clear()


_SCHEMA = "run_payload(Tensor[] inputs, Tensor payload, str outputs) -> Tensor[]"
# A plain library op, not `torch.library.custom_op`: the latter wraps every call in two
# Python layers (its autograd function, a redispatch and an aliasing check), 13 us of the
# op's 18 us dispatch (`benchmarks/export_overhead.py`). Here one Python kernel sits at the
# Autograd key: plain tensors with no mode active run the payload there (~6 us in all);
# fake, functional or subclass tensors and dispatch modes are redispatched below autograd
# (to the fake implementation, or to the same kernel). The op has no gradient: when an
# input requires grad the outputs do too and backward raises. Aliasing is checked in the
# kernel (outputs that share an input's memory are copied).
_library = torch.library.Library("backend_chain", "DEF")
_library.define(_SCHEMA)
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_DENSE = frozenset((torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA))
_requires_grad = torch._C.TensorBase.requires_grad.__get__


def run_payload(
    inputs: list[torch.Tensor], payload: torch.Tensor, outputs: str
) -> list[torch.Tensor]:
    """Run the compiled part in `payload` on `inputs`."""
    results = runner_for(payload, _device_of(inputs), outputs)(inputs)
    check_outputs(results, outputs, inputs)  # what the node declares, every call (cheap)
    # an op may not return views of its inputs: ORT can hand back an input it passed
    # through unchanged (identity), so such outputs are copied
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    return [
        r.clone() if r.numel() and r.untyped_storage().data_ptr() in seen else r for r in results
    ]


def _fake(inputs: list[torch.Tensor], payload: torch.Tensor, outputs: str) -> list[torch.Tensor]:
    device = _device_of(inputs)
    return [
        torch.empty(spec.sizes(inputs), dtype=spec.torch_dtype, device=device)
        for spec in specs_from_str(outputs)
    ]


class _NoGradient(torch.autograd.Function):
    """The op when an input requires grad: outputs that do too, and a backward that raises."""

    @staticmethod
    def forward(ctx: Any, payload: torch.Tensor, outputs: str, *inputs: torch.Tensor) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return tuple(
                torch.ops.backend_chain.run_payload.default(list(inputs), payload, outputs)
            )

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        raise RuntimeError(
            f"{OP_NAME} has no gradient: a compiled part of an exported program runs "
            "inference only (run the model itself in PyTorch to train it)"
        )


def _autograd(
    keyset: Any, inputs: list[torch.Tensor], payload: torch.Tensor, outputs: str
) -> list[torch.Tensor]:
    """The Autograd kernel: run plain tensors here, redispatch anything else below autograd."""
    if torch.is_grad_enabled() and any(map(_requires_grad, inputs)):
        return list(_NoGradient.apply(payload, outputs, *inputs))
    below = keyset & _AFTER_AUTOGRAD
    if below.highestPriorityTypeId() in _DENSE:
        return run_payload(inputs, payload, outputs)
    return torch.ops.backend_chain.run_payload.default.redispatch(below, inputs, payload, outputs)


_library.impl("run_payload", run_payload, "CompositeExplicitAutograd")
_library.impl("run_payload", _autograd, "Autograd", with_keyset=True)
torch.library.register_fake(OP_NAME, _fake, lib=_library)
