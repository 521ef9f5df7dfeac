"""Graph facts that decide how a graph is verified: random ops, input mutation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from chain.report.graphinfo import mutates_inputs, random_ops, writes_placeholders


def _graph(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> fx.GraphModule:
    """The graph dynamo hands a backend for `fn(*args)`."""
    graphs: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        graphs.append(gm)
        return gm.forward

    torch.compile(fn, backend=keep, fullgraph=True)(*args)
    return graphs[0]


@pytest.mark.parametrize(
    ("fn", "random"),
    [
        (lambda x: F.dropout(x, 0.1, False, False), False),  # eval mode, flag positional
        (lambda x: F.dropout(x, 0.1, training=False), False),
        (lambda x: F.dropout(x, 0.0, True), False),  # p == 0 is the identity
        (lambda x: F.dropout(x, 0.1, True, False), True),
        (lambda x: F.dropout(x, 0.1), True),  # training defaults to True
    ],
)
def test_eval_mode_dropout_is_not_random(fn: Callable[..., torch.Tensor], random: bool) -> None:
    assert bool(random_ops(_graph(fn, torch.randn(4)))) is random


@pytest.mark.parametrize(
    ("fn", "writes"),
    [
        (lambda x, m: (x > 0) & m, False),  # operator.and_, not an in-place op
        (lambda x, m: (x > 0) | m, False),
        (lambda x, m: x.add_(1), True),
        (lambda x, m: x.mul_(2) + m.float(), True),
    ],
)
def test_mutation_is_in_place_writes_only(fn: Callable[..., torch.Tensor], writes: bool) -> None:
    gm = _graph(fn, torch.randn(4), torch.ones(4, dtype=torch.bool))
    assert mutates_inputs(gm) is writes


def _scaled_in_place(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 2
    z.mul_(3)  # an intermediate: the inputs are untouched
    return z


def _add_to_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.add_(y)
    return x * 2


def _fill_a_view_of_input(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x.view(-1)[0:2].fill_(1.0)
    return x * 2


@pytest.mark.parametrize(
    ("fn", "writes"),
    [(_scaled_in_place, False), (_add_to_input, True), (_fill_a_view_of_input, True)],
    ids=["intermediate", "input", "view_of_input"],
)
def test_writes_to_inputs_are_told_from_writes_to_intermediates(
    fn: Callable[..., torch.Tensor], writes: bool
) -> None:
    """The race runs a server twice a pair unless the graph writes an input or a view of
    one (chain.run.race): a T5 encoder's in-place op on an intermediate does not count."""
    gm = _graph(fn, torch.randn(4), torch.randn(4))
    assert mutates_inputs(gm)
    assert writes_placeholders(gm) is writes
