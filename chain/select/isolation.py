"""Isolation during selection: what the chain copies, what it watches, and how it tells.

While the chain picks a winner it runs the graph many times: eager's reference, the
float64 run, each candidate's first call and its timing. None of those runs may touch
what the caller owns. So:

- every tensor input that is not a parameter or buffer (activations, token ids, caches
  handed in) gets a fresh copy per run (`Isolation.copied`); the caller's tensor is never
  handed to a candidate, so one that zeroes its input, or scribbles and then raises,
  damages only its own copy;
- parameters and buffers are never copied wholesale (a GPU model may not fit twice): they
  are watched (`WeightWatch`: version counters, plus a content fingerprint for writes that
  bypass them), except the ones the graph itself writes in place (`written_inputs`), which
  are copied like activations so that eager's write is not applied once per run;
- after selection nothing is copied back: dynamo calls the returned callable on the
  caller's real inputs right away, and that one call applies the winner's writes (the
  ones verified equal to eager's) exactly once, as eager would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import fx

from backends.common.fx_utils import grapharg, weight_inputs
from backends.common.versions import version
from chain.judge.verify import unchanged

# Watched weights are copied to a CPU snapshot (to restore them if a candidate writes
# them) only when they total at most this many bytes; above it, damage is a WeightsDamaged.
SNAPSHOT_BYTES = 256 * 2**20
SAMPLES = 64  # elements per weight kept in its fingerprint, evenly strided
# After selection, the winner's re-verifications compare every weight's version counter and
# the fingerprints of one part of the weights in turn: a write that bypasses the counters
# is seen within this many re-verifications
RUN_TIME_PARTS = 8


class WeightsDamaged(RuntimeError):
    """A candidate wrote a parameter or buffer in place and the chain could not restore it.

    `intact` says whether the weights hold their fingerprinted values again (the user
    reloaded them): until then every call of the graph raises this, never an answer
    computed from the damaged weights."""

    def __init__(self, message: str, intact: Callable[[], bool] | None = None) -> None:
        super().__init__(message)
        self.intact = intact


def _written_operands(node: fx.Node) -> list[fx.Node]:
    """The nodes `node` writes in place (its `self` for `x.add_()` and the like)."""
    target = node.target
    args = [a for a in node.args if isinstance(a, fx.Node)]
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        out: list[fx.Node] = []
        for i, arg in enumerate(target._schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
                if isinstance(value, fx.Node):
                    out.append(value)
        return out
    name = str(target) if node.op == "call_method" else getattr(target, "__name__", "")
    writes = name.endswith("_") and not name.endswith("__")
    if getattr(target, "__module__", None) in ("_operator", "operator"):
        writes = name.startswith("i") or name in ("setitem", "delitem")
    out_kw = node.kwargs.get("out")
    return (args[:1] if writes else []) + ([out_kw] if isinstance(out_kw, fx.Node) else [])


def written_inputs(gm: fx.GraphModule) -> frozenset[int]:
    """Positions of the placeholders the graph may write in place, directly or through a
    view (conservative: an operand is traced back through every node's first argument)."""
    positions = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    found: set[int] = set()
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        for operand in _written_operands(node):
            seen: set[fx.Node] = set()
            while operand not in seen:
                seen.add(operand)
                if operand in positions:
                    found.add(positions[operand])
                    break
                first = next((a for a in operand.args if isinstance(a, fx.Node)), None)
                if first is None:
                    break
                operand = first
    return frozenset(found)


def input_names(gm: fx.GraphModule, count: int) -> list[str]:
    """A readable name per input: a weight's dotted module path
    (`embeddings.word_embeddings.weight`), else the placeholder's name (`l_x_`)."""
    names: list[str] = []
    for node in gm.graph.find_nodes(op="placeholder")[:count]:
        source = getattr(grapharg(node), "source", None)
        text = ""
        if source is not None:
            name = getattr(source, "name", "")
            text = str(name() if callable(name) else name)
        keys = re.findall(r"\['([^']+)'\]", text)
        names.append(".".join(keys[1:]) if len(keys) > 1 else node.name)
    names += [f"input {i}" for i in range(len(names), count)]
    return names


@dataclass(frozen=True)
class Fingerprint:
    """What a weight looked like: its version counter, a strided sample and its sum."""

    version: int
    sample: torch.Tensor
    total: torch.Tensor

    @classmethod
    def of(cls, t: torch.Tensor) -> Fingerprint:
        flat = t.detach().reshape(-1)
        sample = _sample(flat).clone()
        wide = torch.float64 if (t.is_floating_point() or t.is_complex()) else torch.int64
        total = flat.sum(dtype=wide if not t.is_complex() else None) if flat.numel() else flat
        return cls(version(t), sample, total.clone())

    def same_values(self, other: Fingerprint) -> bool:
        """Whether the sampled elements and the sums are equal (NaN equal to NaN)."""
        return unchanged(self.sample, other.sample) and unchanged(self.total, other.total)


def _sample(flat: torch.Tensor) -> torch.Tensor:
    """`SAMPLES` elements of a flat tensor, evenly strided (a view)."""
    return flat[:: max(1, flat.numel() // SAMPLES)][:SAMPLES]


def _joined(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The samples and float64 sums of floating tensors (of one device) in one float64
    tensor: equal to an earlier one when every fingerprint is (NaN aside)."""
    with torch.no_grad():
        flats = [t.reshape(-1) for t in tensors]
        sums = torch.stack([f.sum(dtype=torch.float64) for f in flats])
        return torch.cat([*(_sample(f) for f in flats), sums])  # promoted to float64


def _groups(tensors: Sequence[torch.Tensor], parts: int) -> list[tuple[torch.Tensor, ...]]:
    """`tensors` in order, cut into at most `parts` runs of about equal bytes."""
    total = sum(t.numel() * t.element_size() for t in tensors)
    groups: list[tuple[torch.Tensor, ...]] = []
    run: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        run.append(t)
        size += t.numel() * t.element_size()
        if size * parts >= total * (len(groups) + 1) and len(groups) < parts - 1:
            groups.append(tuple(run))
            run = []
    return [*groups, tuple(run)] if run else groups


@dataclass
class WeightWatch:
    """The parameters and buffers a run may not change, checked after each candidate.

    A change is seen by the version counter (every in-place op through autograd's view of
    the tensor) or by the fingerprint (writes through `.data` or raw pointers bypass the
    counter; a sample of `SAMPLES` strided elements and a float64 sum, one read of the
    weights per check: less than a forward, which reads them at least once).
    """

    tensors: dict[int, torch.Tensor]
    names: dict[int, str]
    prints: dict[int, Fingerprint] = field(default_factory=dict)
    snapshot: dict[int, torch.Tensor] | None = None
    snapshots: bool = True  # False after selection: no copy of the weights is kept for good
    # the floating weights of one device, in `parts` groups of about equal bytes; `unchanged`
    # compares one group's fingerprints joined per check, the groups in turn
    parts: int = 1
    groups: list[tuple[torch.Tensor, ...]] = field(default_factory=list)
    group_prints: list[torch.Tensor] = field(default_factory=list)
    turn: int = 0
    ungrouped: tuple[int, ...] = ()  # positions outside the groups, fingerprinted one by one

    def __post_init__(self) -> None:
        self.prints = {i: Fingerprint.of(t) for i, t in self.tensors.items()}
        floating = [t for t in self.tensors.values() if t.is_floating_point()]
        if floating and len({t.device for t in floating}) == 1:
            self.groups = _groups(floating, self.parts)
            self.group_prints = [_joined(group) for group in self.groups]
        grouped = {id(t) for group in self.groups for t in group}
        self.ungrouped = tuple(i for i, t in self.tensors.items() if id(t) not in grouped)
        size = sum(t.numel() * t.element_size() for t in self.tensors.values())
        if self.snapshots and size <= SNAPSHOT_BYTES:
            self.snapshot = {i: t.detach().to("cpu", copy=True) for i, t in self.tensors.items()}

    def unchanged(self) -> bool:
        """Whether the weights look as they did: every version counter, the fingerprints of
        the weights outside the groups, and one comparison of the next group's fingerprints
        joined (a few ops per weight where `changed` takes a dozen: on a tiny BERT 0.45 ms
        instead of 1.4 ms for all). False may be a NaN in a weight."""
        if any(version(t) != self.prints[i].version for i, t in self.tensors.items()):
            return False
        for i in self.ungrouped:
            if not Fingerprint.of(self.tensors[i]).same_values(self.prints[i]):
                return False
        if not self.groups:
            return True
        k, self.turn = self.turn, (self.turn + 1) % len(self.groups)
        return torch.equal(_joined(self.groups[k]), self.group_prints[k])

    def changed(self) -> tuple[list[int], list[int]]:
        """(positions whose values changed, positions written in place with values unchanged)."""
        values, versions = [], []
        if self.unchanged():
            return values, versions
        for i, t in self.tensors.items():
            now = Fingerprint.of(t)
            if not now.same_values(self.prints[i]):
                values.append(i)
            elif now.version != self.prints[i].version:
                versions.append(i)
        return values, versions

    def check(self, backend: str) -> str | None:
        """None when `backend`'s run left every weight as it was; else the mismatch reason,
        after restoring the weights it changed. WeightsDamaged when they cannot be."""
        values, versions = self.changed()
        if not values and not versions:
            return None
        named = ", ".join(self.names[i] for i in values or versions)
        if not values:
            self._refresh(versions)
            return f"changed weight {named} in place (values unchanged)"
        if self.snapshot is None:
            why = (
                f"weights over {SNAPSHOT_BYTES} bytes"
                if self.snapshots
                else "no copy is kept once a winner runs"
            )
            raise WeightsDamaged(
                f"{backend} changed weight(s) {named} in place, and the chain kept no copy "
                f"to restore them ({why}): the model's weights are no longer what they were; "
                "reload them",
                intact=self.intact,
            )
        with torch.no_grad():  # behind the counter: the chain's own undo is no user update
            for i in values:  # (a moved counter is how the run-time watch knows the user's)
                self.tensors[i].data.copy_(self.snapshot[i])
        self._refresh(values + versions)
        return f"changed weight {named} in place (restored)"

    def intact(self) -> bool:
        """Whether every weight holds its fingerprinted values again (each one read)."""
        return all(Fingerprint.of(t).same_values(self.prints[i]) for i, t in self.tensors.items())

    def _refresh(self, positions: Sequence[int]) -> None:
        """Take the fingerprints anew (a restore moves the version counter on)."""
        for i in positions:
            self.prints[i] = Fingerprint.of(self.tensors[i])
        self.group_prints = [_joined(group) for group in self.groups]


@dataclass(frozen=True)
class Isolation:
    """Per input position: which ones each run copies and which weights are watched."""

    copied: tuple[int, ...]
    watched: tuple[int, ...]
    names: tuple[str, ...]

    @classmethod
    def of(cls, gm: fx.GraphModule, inputs: Sequence[object]) -> Isolation:
        weights = set(weight_inputs(gm, inputs)) - written_inputs(gm)
        tensors = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        return cls(
            copied=tuple(i for i in tensors if i not in weights),
            watched=tuple(i for i in tensors if i in weights),
            names=tuple(input_names(gm, len(inputs))),
        )

    def watch(
        self, inputs: Sequence[object], snapshots: bool = True, parts: int = 1
    ) -> WeightWatch:
        """A watch over this call's weights (taken before any candidate runs; after
        selection, without snapshots and in `parts`, for the winner's re-verifications)."""
        tensors = {i: t for i in self.watched if isinstance(t := inputs[i], torch.Tensor)}
        names = {i: self.names[i] for i in tensors}
        return WeightWatch(tensors, names, snapshots=snapshots, parts=parts)


def fresh_copy(x: torch.Tensor) -> torch.Tensor:
    """A copy with the same values, layout (`clone` keeps strides) and requires_grad."""
    return x.detach().clone().requires_grad_(x.requires_grad)


def compile_copy(x: torch.Tensor) -> torch.Tensor:
    """A `fresh_copy` for a backend's compile that keeps what dynamo knows of `x`: its
    symbolic context (static or symbolic sizes, and their source) in the tracing context.

    Without it, a compiler that fakifies its inputs in dynamo's fake mode (inductor, through
    aot_autograd) sees an unknown tensor, gives it fresh symbolic sizes in dynamo's shape
    env with no source, compiles a dynamic kernel for a static graph, and its guards on
    those sizes crash dynamo's guard building (`IndexError` in `produce_guards_verbose`).
    """
    from torch._guards import TracingContext

    copy = fresh_copy(x)
    context = TracingContext.try_get()
    if context is not None and x in context.tensor_to_context:
        context.tensor_to_context[copy] = context.tensor_to_context[x]
    return copy
