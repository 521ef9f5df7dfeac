"""inductor's export hooks: the graph as a signed AOTInductor package, and its loader.

A package is a shared library: loading it runs its code. A program file is data from a
stranger until checked (`chain.load` refuses anything that runs code), so an inductor
part is exported only under a signing key, `CHAIN_PROGRAM_KEY`, and loads only in a
process that holds the same key: the body starts with an HMAC-SHA256 of the rest under
that key, checked (constant time) before anything else is read. No key at export: the
exporter declines with that reason and the chain exports the next candidate (ONNX
Runtime); no key, or another key, at load: a `PayloadError` naming the variable, before
the package is opened. Then the package must have been built for this machine (torch,
CPU capability and flags; `inductor_package.machine`), else `PayloadMismatch`. CPU only:
torch's loader crashed the process on a CUDA package (`inductor_package.NO_CUDA`), and
static shapes only (a program with dynamic shapes gets ONNX Runtime's dynamic axes).
"""

from __future__ import annotations

import hashlib
import hmac
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
from backends.inductor_package import NO_CUDA, decode, machine, prepare
from backends.inductor_runner import mismatch, open_package

NAME = "inductor"
KEY_ENV = "CHAIN_PROGRAM_KEY"
_MAGIC = b"chain-signed hmac-sha256 "
# the package's library links torch and needs the CPU's instructions; the compiler that
# built it does not matter once it is built (the store's key keeps it for its own reasons)
_NOT_COMPARED = ("compiler",)


def program_key() -> bytes | None:
    """The signing key from CHAIN_PROGRAM_KEY; None when unset or blank."""
    key = os.environ.get(KEY_ENV, "").strip()
    return key.encode() if key else None


def sign(key: bytes, data: bytes) -> bytes:
    """`data` behind one line with its HMAC-SHA256 under `key`."""
    return _MAGIC + hmac.new(key, data, hashlib.sha256).hexdigest().encode() + b"\n" + data


def signed_data(header: Header, body: bytes) -> bytes:
    """The signed bytes of `body`; PayloadError when there is no key or it does not match."""
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
    return data


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
    with torch.no_grad():
        outputs, _ = flat_outputs(gm(*flat))
    package = prepare(gm, flat, {})()  # exported, then compiled in a child process
    body = sign(key, package.data)
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
    )
    note = f"export: the whole graph as one AOTInductor package, signed ({KEY_ENV})"
    return ExportedParts(as_single_call(gm), {WHOLE: part}, note)


def load_payload(header: Header, body: bytes, device: torch.device) -> Runner:
    """The loader hook: the signature checked, then the package's machine, then torch's
    loader on a private copy; a runner of the flat inputs."""
    if device.type != "cpu" or header.device != "cpu":
        raise PayloadMismatch(f"{header.describe()} package for {header.device}: {NO_CUDA}")
    data = signed_data(header, body)
    try:
        package_header, package = decode(data)
    except Unsupported as error:
        raise PayloadError(f"{header.describe()} payload: {error.reason}") from None
    built_for = {k: v for k, v in package_header.built_for.items() if k not in _NOT_COMPARED}
    here = {k: v for k, v in machine(device, {}).items() if k not in _NOT_COMPARED}
    why = mismatch(built_for, here)
    if why is not None:
        raise PayloadMismatch(f"AOTInductor package {why}: export it again on this machine")
    try:
        loader = open_package(package, -1)
    except Unsupported as error:
        raise PayloadMismatch(error.reason) from error
    run, kept = loader.run, package_header.kept

    def runner(inputs: Sequence[Any]) -> list[torch.Tensor]:
        return list(run([inputs[i] for i in kept]))

    return runner
