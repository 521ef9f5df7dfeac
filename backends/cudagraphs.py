"""cudagraphs: replay each graph as a CUDA graph through torch's own backend, or say why not.

Built on dynamo's `cudagraphs` backend (aot_autograd + cudagraph trees), not a capture
loop of our own. What this module adds is honesty about when it cannot be used:

- Preconditions first (`backends.common.cudagraph_preconditions.check_preconditions`, pure and
  CPU-testable): input mutation, data-dependent ops, RNG, dynamic shapes, training
  graphs (grad mode on and inputs that require grad), devices.
  A failure is `Unsupported(reason)` before torch is asked at all.
- Torch's own skips. Torch's backend never fails: it logs "skipping cudagraphs due to
  ..." (torch 2.13 logs it on the `cudagraphs` artifact logger of
  `torch._inductor.cudagraph_utils`, not on `perf_hints`), bumps
  `counters["inductor"]["cudagraph_skips"]` and hands back an eager runner. We watch the
  counter and capture the log record around both places where torch decides: the
  aot_autograd compile (its `check_for_skip` on the ATen graph runs eagerly, inside our
  call) and the first calls of the cudagraph tree (a warm-up run, where it checks
  mutation of inputs it does not manage, then the recording run). So the backend runs
  the compiled function twice on the example inputs before returning: a skip becomes
  `Unsupported(torch's reason)` at compile time, and a failing capture is a compile
  error, not a surprise at the first real call. The runs are safe because the
  preconditions already refused graphs that mutate inputs or draw random numbers.
- Weights. Parameters and buffers arrive as graph inputs; torch's own backend copies
  them into the graph's buffers on every replay. `torch_cudagraphs` declares them static
  inputs (`backends.common.cudagraph_static`), as inductor's reduce-overhead mode does.
- Output buffers. A replay writes its outputs into the same static buffers each time,
  so an output held from call N would be overwritten by call N+1 (torch raises on access
  if it notices). We clone every output that is not an alias of an input. We chose
  cloning over `torch.compiler.cudagraph_mark_step_begin()` because marking a step only
  declares old outputs dead (reading one then raises); it does not keep them, and it is
  process-wide, so calling it per graph would also end the step of every other
  cudagraphed graph in the same model. A clone is one small device copy per output;
  dropping the tree's own outputs right away also lets the tree replay from its root on
  the next call instead of recording a new child graph.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from backends.common.cudagraph_preconditions import check_preconditions
from backends.common.cudagraph_static import (
    clone_mask,
    clone_outputs,
    static_input_positions,
)
from backends.errors import Unsupported
from backends.registry import register_backend

SKIP_PREFIX = "skipping cudagraphs due to "
SKIPS, COPIED = "cudagraph_skips", "cudagraph_recorded_non_static_inputs"  # torch's counters
PROBE_CALLS = 2  # torch's cudagraph tree: call 1 warms up, call 2 records, call 3 replays


def cudagraphs_available() -> str | None:
    """None when CUDA graphs can run here, else why not (CPU-only build, no device)."""
    if not torch.backends.cuda.is_built():
        return "torch built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


@dataclass
class SkipWatch:
    """What torch's cudagraphs machinery reported while we watched: skip count, messages."""

    skips: int = 0
    messages: list[str] = field(default_factory=list)
    copied_inputs: int = 0  # inputs a recorded graph copies into its buffers on each replay

    def reason(self) -> str:
        """Torch's reason in one line, its prefix (logged twice by torch 2.13) stripped."""
        if not self.messages:
            return f"torch skipped cudagraphs ({self.skips} skip(s)) without a logged reason"
        text = self.messages[0]
        while text.startswith(SKIP_PREFIX):
            text = text[len(SKIP_PREFIX) :]
        first_line = text.split(". Found from", 1)[0].splitlines()[0].strip()
        return f"torch skipped cudagraphs: {first_line}"


class _Collect(logging.Handler):
    """Keeps the messages of the records it sees."""

    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


@contextlib.contextmanager
def watch_cudagraph_skips() -> Iterator[SkipWatch]:
    """Count torch's cudagraph skips in the block and keep the logged reasons.

    The skip warning is kept from propagating while we watch: it becomes our reason
    instead of a stray line on stderr.
    """
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import cudagraphs_log

    watch = SkipWatch()
    handler = _Collect(watch.messages)
    skips, copied = (counters["inductor"][k] for k in (SKIPS, COPIED))
    propagate = cudagraphs_log.propagate
    cudagraphs_log.addHandler(handler)
    cudagraphs_log.propagate = False
    try:
        yield watch
    finally:
        cudagraphs_log.removeHandler(handler)
        cudagraphs_log.propagate = propagate
        watch.skips = counters["inductor"][SKIPS] - skips
        watch.copied_inputs = counters["inductor"][COPIED] - copied


def torch_cudagraphs(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Dynamo's `cudagraphs` backend, with the graph's weights declared static inputs.

    The same pipeline as `torch._dynamo.backends.cudagraphs.cudagraphs` (aot_autograd,
    torch's `check_for_skip`, `cudagraphify_impl` of the cudagraph trees), with one change:
    torch's backend declares static only the inputs aot_autograd lifted itself
    (`range(fixed)`), so the parameters and buffers dynamo passes as graph inputs are
    copied into the graph's buffers on every replay. Here they are static, as in
    inductor's reduce-overhead mode: read in place, re-recorded if their address moves.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.cudagraphs import (
        check_for_skip,
        find_input_mutations,
        get_device_index,
        get_stack_traces,
    )
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.compile_fx import get_static_input_idxs
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._inductor.cudagraph_utils import (
        get_placeholder_info,
        log_cudagraph_skip_and_bump_counter,
    )
    from torch._inductor.utils import num_fw_fixed_arguments

    weights = static_input_positions(gm, example_inputs)

    def forward(
        aot_model: fx.GraphModule, aot_inputs: list[Any], is_inference: bool = False
    ) -> Any:
        interp = boxed_nop(aot_model, aot_inputs)
        fixed = num_fw_fixed_arguments(len(example_inputs), len(aot_inputs))
        if skip := check_for_skip(aot_model, fixed):
            log_cudagraph_skip_and_bump_counter(f"{SKIP_PREFIX}{skip}")
            return interp
        static = set(range(fixed)) | set(get_static_input_idxs(fixed))
        static |= {fixed + i for i in weights if fixed + i < len(aot_inputs)}
        out = cudagraphify_impl(
            interp,
            aot_inputs,
            sorted(static),
            device_index=get_device_index(aot_model),
            is_backward=False,
            is_inference=is_inference,
            stack_traces=get_stack_traces(aot_model),
            placeholders=get_placeholder_info(aot_model.graph),
            mutated_input_idxs=find_input_mutations(aot_model.graph),
        )
        out._boxed_call = True  # type: ignore[attr-defined]
        return out

    compiler = aot_autograd(
        fw_compiler=forward,
        inference_compiler=functools.partial(forward, is_inference=True),
        keep_inference_input_mutations=torch._dynamo.config.cudagraph_backend_keep_input_mutation,
    )
    return compiler(gm, example_inputs)


def probe(compiled: Callable[..., Any], example_inputs: list[Any]) -> tuple[Any, SkipWatch]:
    """Call a cudagraph-tree function until it replays; torch's skips become `Unsupported`.

    Call 1 warms up, call 2 records; returns the outputs of the last call and what torch's
    counters said meanwhile.
    """
    with watch_cudagraph_skips() as watch:
        for _ in range(PROBE_CALLS - 1):
            compiled(*example_inputs)  # outputs dropped at once: the tree may then move on
        outputs = compiled(*example_inputs)
    if watch.skips:
        raise Unsupported(watch.reason(), detail="\n".join(watch.messages))
    return outputs, watch


def refuse_unless_graphable(gm: fx.GraphModule, example_inputs: list[Any]) -> None:
    """Unsupported unless CUDA graphs run here and the graph meets their preconditions.

    For the variants (`<backend>+graphs`), whose availability is their backend's.
    """
    if reason := cudagraphs_available():
        raise Unsupported(f"CUDA graphs: {reason}")
    if reason := check_preconditions(gm, example_inputs):
        raise Unsupported(reason)


def capture(
    build: Callable[[], Callable[..., Any]], gm: fx.GraphModule, example_inputs: list[Any]
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Build a CUDA graph replaying function, probe it until it replays, clone its outputs.

    Torch's silent skips while building or probing become `Unsupported` with torch's
    reason. Returns the runner (outputs that live in replay buffers cloned) and the
    facts for the report.
    """
    with watch_cudagraph_skips() as watch:
        compiled = build()
    if watch.skips:
        raise Unsupported(watch.reason(), detail="\n".join(watch.messages))
    outputs, watch = probe(compiled, example_inputs)
    mask = clone_mask(outputs, example_inputs)
    del outputs  # the tree's buffers must be dead for it to replay from its root
    details = {
        "cuda_graphs": True,
        "cloned_outputs": sum(mask),
        "input_alias_outputs": len(mask) - sum(mask),
        "probe_calls": PROBE_CALLS,
        "static_inputs": len(static_input_positions(gm, example_inputs)),
        "inputs_copied_per_replay": watch.copied_inputs,
    }
    return clone_outputs(compiled, mask), details


def compile_with_torch(
    gm: fx.GraphModule, example_inputs: list[Any]
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """Torch's cudagraphs pipeline, captured (`capture`): the runner and its report facts."""
    return capture(lambda: torch_cudagraphs(gm, example_inputs), gm, example_inputs)


@register_backend("cudagraphs", available=cudagraphs_available, dynamic=False)
def cudagraphs(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Replay the graph as a CUDA graph (torch's cudagraph trees); outputs are cloned."""
    if reason := check_preconditions(gm, example_inputs):
        raise Unsupported(reason)
    run, details = compile_with_torch(gm, example_inputs)
    run.chain_details = details  # type: ignore[attr-defined]
    return run
