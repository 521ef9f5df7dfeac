"""inductor: torch's own compiler through dynamo's entry; options pass through to it.

`mode` takes torch.compile's inductor modes (`torch._inductor.list_mode_options()`:
default, lite, reduce-overhead, max-autotune-no-cudagraphs, max-autotune); every other
option is an inductor config override and wins over the mode's settings. A mode that
turns on CUDA graphs (`triton.cudagraphs`) compiles through `inductor_graphed`, which
checks the preconditions, turns torch's silent skips into reasons and keeps outputs safe.

Its artefact is an AOTInductor package of the graph (`backends.inductor_package`): the
compiled callable offers to build one (`chain_artefact_later`, a second compile the chain
runs off the caller's thread), and `reuse` loads one without importing or running
inductor (`backends.inductor_runner`). Loading a package runs its native code: the backend
declares `native_artefacts`, and the chain loads them only from a store the user trusts.
Exported (`backends.inductor_deploy`), a package is signed under CHAIN_PROGRAM_KEY and
loads only where the same key is set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends import inductor_isa, inductor_package
from backends.inductor_config import check_mode, config_options, config_patches
from backends.inductor_deploy import export_parts, load_payload
from backends.registry import register_backend


def offer_package(
    fn: Callable[..., Any], gm: fx.GraphModule, example_inputs: list[Any], patches: dict
) -> Callable[..., Any]:
    """`fn` offering its package build as `chain_artefact_later` (unless CHAIN_INDUCTOR_PACKAGE
    is off): called on the compiling thread, it exports the graph and returns the build to
    run in the background; `fn` is wrapped when inductor's callable takes no attributes."""
    if not inductor_package.enabled():
        return fn

    def later() -> Any:
        return inductor_package.prepare(gm, example_inputs, patches)

    try:
        fn.chain_artefact_later = later  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        fn = functools.partial(fn)
        fn.chain_artefact_later = later  # type: ignore[attr-defined]
    return fn


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
    from backends.inductor_runner import load

    patches = config_patches(mode, options)
    if cuda_graphs or patches.get("triton.cudagraphs"):
        from backends.inductor_graphed import reuse_graphed

        return reuse_graphed(gm, example_inputs, artefact, patches)
    return load(artefact, example_inputs, patches)


@register_backend(
    "inductor",
    options={"mode": check_mode},
    vocabulary=config_options,
    vocabulary_doc="a name of torch._inductor.config (torch._inductor.list_options())",
    reuse=inductor_reuse,
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
        from backends.inductor_graphed import compile_graphed

        return compile_graphed(gm, example_inputs, patches)
    # one FX cache key across processes; a stale verdict is dropped and the compile retried
    fn, patches = inductor_isa.compile_healed(
        lambda chosen: compile_fx(gm, example_inputs, config_patches=chosen or None),
        patches,
        example_inputs,
    )
    return offer_package(fn, gm, example_inputs, patches)
