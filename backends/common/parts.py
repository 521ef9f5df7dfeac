"""The export hooks' vocabulary: what a backend's exporter returns and its loader builds.

A backend that can be exported declares two hooks (`register_backend(exporter=...,
loader=...)`):
- `exporter(request: ExportRequest) -> ExportedParts | None`: the graph to stitch and its
  compiled parts (`Part`: a payload's header and body, which submodule call it replaces,
  and the example it must reproduce), or None when it has nothing to export for this graph
  (raising `Unsupported` says why: the export's notes keep the reason).
- `loader(header, body, device) -> Runner`: checks that this process can run the payload
  (raising `RuntimeMissing` / `PayloadMismatch` with one line naming what to do), then
  builds the runner: `runner(inputs) -> list[Tensor]`.
`chain.deploy` does the rest (capture, verification of every part, stitching, the op).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from backends.common.payload import Header, pack

Runner = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]
Loader = Callable[[Header, bytes, torch.device], Runner]
WHOLE = "_run_on_acc_whole"  # the submodule name of a part that is the whole graph


@dataclass(frozen=True)
class Part:
    """One compiled submodule as a payload: which of its call's arguments feed it, in order.

    `example_inputs` are the arguments of the submodule's call in one run on the export's
    inputs and `expected` what the payload must return for them (PyTorch's outputs for a
    part that replaces PyTorch code, the compiled part's own otherwise); `chain.deploy`
    checks the payload's runner against them before it stitches the part in.
    """

    name: str
    header: Header
    body: bytes
    input_positions: tuple[int, ...]
    returns_tuple: bool
    ops: int = 0
    example_inputs: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    expected: tuple[torch.Tensor, ...] = field(default=(), compare=False, repr=False)
    # the PyTorch graph the part replaces, on `example_inputs`: the chain judges the part
    # against it by selection's rule (float64 and eager's own error); None: by tolerances
    graph: Any = field(default=None, compare=False, repr=False)
    # the program id a signed payload's binding names (its node carries it; "" if none)
    program: str = ""

    @property
    def payload(self) -> bytes:
        return pack(self.header, self.body)

    @property
    def inputs(self) -> list[torch.Tensor]:
        """The payload's example inputs, in its order."""
        return [self.example_inputs[i] for i in self.input_positions]

    def summary(self) -> dict[str, Any]:
        """JSON-able facts for the export result."""
        return {
            "name": self.name,
            "backend": self.header.backend,
            "built_by": self.header.describe(),
            "ops": self.ops,
            "payload_bytes": len(self.body),
            "sha256": self.header.sha256[:16],
        }


@dataclass(frozen=True)
class ExportRequest:
    """What an exporter gets: the captured graph and how its backend fared on it.

    `gm` takes the flat inputs and returns a flat tuple (parameters and buffers are
    `get_attr` nodes); `compiled` is the backend's compiled callable when it won the graph,
    else None (`status` then says what happened: "unsupported", "slower", "not_tried", ...).
    `dynamic_dims` (flat input position -> dims) are the sizes the program must take at
    any value: a part exported for them has matching dynamic axes, else none is made.
    `verify(part)` is the chain's check of a part (None when its payload reproduces
    `expected`, else the reason): an exporter may use it to leave a failing part to
    PyTorch; `chain.deploy` verifies every returned part anyway.
    """

    gm: fx.GraphModule
    flat_inputs: tuple[Any, ...]
    compiled: Any | None
    status: str
    verify: Callable[[Part], str | None]
    torch_executed_ops: frozenset[str] = frozenset()
    min_block_size: int = 1
    dynamic_dims: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def won(self) -> bool:
        return self.compiled is not None

    @property
    def untaken(self) -> bool:
        """It passed but lost on speed, or the chain never tried it."""
        return self.status in ("slower", "not_tried")


@dataclass
class ExportedParts:
    """A graph module whose `parts` submodule calls become payload calls, and what it did.

    `note` is one line for the graph's notes in the report; `fallback` the ops left to
    PyTorch, by reason (`{op: {reason: count}}`).
    """

    gm: fx.GraphModule
    parts: dict[str, Part]
    note: str
    fallback: dict[str, dict[str, int]] = field(default_factory=dict)


Exporter = Callable[[ExportRequest], "ExportedParts | None"]


def flat_outputs(out: Any) -> tuple[list[torch.Tensor], bool]:
    """A submodule's outputs as a flat list, and whether it returned a tuple."""
    if isinstance(out, tuple | list):
        return list(out), True
    return [out], False


def as_single_call(gm: fx.GraphModule) -> fx.GraphModule:
    """A graph module whose one node calls `gm` whole (submodule `WHOLE`), for a whole part."""
    graph = fx.Graph()
    root = torch.nn.Module()
    root.add_module(WHOLE, gm)
    inputs = [graph.placeholder(n.name) for n in gm.graph.nodes if n.op == "placeholder"]
    call = graph.call_module(WHOLE, tuple(inputs))
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    outs = [graph.call_function(operator.getitem, (call, i)) for i in range(len(output))]
    graph.output(tuple(outs))
    return fx.GraphModule(root, graph)
