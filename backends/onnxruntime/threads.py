"""How many intra-op threads a CPU session gets when the user pins none: measured per graph.

ORT's default is a pool of one thread per physical core, and every parallel op hands work
to the pool and waits for it. On a small graph those hand-offs cost more than the second
core gives. Measured on a 2-core CPU (`benchmarks/ort_threads.py`, the same export side by
side, 1 and 2 torch threads):
- 1 thread was 1.23-1.41x faster on sub-millisecond transformers (2 layers, hidden 64);
- it was 0.90x on a 3 ms BERT and 0.74x on a 13 ms one.

So the backend builds a second session with one thread from the same export and times the
two on the example inputs. Calls alternate in short blocks; the order flips each round. One
thread is kept only when it is faster in at least `WINS` of `ROUNDS` rounds (a sign test,
p < 0.02) and by `MARGIN` at the median. Anything else keeps ORT's default, a busy
machine's undecided timing included. A verdict either way is stored with the export
(`Choice.stored`) unless the machine had no core free (load average at least the core
count): a busy machine's verdict serves this process but is not remembered. A graph whose
call takes over `SLOW_MS` is not timed: the larger graphs measured faster with the default,
and timing them would slow the compile.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from backends import cancel
from backends.common.onnx_export import OnnxGraph
from backends.onnxruntime.runtime import carrier_array

ROUNDS = 15
WINS = 12  # rounds one thread must win (one-sided sign test: p = 0.018)
MARGIN = 1.05  # and by this much at the median
BLOCK_S = 0.002  # the calls of one block last about this long
SLOW_MS = 5.0  # a slower call is not timed: ORT's default stays


@dataclass(frozen=True)
class Choice:
    """The thread count kept (None: ORT's default) and why, for the report; `stored`: what
    the export's artefact keeps (1, 0 for the default, None: time again next time), only a
    verdict either way: a tie, a spoiled timing or a graph not timed is not remembered."""

    threads: int | None
    why: str
    stored: int | None = None


def feeds(graph: OnnxGraph, inputs: Any) -> dict[str, Any] | None:
    """The session's feeds for `inputs`: numpy views of the tensors, the size carriers;
    None when a symbolic int has no value. A symbolic int is read by its hint, never
    `int()`: that would make dynamo guard on this call's value and compile the graph again
    for every other one."""
    out = {
        name: inputs[i].detach().numpy()
        for name, i in zip(graph.input_names, graph.input_positions, strict=True)
    }
    for name, i in zip(graph.carrier_names, graph.carriers, strict=True):
        n = inputs[i]
        if isinstance(n, torch.SymInt):
            n = n.node.hint if n.node.has_hint() else None
        if n is None:
            return None
        out[name] = carrier_array(n)
    return out


def choose(
    graph: OnnxGraph, inputs: Any, default: Any, one_thread: Callable[[], Any]
) -> tuple[Choice, Any]:
    """Time the `default` session against `one_thread()`'s (built only when the graph is
    fast enough to time); (the choice, the session to serve)."""
    names, fed = list(graph.output_names), feeds(graph, inputs)
    if fed is None:
        return Choice(None, "ORT's default: a symbolic size has no value to time with"), default
    default.run(names, fed)  # the first run allocates: the second says how long a call is
    start = time.perf_counter()
    default.run(names, fed)
    call_ms = 1000 * (time.perf_counter() - start)
    if call_ms > SLOW_MS:
        return Choice(None, f"ORT's default: a call takes {call_ms:.1f} ms, not timed"), default
    single = one_thread()
    runs = {"default": lambda: default.run(names, fed), "1": lambda: single.run(names, fed)}
    for run in runs.values():  # warm: the new session's first runs allocate
        run()
        run()
    per_call = min(_block(run, 1) for run in runs.values())
    block = max(1, round(BLOCK_S / max(per_call, 1e-6)))
    ratios = []
    for r in range(ROUNDS):
        cancel.checkpoint()  # an abandoned compile stops timing
        order = ("default", "1") if r % 2 == 0 else ("1", "default")
        took = {name: _block(runs[name], block) for name in order}
        ratios.append(took["default"] / took["1"])
    wins, median = sum(x > 1.0 for x in ratios), statistics.median(ratios)
    line = f"1 thread {median:.2f}x ORT's default, faster in {wins} of {ROUNDS} rounds"
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    busy = load >= cores  # no core was free: a verdict serves, but is not remembered
    if busy:
        line += f" (load {load:.1f} on {cores} cores: not stored with the export)"
    if wins >= WINS and median >= MARGIN:
        return Choice(1, line, stored=None if busy else 1), single
    slower = wins <= ROUNDS - WINS and median <= 1 / MARGIN  # the default, with confidence
    stored = 0 if slower and not busy else None
    return Choice(None, f"ORT's default kept: {line}", stored=stored), default


def _block(run: Callable[[], Any], calls: int) -> float:
    """Seconds per call over `calls` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - start) / calls
