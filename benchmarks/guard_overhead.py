"""Per-call cost of the guard's run-time checks (chain.run.watch) on a tiny BertModel.

    python benchmarks/guard_overhead.py [--model toy] [--calls 10] [--rounds 1000] [--threads 1]
        [--reverify-rate R]

Models: `toy` (the safety suite's BertModel: hidden 32, 2x8 tokens, about 0.4 ms a call, a
third of it dynamo's own frame), `bert-tiny` and `bert-mini` (the configs of Google's BERT
miniatures L-2_H-128 and L-4_H-256, random weights, 2x32 tokens): the checks cost a few
microseconds a call whatever the model, so the smaller the call, the larger their share.

The winner is `twin` (the graph's own forward under another name, so the checks apply to
it). Arms, interleaved in many short rounds (in a new random order each round), so a shared
machine's drift moves every arm alike: each arm's mean time per call, its total time over
today's guard's (everything it did: re-verification included) with a 95% bootstrap
interval over rounds, and the median of the per-round ratios. The arms: eager (the
model uncompiled); today's guard (a plain try around the winner, as the guard was before
chain.watch); chain(twin, watch=False) (checks off); chain(twin) (defaults: cheap checks
every call, re-verification against eager as `reverify_rate` pays for); the defaults with
the guard's fast path off (chain.run.watch.fast: every call by the general path); then the
cheap checks alone, timed on the graph's real arguments.

The guards serve one compiled frame, swapped round by round (`Arms`): compiled as separate
models they were separate entries in dynamo's cache for BertModel.forward, and where an arm
sat among them moved its time by up to 6%, more than the checks cost. Rounds of 100 calls
or more let the machine's drift in between arms: paired medians of +1% to +5% for the same
code in three runs. And with the order rotated rather than shuffled, today's guard always
came right after the uncompiled model, whose call leaves the compiled frame's first call
slower: that flattered every other arm by 1-3% on long rounds, 11% on rounds of 10.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.fx._lazy_graph_module import _LazyGraphModule

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chain import chain
from chain.bench import zoo
from chain.bench.real_models import LastHidden


def _forward(gm: fx.GraphModule) -> Callable[..., Any]:
    """The graph's generated forward. Dynamo hands over a lazy graph module, whose `forward`
    until its first run is a stub that compiles the code and then goes through
    `nn.Module.__call__` on every call (about 10 us: 2.5% of this model's call)."""
    _LazyGraphModule.force_recompile(gm)
    return gm.forward


# Google's BERT miniatures (github.com/google-research/bert): layers, hidden size
MINIATURES = {"bert-tiny": (2, 128), "bert-mini": (4, 256)}


def build(name: str, shape: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], str]:
    """The model, its inputs and a line that says what it is."""
    if name == "toy":
        return zoo.build("bert"), zoo.inputs("bert", shape), f"{zoo.describe('bert', shape)} tokens"
    from transformers import BertConfig, BertModel

    layers, hidden = MINIATURES[name]
    config = BertConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LastHidden(BertModel(config)).eval()
    generator = torch.Generator().manual_seed(shape)
    ids = torch.randint(0, config.vocab_size, (2, 32), generator=generator)
    return model, (ids,), f"2x32 tokens, {layers} layers, hidden {hidden}"


def twin(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """The graph's own forward: a winner whose cost is eager's, so what differs is the guard."""
    return _forward(gm)


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
    return TodaysGuard(_forward(gm))


def general(backend: Any, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
    """The chain's guard with the fast path off: every call by the general path."""
    guard = backend(gm, example_inputs)
    guard.active = dataclasses.replace(guard.active, fast=None)
    return guard


class Arms:
    """What dynamo calls for the one compiled graph: whichever guard `use` picked."""

    def __init__(self, **options: Any) -> None:
        """`options`: chain() options of the two checked arms (none: the defaults)."""
        self.options = options
        self.guards: dict[str, Callable[..., Any]] = {}
        self.now: Callable[..., Any] | None = None
        self.args: list[Any] = []

    def backend(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        """Builds every arm's guard on the graph (one graph: the benchmark's model has one)."""
        if self.guards:
            raise RuntimeError("the model compiled to more than one graph")
        self.args = list(example_inputs)
        self.guards = {
            "today's guard": todays(gm, example_inputs),
            "chain(twin, watch=False)": chain(twin, "eager", measure=False, watch=False)(
                gm, example_inputs
            ),
            "chain(twin) (defaults)": chain(twin, "eager", measure=False, **self.options)(
                gm, example_inputs
            ),
            "defaults, general path": general(
                chain(twin, "eager", measure=False, **self.options), gm, example_inputs
            ),
        }
        self.now = self.guards["today's guard"]
        return self

    def use(self, name: str) -> None:
        self.now = self.guards[name]

    def __call__(self, *args: Any) -> Any:
        assert self.now is not None
        return self.now(*args)


def per_call_us(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def interval(arm: list[float], base: list[float], draws: int = 1000) -> tuple[float, float]:
    """A 95% bootstrap interval (over rounds, seeded) of `arm`'s total time over `base`'s,
    in percent: the rounds are resampled whole, so each keeps its pair."""
    pick = random.Random(0).randrange
    n = len(arm)
    ratios = []
    for _ in range(draws):
        rounds = [pick(n) for _ in range(n)]
        ratios.append(100 * (sum(arm[i] for i in rounds) / sum(base[i] for i in rounds) - 1))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="toy", choices=("toy", *MINIATURES))
    parser.add_argument("--calls", type=int, default=10, help="calls per arm per round")
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--shape", type=int, default=0, choices=(0, 1, 2))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--reverify-rate", type=float, help="of the checked arms (default: the chain's, 0.005)"
    )
    parser.add_argument("--verbose", action="store_true", help="every round's mean")
    args = parser.parse_args()
    if (why := zoo.available()) is not None:
        sys.exit(why)
    torch.manual_seed(0)
    model, inputs, what = build(args.model, args.shape)
    torch.set_num_threads(args.threads)
    options = {} if args.reverify_rate is None else {"reverify_rate": args.reverify_rate}
    arms = Arms(**options)
    compiled = torch.compile(model, backend=arms.backend)
    with torch.no_grad():
        compiled(*inputs)  # compiles, and builds each arm's guard
        default = arms.guards["chain(twin) (defaults)"]
        default_watch = default.active.watch
        calls: dict[str, Callable[..., Any]] = {"eager (no compile)": model}
        calls |= {name: compiled for name in arms.guards}
        samples: dict[str, list[float]] = {name: [] for name in calls}
        shuffle = random.Random(0).shuffle
        for _ in range(args.rounds):
            names = list(calls)
            # a new order each round: rotated, each arm always followed the same one, and
            # the first call after the uncompiled model costs more (+11% on 10-call rounds)
            shuffle(names)
            for name in names:
                if name in arms.guards:
                    arms.use(name)
                samples[name].append(per_call_us(calls[name], inputs, args.calls))
    if args.verbose:
        for name, s in samples.items():
            print(name, " ".join(f"{v:.0f}" for v in s))
    today = samples["today's guard"]
    print(f"BertModel {args.model} ({what}), {torch.get_num_threads()} torch threads")
    print(f"{args.rounds} rounds of {args.calls} call(s) per arm, interleaved")
    print(f"{'':28} {'us/call':>8} {'total vs today':>15} {'95% interval':>19} {'paired':>8}")
    for name, s in samples.items():
        low, high = interval(s, today)
        # per round against today's in the same round: drifts of a shared machine move both
        paired = statistics.median(100 * (a / b - 1) for a, b in zip(s, today, strict=True))
        print(
            f"{name:28} {statistics.fmean(s):8.1f} {100 * (sum(s) / sum(today) - 1):+14.2f}% "
            f"[{low:+7.2f}%, {high:+7.2f}%] {paired:+7.2f}%"
        )
    stats = default_watch.stats
    print(stats)
    spent = sum(samples["chain(twin) (defaults)"]) * args.calls / 1e6  # seconds in its calls
    print(
        f"re-verification: {1e3 * stats.reverify_s:.1f} ms of the defaults' "
        f"{1e3 * spent:.0f} ms ({100 * stats.reverify_s / spent:.2f}%)"
    )
    # the cheap checks alone, on the real graph's arguments: what every call pays
    graph_args, watch = arms.args, default_watch
    with torch.no_grad():
        out = default.fn(*graph_args)
        start = time.perf_counter()
        for n in range(10000):
            watch.check(n, graph_args, out)
        check_us = (time.perf_counter() - start) / 10000 * 1e6
    share = 100 * check_us / statistics.fmean(samples["chain(twin, watch=False)"])
    print(f"cheap checks alone: {check_us:.2f} us/call ({share:.2f}% of a call)")


if __name__ == "__main__":
    main()
