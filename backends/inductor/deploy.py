"""inductor's export hooks: the graph as a signed AOTInductor package, and its loader.

A package is a shared library: loading it runs its code. A program file is data from a
stranger until checked (`chain.load` refuses anything that runs code), so an inductor
part is exported only under a signing key, `CHAIN_PROGRAM_KEY`, and loads only in a
process that holds the same key. The body is one line with an HMAC-SHA256 under that key
of what follows: the binding (one JSON line: the part's name, the program id its node
carries, the input and output specs with strides, the package's SHA-256, the machine)
and the package. The HMAC is checked (constant time) before anything else is read; the
package must be the one the binding names and built for this machine (torch, CPU
capability and flags; `package.machine`), else `PayloadMismatch`. The runner
(`BoundRunner`) exposes the binding as `bound`: `chain.deploy` checks it against the
program's node (part, id, declared outputs, the graph's input specs), and every call's
inputs and outputs are checked against it. No key at export: the exporter declines with
that reason and the chain exports the next candidate (ONNX Runtime). CPU only: torch's
loader crashed the process on a CUDA package (`package.NO_CUDA`), and static
shapes only (a program with dynamic shapes gets ONNX Runtime's dynamic axes).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from backends.common.parts import (
    WHOLE,
    ExportedParts,
    ExportRequest,
    Part,
    Runner,
    as_single_call,
    flat_outputs,
)
from backends.common.payload import Header, PayloadError, PayloadMismatch, TensorSpec, digest
from backends.errors import Unsupported
from backends.inductor.package import NO_CUDA, decode, machine, prepare
from backends.inductor.runner import mismatch, open_package

NAME = "inductor"
KEY_ENV = "CHAIN_PROGRAM_KEY"
_MAGIC = b"chain-signed hmac-sha256 "
BINDING_FORMAT = 2  # 2: the signature covers the binding (part, program, specs, digest)
# the package's library links torch and needs the CPU's instructions; the compiler that
# built it does not matter once it is built (the store's key keeps it for its own reasons)
_NOT_COMPARED = ("compiler",)


def program_key() -> bytes | None:
    """The signing key from CHAIN_PROGRAM_KEY; None when unset or blank."""
    key = os.environ.get(KEY_ENV, "").strip()
    return key.encode() if key else None


def spec_of(tensor: torch.Tensor) -> dict[str, Any]:
    """What a binding says of one tensor: shape, dtype and strides."""
    return {
        "shape": [int(s) for s in tensor.shape],
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "stride": [int(s) for s in tensor.stride()],
    }


def binding(
    part: str,
    program: str,
    inputs: Sequence[torch.Tensor],
    outputs: Sequence[torch.Tensor],
    package: bytes,
    built_for: dict[str, Any],
) -> dict[str, Any]:
    """What a signature binds a package to: the part and program it serves, their input and
    output specs (shape, dtype, strides), the package's digest and the machine."""
    return {
        "format": BINDING_FORMAT,
        "part": part,
        "program": program,
        "inputs": [spec_of(t) for t in inputs],
        "outputs": [spec_of(t) for t in outputs],
        "package_sha256": hashlib.sha256(package).hexdigest(),
        "machine": built_for,
    }


def sign(key: bytes, bound: dict[str, Any], package: bytes) -> bytes:
    """The body: one line with the HMAC-SHA256 under `key` of the binding (one JSON line)
    and the package that follow it."""
    data = json.dumps(bound, sort_keys=True).encode() + b"\n" + package
    return _MAGIC + hmac.new(key, data, hashlib.sha256).hexdigest().encode() + b"\n" + data


def signed_data(header: Header, body: bytes) -> tuple[dict[str, Any], bytes]:
    """The signed binding and package of `body`; PayloadError when there is no key, it does
    not match, or the binding is not one this version reads."""
    first, _, data = body.partition(b"\n")
    if not first.startswith(_MAGIC):
        raise PayloadError(f"{header.describe()} payload is not signed: refused (native code)")
    key = program_key()
    if key is None:
        raise PayloadError(
            f"this program has an AOTInductor package ({header.describe()}): native code, "
            f"loaded only with the key it was signed with; set {KEY_ENV} to the exporting "
            "side's key (or export it again without the key, for ONNX Runtime)"
        )
    want = hmac.new(key, data, hashlib.sha256).hexdigest().encode()
    if not hmac.compare_digest(first[len(_MAGIC) :], want):
        raise PayloadError(
            f"the AOTInductor package ({header.describe()}) is not signed with this "
            f"process's {KEY_ENV}: refused, it is not loaded"
        )
    line, _, package = data.partition(b"\n")
    try:
        bound = json.loads(line)
    except ValueError:
        bound = None
    if not isinstance(bound, dict) or bound.get("format") != BINDING_FORMAT:
        raise PayloadError(
            f"the AOTInductor package ({header.describe()}) is signed without the binding "
            "to its program this version requires: refused; export it again"
        )
    if not hmac.compare_digest(
        str(bound.get("package_sha256", "")), hashlib.sha256(package).hexdigest()
    ):
        raise PayloadError("the AOTInductor package is not the one its binding names: refused")
    return bound, package


def _program_id(gm: torch.fx.GraphModule, package: bytes) -> str:
    """The id a package's binding and its program's node share: the graph's code and the
    package (its weights included), digested."""
    h = hashlib.sha256(gm.code.encode())
    h.update(hashlib.sha256(package).digest())
    return h.hexdigest()[:32]


def export_parts(request: ExportRequest) -> ExportedParts | None:
    """The exporter hook: the whole graph as one signed package when inductor won it or
    passed; Unsupported (the reason export notes) without a key, with dynamic shapes, on
    CUDA, or when the package cannot be built."""
    if not request.won and not request.untaken:
        return None
    key = program_key()
    if key is None:
        raise Unsupported(
            f"its AOTInductor package is native code: exported only under a signing key "
            f"({KEY_ENV}, which the loading process must hold too)"
        )
    if request.dynamic_dims:
        raise Unsupported("dynamic shapes: AOTInductor packages are exported static")
    gm, flat = request.gm, request.flat_inputs
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in flat):
        raise Unsupported(NO_CUDA)
    if not all(isinstance(x, torch.Tensor) for x in flat):
        raise Unsupported("an input is not a tensor: a package's binding names tensor specs")
    with torch.no_grad():
        outputs, _ = flat_outputs(gm(*flat))
    package = prepare(gm, flat, {})()  # exported, then compiled in a child process
    package_header, _ = decode(package.data)
    program = _program_id(gm, package.data)
    bound = binding(WHOLE, program, flat, outputs, package.data, package_header.built_for)
    body = sign(key, bound, package.data)
    header = Header(
        backend=NAME,
        version=str(torch.__version__),
        sha256=digest(body),
        input_names=(),
        output_names=(),
        outputs=tuple(TensorSpec.of(t) for t in outputs),
        device="cpu",
    )
    part = Part(
        name=WHOLE,
        header=header,
        body=body,
        input_positions=tuple(range(len(flat))),
        returns_tuple=True,
        ops=sum(1 for n in gm.graph.nodes if n.op == "call_function"),
        example_inputs=flat,
        expected=tuple(outputs),
        graph=gm,
        program=program,
    )
    note = f"export: the whole graph as one AOTInductor package, signed ({KEY_ENV})"
    return ExportedParts(as_single_call(gm), {WHOLE: part}, note)


class BoundRunner:
    """A package's runner that answers only as its signed binding says: each call's inputs
    have the bound count, shapes and dtypes (strides made contiguous where the binding's
    are), and its outputs the bound shapes and dtypes (`bound`: what loaders check against
    the program's node)."""

    def __init__(self, run: Any, kept: Sequence[int], bound: dict[str, Any]) -> None:
        self._run, self._kept, self.bound = run, tuple(kept), bound
        self._inputs = [_spec_tuple(s) for s in bound["inputs"]]
        self._outputs = [_spec_tuple(s)[:2] for s in bound["outputs"]]

    def __call__(self, inputs: Sequence[Any]) -> list[torch.Tensor]:
        if len(inputs) != len(self._inputs):
            raise PayloadMismatch(
                f"AOTInductor package called with {len(inputs)} inputs, bound to "
                f"{len(self._inputs)}: refused"
            )
        fed = []
        for k, (x, (shape, dtype, stride)) in enumerate(zip(inputs, self._inputs, strict=True)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != shape or _dt(x) != dtype:
                got = f"{tuple(x.shape)} {_dt(x)}" if isinstance(x, torch.Tensor) else type(x)
                raise PayloadMismatch(
                    f"AOTInductor package input {k} is {got}, its binding says {shape} "
                    f"{dtype}: refused (a package reads only what it was built for)"
                )
            if tuple(x.stride()) != stride:
                x = x.contiguous()
                if tuple(x.stride()) != stride:
                    raise PayloadMismatch(
                        f"AOTInductor package input {k} has strides {tuple(x.stride())}, "
                        f"its binding says {stride}: refused"
                    )
            fed.append(x.resolve_conj().resolve_neg())
        results = list(self._run([fed[i] for i in self._kept]))
        got = [(tuple(r.shape), _dt(r)) for r in results]
        if got != self._outputs:
            raise PayloadMismatch(
                f"AOTInductor package answered {got[:4]}, its binding says "
                f"{self._outputs[:4]}: refused"
            )
        return results


def _dt(tensor: Any) -> str:
    return str(getattr(tensor, "dtype", type(tensor).__name__)).removeprefix("torch.")


def _spec_tuple(spec: Any) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
    """A binding's tensor spec as (shape, dtype, strides); PayloadError when malformed."""
    try:
        shape = tuple(int(s) for s in spec["shape"])
        stride = tuple(int(s) for s in spec["stride"])
        dtype = spec["dtype"]
    except (KeyError, TypeError, ValueError):
        raise PayloadError(
            f"unreadable tensor spec in a package binding: {str(spec)[:80]}"
        ) from None
    if not isinstance(dtype, str) or len(shape) != len(stride):
        raise PayloadError(f"unreadable tensor spec in a package binding: {str(spec)[:80]}")
    return shape, dtype, stride


def load_payload(header: Header, body: bytes, device: torch.device) -> Runner:
    """The loader hook: the signature checked, then the binding against the package's own
    header (its machine, its input count), then torch's loader on a private copy; a runner
    of the flat inputs bound to the signed specs (`BoundRunner`)."""
    if device.type != "cpu" or header.device != "cpu":
        raise PayloadMismatch(f"{header.describe()} package for {header.device}: {NO_CUDA}")
    bound, data = signed_data(header, body)
    try:
        package_header, package = decode(data)
    except Unsupported as error:
        raise PayloadError(f"{header.describe()} payload: {error.reason}") from None
    if bound.get("machine") != package_header.built_for:
        raise PayloadMismatch("AOTInductor package: its binding names another machine: refused")
    if not isinstance(bound.get("inputs"), list) or not isinstance(bound.get("outputs"), list):
        raise PayloadError("AOTInductor package binding without input and output specs")
    if len(bound["inputs"]) != package_header.inputs:
        raise PayloadMismatch(
            f"AOTInductor package takes {package_header.inputs} inputs, its binding names "
            f"{len(bound['inputs'])}: refused"
        )
    bound_outputs = [list(_spec_tuple(s)[:2]) for s in bound["outputs"]]
    declared = [[tuple(int(d) for d in s.shape), s.dtype] for s in header.outputs]
    if [[tuple(o[0]), o[1]] for o in bound_outputs] != declared:
        raise PayloadMismatch(
            "AOTInductor package: the outputs its payload header declares are not the ones "
            "its binding signs: refused"
        )
    built_for = {k: v for k, v in package_header.built_for.items() if k not in _NOT_COMPARED}
    here = {k: v for k, v in machine(device, {}).items() if k not in _NOT_COMPARED}
    why = mismatch(built_for, here)
    if why is not None:
        raise PayloadMismatch(f"AOTInductor package {why}: export it again on this machine")
    runner = BoundRunner(None, package_header.kept, bound)  # specs checked before opening
    try:
        loader = open_package(package, -1)
    except Unsupported as error:
        raise PayloadMismatch(error.reason) from error
    runner._run = loader.run
    return runner
