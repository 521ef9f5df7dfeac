"""Per-call cost of the guard's run-time checks (chain.watch) on a tiny BertModel.

    python benchmarks/guard_overhead.py [--calls 300] [--rounds 15] [--shape 0] [--threads 1]

The winner is `twin` (the graph's own forward under another name, so the checks apply to
it). Four columns, interleaved round by round, medians of the per-round means:
eager (the model uncompiled); today's guard (a plain try around the winner, as the guard
was before chain.watch); chain(twin, watch=False) (checks off); chain(twin) (defaults:
cheap checks every call, about 1% of run time spent re-verifying against eager); then
the cheap checks alone, timed on the graph's real arguments (noise-free: the load of a
shared machine moves whole-model timings by more than the checks cost).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain
from chain.bench import zoo


def twin(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The graph's own forward: a winner whose cost is eager's, so what differs is the guard."""
    return gm.forward


class TodaysGuard:
    """The guard's happy path before chain.watch: one call in a `try`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as exc:  # today's guard fell back here; the twin never raises
            raise RuntimeError("twin raised") from exc


def todays(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    return TodaysGuard(gm.forward)


def per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--shape", type=int, default=0, choices=(0, 1, 2))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--verbose", action="store_true", help="every round's mean")
    args = parser.parse_args()
    if (why := zoo.available()) is not None:
        sys.exit(why)
    torch.manual_seed(0)
    model = zoo.build("bert")
    inputs = zoo.inputs("bert", args.shape)
    torch.set_num_threads(args.threads)
    default = chain(twin, "eager", measure=False)
    guards: list[Any] = []

    def captured(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        guards.append((default(gm, example_inputs), list(example_inputs)))
        return guards[-1][0]

    candidates = {
        "eager (no compile)": model,
        "today's guard": torch.compile(model, backend=todays),
        "chain(twin, watch=False)": torch.compile(
            model, backend=chain(twin, "eager", measure=False, watch=False)
        ),
        "chain(twin) (defaults)": torch.compile(model, backend=captured),
    }
    with torch.no_grad():
        for fn in candidates.values():
            fn(*inputs)  # compile
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        for r in range(args.rounds):
            names = list(candidates)
            names = names[r % len(names) :] + names[: r % len(names)]  # rotate the order
            for name in names:
                samples[name].append(per_call_us(candidates[name], inputs, args.calls))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    if args.verbose:
        for name, s in samples.items():
            print(name, " ".join(f"{v:.0f}" for v in s))
    base = medians["today's guard"]
    shape, threads = zoo.describe("bert", args.shape), torch.get_num_threads()
    print(f"BertModel (tiny) at {shape} tokens, {threads} torch threads")
    print(f"{'':28} {'median us/call':>15} {'vs today':>10}")
    for name, us in medians.items():
        print(f"{name:28} {us:15.1f} {100 * (us / base - 1):+9.2f}%")
    [graph] = default.report.graphs
    print(graph.watch)
    # the cheap checks alone, on the real graph's arguments: what every call pays
    [(guard, graph_args)] = guards
    watch = guard.active.watch
    with torch.no_grad():
        out = guard.fn(*graph_args)
        start = time.perf_counter()
        for n in range(10000):
            watch.check(n, graph_args, out)
        check_us = (time.perf_counter() - start) / 10000 * 1e6
    share = 100 * check_us / medians["chain(twin, watch=False)"]
    print(f"cheap checks alone: {check_us:.2f} us/call ({share:.2f}% of a call)")


if __name__ == "__main__":
    main()
