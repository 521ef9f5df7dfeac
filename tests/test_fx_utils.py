"""The shared FX helpers: op names, attribute fetch, call recording, weights, training, RNG."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import fx

from backends.common.cudagraph_preconditions import check_random
from backends.common.fx_utils import (
    bare_op_name,
    fetch_attr,
    grad_inputs,
    op_name,
    record_calls,
    refuse_training,
    weight_inputs,
)
from backends.errors import Unsupported
from chain.report.graphinfo import random_ops


def _dynamo_graph(
    fn: Callable[..., torch.Tensor], *args: torch.Tensor
) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The graph and example inputs dynamo hands a backend for `fn(*args)`."""
    seen: list[tuple[fx.GraphModule, list[torch.Tensor]]] = []

    def keep(gm: fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., object]:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=keep, fullgraph=True)(*args)
    return seen[0]


def test_op_names_qualified_and_bare() -> None:
    gm = fx.symbolic_trace(lambda x: torch.relu(x).add_(1) + torch.ops.aten.sigmoid.default(x))
    calls = [n for n in gm.graph.nodes if n.op.startswith("call")]
    assert [op_name(n) for n in calls] == [
        "torch.relu",
        "Tensor.add_",
        "aten.sigmoid.default",
        "_operator.add",
    ]
    assert [bare_op_name(n) for n in calls] == ["relu", "add_", "sigmoid", "add"]


def test_fetch_attr_follows_dotted_targets() -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 3)))
    assert fetch_attr(model, "0.0.weight") is model[0][0].weight
    with pytest.raises(AttributeError):
        fetch_attr(model, "0.0.missing")


def test_record_calls_keeps_arguments_and_outputs_of_chosen_nodes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    gm = fx.symbolic_trace(model)
    x = torch.randn(4, 2)
    seen = record_calls(gm, [x], lambda n: n.op == "call_module" and n.target == "1")
    assert list(seen) == ["1"]
    (arg,), out = seen["1"]
    torch.testing.assert_close(arg, model[0](x))
    torch.testing.assert_close(out, model(x))
    assert not out.requires_grad  # recorded without autograd


def test_weight_inputs_are_the_lifted_parameters_and_buffers() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    gm, inputs = _dynamo_graph(model, torch.randn(2, 4))
    found = weight_inputs(gm, inputs)
    assert len(found) == 6  # weight, bias; running mean, var; weight, bias
    data = [i for i in range(len(inputs)) if i not in found]
    assert len(data) == 1 and inputs[data[0]].shape == (2, 4)


def test_training_graphs_are_refused_only_in_grad_mode() -> None:
    inputs = [torch.randn(2), torch.randn(2, requires_grad=True)]
    assert grad_inputs(inputs) == [1]
    with pytest.raises(Unsupported, match=r"training graph: 1 input\(s\).*position 1\); X:"):
        refuse_training(inputs, "X")
    with torch.no_grad():
        assert grad_inputs(inputs) == []
        refuse_training(inputs, "X")


@pytest.mark.parametrize(
    ("fn", "random"),
    [
        (lambda x: torch.ops.aten.bernoulli.p(x, 0.5), True),  # an overload named by its .p
        (lambda x: torch.ops.aten.normal.Tensor_float(x), True),
        (lambda x: F.rrelu(x), False),  # training=False by default: a fixed slope
        (lambda x: F.rrelu(x, training=True), True),
    ],
)
def test_random_ops_read_the_one_list(fn: Callable[..., torch.Tensor], random: bool) -> None:
    gm = fx.symbolic_trace(fn)
    assert bool(random_ops(gm)) is random
    assert (check_random(gm, []) is not None) is random
