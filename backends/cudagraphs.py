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
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from backends.common.cudagraph_preconditions import check_preconditions
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


def compile_with_torch(
    gm: fx.GraphModule, example_inputs: list[Any]
) -> tuple[Callable[..., Any], Any, SkipWatch]:
    """Torch's cudagraphs backend, with its silent skips turned into `Unsupported`.

    Returns the compiled function, the outputs of the last probe call, and what torch's
    counters said during the probe calls.
    """
    from torch._dynamo.backends.cudagraphs import cudagraphs as torch_cudagraphs

    with watch_cudagraph_skips() as watch:
        compiled = torch_cudagraphs(gm, example_inputs)
    if watch.skips:
        raise Unsupported(watch.reason(), detail="\n".join(watch.messages))
    with watch_cudagraph_skips() as watch:
        for _ in range(PROBE_CALLS - 1):
            compiled(*example_inputs)  # outputs dropped at once: the tree may then move on
        outputs = compiled(*example_inputs)
    if watch.skips:
        raise Unsupported(watch.reason(), detail="\n".join(watch.messages))
    return compiled, outputs, watch


def input_storages(inputs: Any) -> set[int]:
    """Data pointers of the storages of the tensors among `inputs`."""
    return {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}


def clone_outputs(compiled: Callable[..., Any], clone_mask: list[bool]) -> Callable[..., Any]:
    """Wrap `compiled` so that the flat outputs marked in `clone_mask` are fresh copies."""

    def run(*args: Any) -> Any:
        flat, spec = tree_flatten(compiled(*args))
        flat = [x.clone() if clone else x for x, clone in zip(flat, clone_mask, strict=True)]
        return tree_unflatten(flat, spec)

    return run


@register_backend("cudagraphs", available=cudagraphs_available)
def cudagraphs(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Replay the graph as a CUDA graph (torch's cudagraph trees); outputs are cloned."""
    if reason := check_preconditions(gm, example_inputs):
        raise Unsupported(reason)
    compiled, outputs, probe = compile_with_torch(gm, example_inputs)
    flat, _ = tree_flatten(outputs)
    aliases = input_storages(example_inputs)
    clone = [
        isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in aliases for x in flat
    ]
    del outputs, flat  # the tree's buffers must be dead for it to replay from its root
    run = clone_outputs(compiled, clone)
    run.chain_details = {  # type: ignore[attr-defined]
        "cloned_outputs": sum(clone),
        "input_alias_outputs": len(clone) - sum(clone),
        "probe_calls": PROBE_CALLS,
        "inputs_copied_per_replay": probe.copied_inputs,
    }
    return run
