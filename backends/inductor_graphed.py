"""inductor's CUDA graphs variant: its own reduce-overhead machinery, with honest skips.

`triton.cudagraphs=True` is what `mode="reduce-overhead"` sets: inductor fuses kernels,
then replays the whole graph through torch's cudagraph trees, with parameters and
buffers as static inputs (aot_autograd's `static_input_indices`, read from dynamo's
marks). Like `backends.cudagraphs`, this module checks the preconditions first, watches
torch's skip counter during compile and two probe calls (a skip is `Unsupported` with
torch's reason, not an eager win), and clones the outputs that live in replay buffers.
Its artefact is inductor's package (`backends.inductor_package`, built without CUDA
graphs), which `reuse_graphed` loads and replays through torch's cudagraph trees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.cudagraphs import capture, refuse_unless_graphable
from backends.inductor_config import config_patches
from backends.registry import registry


def compile_graphed(
    gm: fx.GraphModule, example_inputs: list[Any], patches: dict[str, Any]
) -> Callable[..., Any]:
    """compile_fx with `patches` and CUDA graphs on; outputs cloned; skips become reasons."""
    from torch._inductor.compile_fx import compile_fx

    refuse_unless_graphable(gm, example_inputs)
    patches = {**patches, "triton.cudagraphs": True}
    run, details = capture(
        lambda: compile_fx(gm, example_inputs, config_patches=patches), gm, example_inputs
    )
    run.chain_details = details  # type: ignore[attr-defined]
    from backends.inductor import offer_package  # its package: the same, without CUDA graphs

    return offer_package(run, gm, example_inputs, patches)


@registry.graphed_variant("inductor")
def inductor_graphed(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], mode: str | None = None, **options: Any
) -> Callable[..., Any]:
    """inductor with the same mode and options, replayed as CUDA graphs (reduce-overhead)."""
    return compile_graphed(gm, example_inputs, config_patches(mode, options))


def reuse_graphed(
    gm: fx.GraphModule, example_inputs: list[Any], artefact: bytes, patches: dict[str, Any]
) -> Callable[..., Any]:
    """inductor under CUDA graphs from its stored package: the package (built without CUDA
    graphs) loaded with torch's loader, then replayed through torch's cudagraph trees
    (`graph_callable`, weights read in place), probed like a compile: nothing compiles."""
    from backends.common.cudagraph_static import graph_callable, static_input_positions
    from backends.inductor_runner import load

    refuse_unless_graphable(gm, example_inputs)
    runner = load(artefact, example_inputs, patches)
    static = static_input_positions(gm, example_inputs)
    run, details = capture(
        lambda: graph_callable(runner, example_inputs, static), gm, example_inputs
    )
    run.chain_details = {**runner.chain_details, **details}  # type: ignore[attr-defined]
    return run
