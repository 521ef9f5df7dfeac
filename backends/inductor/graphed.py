"""inductor's CUDA graphs machinery: its own reduce-overhead compile, with honest skips.

`triton.cudagraphs=True` is what `mode="reduce-overhead"` sets: inductor fuses kernels,
then replays the whole graph through torch's cudagraph trees, with parameters and
buffers as static inputs (aot_autograd's `static_input_indices`, read from dynamo's
marks). Like `backends.cudagraphs`, this module checks the preconditions first, watches
torch's skip counter during compile and two probe calls (a skip is `Unsupported` with
torch's reason, not an eager win), and clones the outputs that live in replay buffers.
Its artefact is inductor's package (`backends.inductor.package`, built without CUDA
graphs), which `reuse_graphed` loads and replays through torch's cudagraph trees. The
variant itself (`inductor+graphs`) is registered in `backends.inductor`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from backends.common.cudagraph_static import graph_callable, static_input_positions
from backends.cudagraphs import capture, refuse_unless_graphable
from backends.inductor.package import offer_package
from backends.inductor.runner import load


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
    # its package: the same graph, built without CUDA graphs
    return offer_package(run, gm, example_inputs, patches)


def reuse_graphed(
    gm: fx.GraphModule, example_inputs: list[Any], artefact: bytes, patches: dict[str, Any]
) -> Callable[..., Any]:
    """inductor under CUDA graphs from its stored package: the package (built without CUDA
    graphs) loaded with torch's loader, then replayed through torch's cudagraph trees
    (`graph_callable`, weights read in place), probed like a compile: nothing compiles."""
    refuse_unless_graphable(gm, example_inputs)
    runner = load(artefact, example_inputs, patches)
    static = static_input_positions(gm, example_inputs)
    run, details = capture(
        lambda: graph_callable(runner, example_inputs, static), gm, example_inputs
    )
    run.chain_details = {**runner.chain_details, **details}  # type: ignore[attr-defined]
    return run
