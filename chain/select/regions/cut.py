"""Cut a graph into regions at module boundaries (`nn_module_stack`), with torch.fx's own
`split_module`: each region a submodule of the split graph, called in order.

A module whose ops exceed `max_nodes` is cut again at its children's boundaries; regions
with fewer than `min_nodes` ops join their neighbour (a crossing costs more than they
can save). Each region's key is its structure (ops, arguments by position) and the
specs of the inputs it receives, so repeated layers share one key: one layer's trials.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.fx.passes.split_module import split_module

from chain.report.graphinfo import fingerprint

MIN_NODES = 8  # a region of fewer ops is merged into its neighbour: not worth a crossing
MAX_NODES = 80  # a module of more ops is cut again at its children's boundaries
SUBMOD = "submod_"  # split_module's names for the parts: submod_0, submod_1, ...
COMPUTE = ("call_function", "call_method", "call_module")


@dataclasses.dataclass(frozen=True)
class Region:
    """One region: its submodule's name in the split graph, the module path it covers,
    its op count, its structural key, and the activations it receives from earlier
    regions (weights and graph inputs do not count: they cross nothing)."""

    name: str
    path: str
    ops: int
    key: str = ""
    crossing_in: int = 0
    single: bool = False  # its module returned one value: wrapped in a tuple for backends


@dataclasses.dataclass(frozen=True)
class Cut:
    """A graph cut into regions: the split graph (its submodules are the regions, in call
    order) and each region's facts."""

    split: fx.GraphModule  # its submodules: `Call`s running each region's graph
    regions: tuple[Region, ...]
    graphs: dict[str, fx.GraphModule]  # per region: its graph, returning a tuple
    inputs: dict[str, tuple[Any, ...]]  # per region: its real inputs on the recorded run
    labels: dict[str, int] = dataclasses.field(default_factory=dict)  # node name -> part

    def submodule(self, region: Region) -> fx.GraphModule:
        """The region's own graph module (its outputs always a tuple, as dynamo's are)."""
        return self.graphs[region.name]

    def with_calls(self, fns: dict[str, Any]) -> fx.GraphModule:
        """The split graph with each region run by `fns[name]` (a compiled region): a new
        graph module; this cut's own is left as it is."""
        stitched = fx.GraphModule(self.split, self.split.graph)
        for region in self.regions:
            setattr(stitched, region.name, Call(fns[region.name], region.single))
        # each region's own graph, for an export of the mixed graph (chain.deploy.mixed)
        stitched.chain_regions = {r.name: (self.graphs[r.name], r.single) for r in self.regions}
        return stitched

    @property
    def unique(self) -> int:
        """How many regions differ in structure (the trials a selection pays for)."""
        return len({r.key for r in self.regions})


class Call(torch.nn.Module):
    """One region's call in the split graph: the compiled region, its one output
    unwrapped where the region's module returned one value."""

    def __init__(self, fn: Any, single: bool) -> None:
        super().__init__()
        self.fn = fn
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.fn(*args)
        return out[0] if self.single else out


def module_path(node: fx.Node) -> tuple[str, ...]:
    """The module a node was traced in, as path components without dynamo's root
    (`L['self'].encoder.layer.0` -> ("encoder", "layer", "0")); () at the top level."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ()
    path, _ = list(stack.values())[-1]
    parts = str(path).split(".")
    return tuple(parts[1:]) if parts and parts[0].startswith("L[") else tuple(parts)


def label(nodes: Sequence[fx.Node], min_nodes: int = MIN_NODES, max_nodes: int = MAX_NODES
          ) -> list[int]:  # fmt: skip
    """A region number per compute node (in graph order): runs of one module, cut deeper
    where a run is over `max_nodes`, runs under `min_nodes` merged into a neighbour."""
    paths = [module_path(n) for n in nodes]
    runs = _runs(list(range(len(nodes))), paths, 1, max_nodes)
    runs = _merged(runs, min_nodes)
    out = [0] * len(nodes)
    for number, run in enumerate(runs):
        for i in run:
            out[i] = number
    return out


def _runs(index: list[int], paths: list[tuple[str, ...]], depth: int, max_nodes: int
          ) -> list[list[int]]:  # fmt: skip
    """Consecutive nodes sharing their path's first `depth` components; a run over
    `max_nodes` whose nodes go deeper is cut again one level down."""
    runs: list[list[int]] = []
    last: tuple[str, ...] | None = None
    for i in index:
        prefix = paths[i][:depth]
        if runs and prefix == last:
            runs[-1].append(i)
        else:
            runs.append([i])
            last = prefix
    out: list[list[int]] = []
    for run in runs:
        deeper = any(len(paths[i]) > depth for i in run)
        if len(run) > max_nodes and deeper:
            out += _runs(run, paths, depth + 1, max_nodes)
        else:
            out.append(run)
    return out


def _merged(runs: list[list[int]], min_nodes: int) -> list[list[int]]:
    """Consecutive runs under `min_nodes` join one another first; a group still under
    `min_nodes` joins its smaller neighbour (ties: the one before). A tower's pooler and the
    heads after it so end up in the small top-level region, not in the last layer, which
    keeps its twins' key (one trial for all of them)."""
    out: list[list[int]] = []
    for run in runs:
        if out and len(run) < min_nodes and len(out[-1]) < min_nodes:
            out[-1] = out[-1] + run
        else:
            out.append(list(run))
    while len(out) > 1:
        small = next((i for i, run in enumerate(out) if len(run) < min_nodes), None)
        if small is None:
            break
        sides = [j for j in (small - 1, small + 1) if 0 <= j < len(out)]
        other = min(sides, key=lambda j: len(out[j]))
        first, second = sorted((small, other))
        out[first : second + 1] = [out[first] + out[second]]
    return out


def cut(
    gm: fx.GraphModule,
    inputs: Sequence[Any],
    min_nodes: int = MIN_NODES,
    max_nodes: int = MAX_NODES,
) -> Cut:
    """`gm` cut into regions (torch.fx's split_module); `inputs` (concrete values) are run
    once through the split graph to record each region's inputs for its key."""
    nodes = [n for n in gm.graph.nodes if n.op in COMPUTE]
    return _split(gm, inputs, dict(zip(nodes, label(nodes, min_nodes, max_nodes), strict=True)))


def regroup(gm: fx.GraphModule, inputs: Sequence[Any], base: Cut, groups: Sequence[int]) -> Cut:
    """`gm` cut again with `base`'s regions joined by group (`groups[i]`: region i's group;
    consecutive regions only): consecutive regions one backend serves become one part, one
    compile and one call."""
    position = {int(r.name.removeprefix(SUBMOD)): i for i, r in enumerate(base.regions)}
    numbers = {
        n: groups[position[base.labels[n.name]]] for n in gm.graph.nodes if n.name in base.labels
    }
    return _split(gm, inputs, numbers)


def _split(gm: fx.GraphModule, inputs: Sequence[Any], numbers: dict[fx.Node, int]) -> Cut:
    """`gm` split with torch.fx's split_module, node `n` into part `numbers[n]`."""
    members: dict[int, list[tuple[str, ...]]] = {}
    for node, number in numbers.items():
        members.setdefault(number, []).append(module_path(node))

    def part(node: fx.Node) -> int:
        return numbers[node]

    split = split_module(gm, gm, part, keep_original_order=True)
    recorded = record_inputs(split, inputs)
    names = [str(n.target) for n in split.graph.nodes if n.op == "call_module"]
    produced = _activations(split)
    regions, graphs = [], {}
    for name in names:
        sub = getattr(split, name)
        single = _as_tuple(sub)
        number = int(name.removeprefix(SUBMOD))
        ops = sum(1 for n in sub.graph.nodes if n.op in COMPUTE)
        path = ".".join(_common(members[number])) or "(top)"
        key = fingerprint(sub, recorded[name])
        regions.append(Region(name, path, ops, key, produced.get(name, 0), single))
        graphs[name] = sub
        setattr(split, name, Call(sub.forward, single))
    labels = {n.name: number for n, number in numbers.items()}
    return Cut(split, tuple(regions), graphs, recorded, labels)


def _as_tuple(sub: fx.GraphModule) -> bool:
    """Make `sub` return a tuple, as the graphs dynamo hands backends do; whether it
    returned one value before (its call then unwraps it)."""
    output = next(n for n in reversed(sub.graph.nodes) if n.op == "output")
    if isinstance(output.args[0], tuple | list):
        return False
    output.args = ((output.args[0],),)
    sub.recompile()
    return True


def _common(paths: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The longest module path every one of `paths` lies in."""
    out: list[str] = []
    for parts in zip(*paths, strict=False):
        if any(p != parts[0] for p in parts):
            break
        out.append(parts[0])
    return tuple(out)


def _activations(split: fx.GraphModule) -> dict[str, int]:
    """Per region: how many of its arguments are other regions' outputs."""
    out: dict[str, int] = {}
    for node in split.graph.nodes:
        if node.op == "call_module":
            args = node.all_input_nodes
            out[str(node.target)] = sum(1 for a in args if a.op != "placeholder")
    return out


class _Recorder(fx.Interpreter):
    """Runs the split graph, keeping each region's arguments as it receives them."""

    def __init__(self, module: fx.GraphModule) -> None:
        super().__init__(module)
        self.seen: dict[str, tuple[Any, ...]] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        self.seen[str(target)] = tuple(args)
        return super().call_module(target, args, kwargs)


def record_inputs(split: fx.GraphModule, inputs: Sequence[Any]) -> dict[str, tuple[Any, ...]]:
    """Each region's real inputs on one run of `split` over `inputs` (concrete values)."""
    recorder = _Recorder(split)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.seen
