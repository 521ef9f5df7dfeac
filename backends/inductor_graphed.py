"""inductor's CUDA graphs variant: its own reduce-overhead machinery, with honest skips.

`triton.cudagraphs=True` is what `mode="reduce-overhead"` sets: inductor fuses kernels,
then replays the whole graph through torch's cudagraph trees, with parameters and
buffers as static inputs (aot_autograd's `static_input_indices`, read from dynamo's
marks). Like `backends.cudagraphs`, this module checks the preconditions first, watches
torch's skip counter during compile and two probe calls (a skip is `Unsupported` with
torch's reason, not an eager win), and clones the outputs that live in replay buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from backends.common.cudagraph_preconditions import check_preconditions
from backends.common.cudagraph_static import static_input_positions
from backends.cudagraphs import (
    PROBE_CALLS,
    cudagraphs_available,
    probe,
    safe_outputs,
    watch_cudagraph_skips,
)
from backends.errors import Unsupported
from backends.inductor import config_patches
from backends.registry import registry


def compile_graphed(
    gm: fx.GraphModule, example_inputs: list[Any], patches: dict[str, Any]
) -> Callable[..., Any]:
    """compile_fx with `patches` and CUDA graphs on; outputs cloned; skips become reasons."""
    from torch._inductor.compile_fx import compile_fx

    if reason := cudagraphs_available():
        raise Unsupported(f"CUDA graphs: {reason}")
    if reason := check_preconditions(gm, example_inputs):
        raise Unsupported(reason)
    patches = {**patches, "triton.cudagraphs": True}
    with watch_cudagraph_skips() as watch:
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if watch.skips:
        raise Unsupported(watch.reason(), detail="\n".join(watch.messages))
    outputs, watch = probe(compiled, example_inputs)
    run, cloned, aliased = safe_outputs(compiled, outputs, example_inputs)
    del outputs  # the tree's buffers must be dead for it to replay from its root
    run.chain_details = {  # type: ignore[attr-defined]
        "cuda_graphs": True,
        "cloned_outputs": cloned,
        "input_alias_outputs": aliased,
        "probe_calls": PROBE_CALLS,
        "static_inputs": len(static_input_positions(gm, example_inputs)),
        "inputs_copied_per_replay": watch.copied_inputs,
    }
    return run


@registry.graphed_variant("inductor")
def inductor_graphed(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], mode: str | None = None, **options: Any
) -> Callable[..., Any]:
    """inductor with the same mode and options, replayed as CUDA graphs (reduce-overhead)."""
    return compile_graphed(gm, example_inputs, config_patches(mode, options))
