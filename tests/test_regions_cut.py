"""Regions of a graph (chain.select.regions.cut): module boundaries, small regions merged,
repeated layers sharing one structural key, and a split graph that computes what the
graph computes."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from chain.select.regions.cut import _merged, _runs, cut, module_path
from tests.models import SmallCNN
from tests.regions_models import bert, captured, dual


@pytest.mark.parametrize("shape", [(2, 8), (1, 16)])
def test_repeated_layers_share_one_key(shape: tuple[int, int]) -> None:
    model = bert(layers=4)
    tokens = torch.randint(0, 100, shape)
    gm, inputs = captured(model, tokens)
    regions = cut(gm, inputs).regions
    layers = [r for r in regions if r.path.startswith("encoder.layer.")]
    assert [r.path for r in layers][:3] == [f"encoder.layer.{i}" for i in range(3)]
    assert len({r.key for r in layers[:3]}) == 1  # identical layers: one trial
    assert len({r.key for r in regions}) < len(regions)
    assert all(r.crossing_in >= 1 for r in regions[1:])  # each takes the stream on


@pytest.mark.parametrize("tokens", [16, 32])
def test_every_layer_of_a_tower_shares_one_key(tokens: int) -> None:
    """The text tower's pooler and the heads after it form their own region: the last layer
    keeps its twins' key (merged into it, it was a region of its own to try)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, tokens))
    gm, inputs = captured(dual(layers=4), ids, torch.randn(2, 3, 16, 16))
    regions = cut(gm, inputs).regions
    layers = [r for r in regions if r.path.startswith("text_model.encoder.layer.")]
    assert [r.path for r in layers] == [f"text_model.encoder.layer.{i}" for i in range(4)]
    assert len({r.key for r in layers}) == 1
    assert all(r.ops >= 8 for r in regions)


def test_keys_differ_where_shapes_differ() -> None:
    model = bert(layers=2)
    a = cut(*captured(model, torch.randint(0, 100, (2, 8))))
    b = cut(*captured(model, torch.randint(0, 100, (2, 12))))
    assert {r.key for r in a.regions}.isdisjoint({r.key for r in b.regions})


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_split_graph_computes_the_graph(grad: type) -> None:
    gm, inputs = captured(bert(layers=3), torch.randint(0, 100, (2, 8)))
    split = cut(gm, inputs).split
    with grad():
        want, got = gm(*inputs), split(*inputs)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_module_paths_and_small_regions_merged() -> None:
    gm, inputs = captured(SmallCNN().eval(), torch.randn(2, 3, 16, 16))
    paths = {module_path(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert ("head",) in paths and ("features", "0") in paths
    regions = cut(gm, inputs, min_nodes=4).regions
    assert all(r.ops >= 4 for r in regions)  # each region big enough for a crossing
    assert sum(r.ops for r in regions) == len(
        [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    )


def test_runs_cut_deeper_only_when_too_big() -> None:
    paths = [("a", "0")] * 3 + [("a", "1")] * 3 + [("b",)] * 2
    index = list(range(len(paths)))
    assert _runs(index, paths, 1, max_nodes=10) == [[0, 1, 2, 3, 4, 5], [6, 7]]
    assert _runs(index, paths, 1, max_nodes=4) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert _merged([[0, 1, 2], [3, 4, 5], [6, 7]], min_nodes=3) == [[0, 1, 2], [3, 4, 5, 6, 7]]
    assert _merged([[0], [1, 2, 3]], min_nodes=3) == [[0, 1, 2, 3]]
    small_together = [[0, 1, 2], [3, 4, 5], [6], [7], [8, 9], [10]]
    assert _merged(small_together, min_nodes=3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9, 10]]


def test_a_graph_without_module_paths_is_one_region() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * 2 + 1).sum(-1)

    gm = fx.symbolic_trace(f)
    regions = cut(gm, [torch.randn(3, 4)]).regions
    assert len(regions) == 1 and regions[0].path == "(top)"
