"""inductor's artefact: an AOTInductor package of one graph, and the machine it runs on.

A warm process that loads the package (`backends.inductor.runner`) skips inductor's own
start (its imports, the CPU ISA probe, header preprocessing, source hashing) and its
compile. Building one is a second compile: once the decision is kept, the chain calls
`chain_artefact_later` on inductor's compiled callable on the compiling thread (`prepare`:
the non-strict export, which patches torch for every thread and so cannot run beside the
user's calls), then runs the `PendingPackage` it returns in the background: AOTInductor
compiles in a child process (`backends.inductor.build`), so neither its config patches nor
its tracing nor the GIL touch the user's process.

Parameters and buffers stay graph inputs (a package holds no weights, ~2 MB), SymInt
inputs are read from the tensor shapes they come from, and symbolic sizes are exported as
dynamic dims with the ranges dynamo gave them. Bytes: a first line `inductor-package
<format> <header length>`, a JSON header (`Header`: the machine it was built for, how the
graph's inputs feed the package, its output structure), then the package (a zip).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from backends import cancel
from backends.common.onnx_prepare import prepare_graph, symbolic_dims
from backends.errors import Unsupported, one_line
from backends.inductor.build import compile_in_child
from backends.registry import Artefact

FORMAT = 1
MAGIC = b"inductor-package"
ENV = "CHAIN_INDUCTOR_PACKAGE"  # "0" / "off" / "false": no packages built (inductor as before)
# inductor settings a package is built without: CUDA graphs are the graphed variant's
# business (it replays the package), and the package is always a package
_NOT_FOR_PACKAGE = ("triton.cudagraphs", "aot_inductor.package", "cpp_wrapper")
# Seen on an H100 (torch 2.11.0+cu130, 2026-11-27): torch's loader segfaulted the process
# loading a CUDA package this module built (tests/test_inductor_package.py, both CUDA
# tests). Until a GPU run shows a CUDA package loading, none is built or loaded unless
# CHAIN_INDUCTOR_PACKAGE_CUDA=1 (the GPU checks: tests/test_inductor_package.py, cuda marker).
CUDA_ENV = "CHAIN_INDUCTOR_PACKAGE_CUDA"
NO_CUDA = (
    "no AOTInductor package on CUDA: torch's AOTIModelPackageLoader crashed the process "
    "(segfault) loading one on an H100 with torch 2.11"
)


def cuda_allowed() -> bool:
    """Whether CUDA packages are built and loaded (CHAIN_INDUCTOR_PACKAGE_CUDA=1)."""
    return os.environ.get(CUDA_ENV, "0").strip() == "1"


def enabled() -> bool:
    """Whether inductor offers packages to build (CHAIN_INDUCTOR_PACKAGE is not off)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@functools.cache
def compiler_version(cxx: str) -> str:
    """The first line of `cxx --version`: the C++ compiler that builds the package's
    library (inductor's `cpp.cxx`, default $CXX or g++); what it says when it cannot run."""
    try:
        done = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"{cxx}: {type(error).__name__}"
    return (done.stdout.strip().splitlines() or [f"{cxx}: no version"])[0]


def compiler_of(patches: Mapping[str, Any]) -> str:
    """The compiler inductor builds with under `patches` (its `cpp.cxx` default, read
    without importing inductor)."""
    cxx = patches.get("cpp.cxx")
    return str(cxx) if cxx else os.environ.get("CXX", "g++")


@functools.cache
def _cpu_flags() -> str:
    """A short digest of the CPU's feature flags (Linux: /proc/cpuinfo), else ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((ln for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return ""
    words = sorted(set(flags.partition(":")[2].split()))
    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:16]


def machine(device: torch.device, patches: Mapping[str, Any]) -> dict[str, Any]:
    """What a package's native code depends on: torch's version, the compiler, and the CPU
    capability (ATen's, no probe spawned, and the flags' digest) or the GPU and its compute
    capability. A package runs only where all of them are equal."""
    facts: dict[str, Any] = {"torch": torch.__version__, "compiler": None, "device": device.type}
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        facts.update(
            gpu=torch.cuda.get_device_name(index),
            capability=list(torch.cuda.get_device_capability(index)),
            cuda=torch.version.cuda,
        )
    else:
        facts.update(capability=torch.backends.cpu.get_cpu_capability(), flags=_cpu_flags())
    facts["compiler"] = compiler_version(compiler_of(patches))
    return facts


@dataclasses.dataclass(frozen=True)
class Header:
    """How a package is fed and what it answers: `kept` are the graph's input positions it
    takes (in order), `inputs` the graph's input count, `out_spec` torch's serialized
    pytree spec of its outputs, `dynamic` the dims exported as symbolic with their ranges,
    `built_for` the machine (`machine()`)."""

    kept: tuple[int, ...]
    inputs: int
    out_spec: str
    dynamic: dict[str, list[list[Any]]]
    built_for: dict[str, Any]


def encode(header: Header, package: bytes) -> bytes:
    text = json.dumps(dataclasses.asdict(header), sort_keys=True).encode()
    return MAGIC + f" {FORMAT} {len(text)}\n".encode() + text + package


def decode(data: bytes) -> tuple[Header, bytes]:
    """The header (its fields' types checked) and the package bytes; Unsupported otherwise."""
    first, _, rest = data.partition(b"\n")
    fields = first.split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC or not fields[2].isdigit():
        raise Unsupported(f"not an inductor package: {first[:60]!r}")
    if fields[1] != str(FORMAT).encode():
        raise Unsupported(f"inductor package format {fields[1][:20]!r}; this reads {FORMAT}")
    size = int(fields[2])
    try:
        raw = json.loads(rest[:size])
    except (ValueError, RecursionError) as error:
        raise Unsupported(f"inductor package header unreadable: {error}") from None
    names = {f.name for f in dataclasses.fields(Header)}
    if not isinstance(raw, dict) or set(raw) != names:
        raise Unsupported("inductor package header: fields missing or unknown")
    kept = raw["kept"]
    ok = (
        isinstance(kept, list)
        and all(type(i) is int and 0 <= i < 2**20 for i in kept)
        and type(raw["inputs"]) is int
        and all(i < raw["inputs"] for i in kept)
        and isinstance(raw["out_spec"], str)
        and isinstance(raw["dynamic"], dict)
        and isinstance(raw["built_for"], dict)
    )
    if not ok:
        raise Unsupported("inductor package header: a field has the wrong type")
    header = Header(tuple(kept), raw["inputs"], raw["out_spec"], raw["dynamic"], raw["built_for"])
    return header, rest[size:]


def _device_of(inputs: Sequence[Any]) -> torch.device:
    devices = {x.device for x in inputs if isinstance(x, torch.Tensor)}
    if len(devices) != 1:
        raise Unsupported(f"inputs on {len(devices)} devices: a package runs on one")
    return devices.pop()


def _ranges(gm: fx.GraphModule, inputs: Sequence[Any]) -> dict[int, dict[int, list[Any]]]:
    """Per input position, per symbolic dim: [min, max] of dynamo's range (max None: none)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found: dict[int, dict[int, list[Any]]] = {}
    for i, dims in symbolic_dims(gm, inputs).items():
        value = placeholders[i].meta.get("example_value")
        for d in dims:
            lo, hi = 0, None
            size = value.shape[d] if isinstance(value, torch.Tensor) else None
            if isinstance(size, torch.SymInt):
                node = size.node
                bound = node.shape_env.bound_sympy(node.expr)
                lo = int(bound.lower) if bound.lower.is_Integer else 0
                hi = int(bound.upper) if bound.upper.is_Integer else None
            found.setdefault(i, {})[d] = [lo, hi]
    return found


def _dynamic_shapes(kept: Sequence[int], ranges: Mapping[int, Mapping[int, list[Any]]]) -> Any:
    """torch.export's dynamic_shapes for the kept inputs; None without symbolic sizes."""
    if not any(i in ranges for i in kept):
        return None
    dim = torch.export.Dim.DYNAMIC
    return tuple(
        {d: dim(min=lo, max=hi) if hi is not None else dim(min=lo) for d, (lo, hi) in r.items()}
        if (r := ranges.get(i))
        else None
        for i in kept
    )


def _plain(value: torch.Tensor) -> torch.Tensor:
    """A tensor to trace with: detached, and a normal tensor (an inference tensor, made under
    inference_mode, cannot be fakified by the exporter)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, FakeTensor):
        raise Unsupported("example inputs are fake tensors: a package needs real ones")
    value = value.detach()
    return value.clone() if value.is_inference() else value


def _exported(gm: fx.GraphModule, inputs: Sequence[Any]) -> tuple[Any, tuple[int, ...], dict]:
    """The graph as a non-strict ExportedProgram of its kept inputs (weights included), and
    those positions and the dynamic dims' ranges; Unsupported with the exporter's reason."""
    prepared = prepare_graph(gm, inputs, frozen=())
    ranges = _ranges(gm, inputs)
    args = tuple(_plain(inputs[i]) for i in prepared.kept)
    shapes = _dynamic_shapes(prepared.kept, ranges)
    try:
        with cancel.process_wide(), torch.inference_mode(False), torch.no_grad():
            program = torch.export.export(prepared.module.eval(), args, dynamic_shapes=shapes)
    except cancel.Cancelled:
        raise
    except Exception as error:
        reason = f"torch.export (non-strict): {one_line(error)}"
        raise Unsupported(("dynamic shapes: " if shapes else "") + reason) from error
    signature = program.graph_signature
    if signature.user_inputs_to_mutate or signature.buffers_to_mutate:
        raise Unsupported("the graph writes to its inputs: not packaged")
    output = program.graph.output_node()
    leaves = torch.utils._pytree.tree_leaves(output.args[0])
    if not all(isinstance(getattr(n, "meta", {}).get("val"), torch.Tensor) for n in leaves):
        raise Unsupported("an output is not a tensor: not packaged")
    return program, prepared.kept, ranges


@dataclasses.dataclass(frozen=True)
class PendingPackage:
    """An exported graph waiting for its AOTInductor compile: the program saved in a private
    folder (`torch.export.save`), the inductor settings, and the header the package gets."""

    folder: str
    configs: dict[str, Any]
    header: Header
    # releases the folder's removal at exit (`backends.cancel.leftover`): a build still
    # queued when the process leaves is never called, and its folder goes with it
    release: Callable[[], None] = lambda: None

    def __call__(self) -> Artefact:
        """Compile the package in a child process; Unsupported with its reason on failure.
        The folder is removed after, whatever happens."""
        try:
            package = compile_in_child(self.folder, self.configs)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.release()
        return Artefact(encode(self.header, package), reads=())


def prepare(
    gm: fx.GraphModule, example_inputs: Sequence[Any], patches: Mapping[str, Any]
) -> PendingPackage:
    """Export the graph (on a clean thread, process-wide) and save the program for its
    package build; Unsupported when it cannot be exported or packaged."""
    from torch.utils._pytree import treespec_dumps

    from backends.common.onnx_export import _in_clean_thread

    inputs = list(example_inputs)
    device = _device_of(inputs)
    if device.type == "cuda" and not cuda_allowed():
        raise Unsupported(NO_CUDA)
    configs = {k: v for k, v in patches.items() if k not in _NOT_FOR_PACKAGE}
    try:
        json.dumps(configs)
    except (TypeError, ValueError) as error:
        raise Unsupported(f"inductor options a child process cannot take: {error}") from None
    program, kept, ranges = _in_clean_thread(_exported, gm, inputs)
    header = Header(
        kept=tuple(kept),
        inputs=len(inputs),
        out_spec=treespec_dumps(program.call_spec.out_spec),
        dynamic={str(i): [[d, *r] for d, r in dims.items()] for i, dims in ranges.items()},
        built_for=machine(device, patches),
    )
    folder = tempfile.mkdtemp(prefix="chain-aoti-build-")  # 0700, made exclusively
    try:
        torch.export.save(program, os.path.join(folder, "program.pt2"))
    except Exception as error:
        shutil.rmtree(folder, ignore_errors=True)
        raise Unsupported(f"the exported program cannot be saved: {one_line(error)}") from error
    release = cancel.leftover(functools.partial(shutil.rmtree, folder, ignore_errors=True))
    return PendingPackage(folder, configs, header, release)


def offer_package(
    fn: Callable[..., Any], gm: fx.GraphModule, example_inputs: list[Any], patches: dict
) -> Callable[..., Any]:
    """`fn` offering its package build as `chain_artefact_later` (unless CHAIN_INDUCTOR_PACKAGE
    is off): called on the compiling thread, it exports the graph and returns the build to
    run in the background; `fn` is wrapped when inductor's callable takes no attributes.
    Used by inductor's compile and by its CUDA graphs variant's (built without CUDA graphs)."""
    if not enabled():
        return fn

    def later() -> Any:
        return prepare(gm, example_inputs, patches)

    try:
        fn.chain_artefact_later = later  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        fn = functools.partial(fn)
        fn.chain_artefact_later = later  # type: ignore[attr-defined]
    return fn
