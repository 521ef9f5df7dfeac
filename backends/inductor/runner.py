"""Run an inductor package (`backends.inductor.package`) without importing inductor.

torch's own loader (`torch._C._aoti.AOTIModelPackageLoader`) opens the package and loads
its shared library: nothing compiles, and inductor's start (imports, the CPU ISA probe
that `aoti_load_package` runs) is skipped. Loading runs the library's code, so the bytes
go to a private file first (a 0700 folder, created exclusively, 0600) and only after the
package was checked to be built for this machine (torch, compiler, CPU capability or GPU).
Whether the bytes may be trusted at all is the caller's business (the chain loads
packages only from a store the user trusts: see docs/trust.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from backends.common.files import private_file
from backends.errors import Unsupported, one_line
from backends.inductor.package import NO_CUDA, Header, cuda_allowed, decode, machine


def mismatch(built_for: Mapping[str, Any], here: Mapping[str, Any]) -> str | None:
    """Why a package built for `built_for` cannot run `here` (the first fact that differs)."""
    for name in sorted(set(built_for) | set(here)):
        if built_for.get(name) != here.get(name):
            return (
                f"built for {name} {str(built_for.get(name))[:60]!r}, "
                f"this machine has {str(here.get(name))[:60]!r}"
            )
    return None


class PackageRunner:
    """The graph's compiled callable from its package: feeds the kept inputs, returns the
    outputs in the graph's structure."""

    def __init__(self, loader: Any, header: Header, device: torch.device) -> None:
        self._run = loader.run
        self._kept = header.kept
        self._spec = pytree.treespec_loads(header.out_spec)
        self.device = device
        self.chain_details: dict[str, Any] = {
            "from_package": True,  # AOTInductor: nothing compiled, inductor not imported
            "dynamic_dims": header.dynamic,
        }

    def __call__(self, *args: Any) -> Any:
        outputs = self._run([args[i] for i in self._kept])
        return pytree.tree_unflatten(outputs, self._spec)


def load(data: bytes, example_inputs: Sequence[Any], patches: Mapping[str, Any]) -> PackageRunner:
    """The runner of the package in `data` for a graph with these inputs; Unsupported when
    it was built for another machine or another graph's inputs, or torch cannot load it."""
    header, package = decode(data)
    devices = {x.device for x in example_inputs if isinstance(x, torch.Tensor)}
    if len(devices) != 1:
        raise Unsupported(f"inputs on {len(devices)} devices: a package runs on one")
    device = devices.pop()
    if (device.type == "cuda" or header.built_for.get("device") == "cuda") and not cuda_allowed():
        raise Unsupported(NO_CUDA)  # never built; one from elsewhere is not loaded either
    if header.inputs != len(example_inputs):
        raise Unsupported(
            f"inductor package takes {header.inputs} inputs, the graph has {len(example_inputs)}"
        )
    if (why := mismatch(header.built_for, machine(device, patches))) is not None:
        raise Unsupported(f"inductor package {why}")
    index = device.index if device.index is not None else -1
    if device.type == "cuda" and index < 0:
        index = torch.cuda.current_device()
    return PackageRunner(open_package(package, index), header, device)


def open_package(package: bytes, index: int) -> Any:
    """torch's loader of `package` (checked bytes) from a private copy; Unsupported when
    torch cannot load it."""
    with private_file(package, "graph.pt2") as path:
        try:
            return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
        except Exception as error:  # torch's loader raises RuntimeError on a bad package
            raise Unsupported(f"inductor package cannot be loaded: {one_line(error)}") from error
