"""inductor: torch's own compiler through dynamo's entry; options pass through to it.

`mode` takes torch.compile's inductor modes (`torch._inductor.list_mode_options()`:
default, lite, reduce-overhead, max-autotune-no-cudagraphs, max-autotune); every other
option is an inductor config override (`config`) and wins over the mode's settings. A mode
that turns on CUDA graphs (`triton.cudagraphs`) compiles through `graphed`, which checks
the preconditions, turns torch's silent skips into reasons and keeps outputs safe; the same
module is its CUDA graphs variant (`inductor+graphs`), registered here.

Its artefact is an AOTInductor package of the graph (`package`): the compiled callable
offers to build one (`chain_artefact_later`, a second compile the chain runs off the
caller's thread, in a child process: `build`), and `reuse` loads one without importing or
running inductor (`runner`). Loading a package runs its native code: the backend declares
`native_artefacts`, and the chain loads them only from a store the user trusts. Exported
(`deploy`), a package is signed under CHAIN_PROGRAM_KEY and loads only where the same key
is set. `isa` remembers inductor's CPU vector-ISA verdict so warm processes hit its caches.

The modules import one another in one direction only, none of them this file: `graphed`
and `deploy` import `package` and `runner`; `isa` and `runner` import `package`; `package`
imports `build`; `build` and `config` import nothing of inductor's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.errors import Unsupported
from backends.inductor import isa
from backends.inductor.config import check_mode, config_options, config_patches
from backends.inductor.deploy import export_parts, load_payload
from backends.inductor.graphed import compile_graphed, reuse_graphed
from backends.inductor.package import ENV as PACKAGE_ENV
from backends.inductor.package import enabled as packages_enabled
from backends.inductor.package import offer_package, prepare
from backends.inductor.runner import load
from backends.registry import Artefact, register_backend, registry


def inductor_reuse(
    gm: fx.GraphModule,
    example_inputs: list[Any],
    *,
    artefact: bytes,
    mode: str | None = None,
    cuda_graphs: bool = False,
    **options: Any,
) -> Callable[..., Any]:
    """inductor's compile from its stored package: loaded, nothing compiled (a package for
    another machine or graph is Unsupported, saying which). `cuda_graphs`: for its CUDA
    graphs variant (`inductor+graphs`), the package replayed as CUDA graphs."""
    patches = config_patches(mode, options)
    if cuda_graphs or patches.get("triton.cudagraphs"):
        return reuse_graphed(gm, example_inputs, artefact, patches)
    return load(artefact, example_inputs, patches)


def inductor_prepare(
    gm: fx.GraphModule, example_inputs: list[Any], *, mode: str | None = None, **options: Any
) -> Callable[[], Artefact]:
    """inductor's package build without its compile here: the graph exported on this
    thread, the package compiled in a child when the returned build runs (`reuse` loads
    it). Unsupported when packages are off or cannot be built for this graph."""
    if not packages_enabled():
        raise Unsupported(f"inductor packages are off ({PACKAGE_ENV})")
    # the ISA verdict if one is kept: a first probe (seconds of C++) runs in the child
    patches = isa.stable(config_patches(mode, options), example_inputs, probe_now=False)
    return prepare(gm, example_inputs, patches)


@register_backend(
    "inductor",
    options={"mode": check_mode},
    vocabulary=config_options,
    vocabulary_doc="a name of torch._inductor.config (torch._inductor.list_options())",
    reuse=inductor_reuse,
    prepare=inductor_prepare,
    native_artefacts=True,
    exporter=export_parts,
    loader=load_payload,
)
def inductor(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], mode: str | None = None, **options: Any
) -> Callable[..., Any]:
    """Compile with TorchInductor; `mode` is an inductor mode, `options` config overrides."""
    from torch._inductor.compile_fx import compile_fx

    patches = config_patches(mode, options)
    if patches.get("triton.cudagraphs"):
        return compile_graphed(gm, example_inputs, patches)
    # one FX cache key across processes; a stale verdict is dropped and the compile retried
    fn, patches = isa.compile_healed(
        lambda chosen: compile_fx(gm, example_inputs, config_patches=chosen or None),
        patches,
        example_inputs,
    )
    return offer_package(fn, gm, example_inputs, patches)


@registry.graphed_variant("inductor")
def inductor_graphed(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], mode: str | None = None, **options: Any
) -> Callable[..., Any]:
    """inductor with the same mode and options, replayed as CUDA graphs (reduce-overhead)."""
    return compile_graphed(gm, example_inputs, config_patches(mode, options))
