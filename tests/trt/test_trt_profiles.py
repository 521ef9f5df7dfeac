"""TensorRT optimization profiles per bucket range (backends.tensorrt.conversion.profiles):
min/opt/max per input from dynamo's symbol ranges and the hot shapes, computed on CPU from
a real dynamo graph; the engine build with those profiles runs only where TensorRT is."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import fx

from backends.tensorrt.conversion.profiles import (
    Range,
    bucket_profiles,
    input_dims,
    symbol_ranges,
)
from tests.models import build_extra


@pytest.fixture(scope="module")
def dynamic_graph() -> tuple[fx.GraphModule, list[Any]]:
    """The graph dynamo hands a backend for a tiny BERT compiled with dynamic sizes."""
    model, _ = build_extra("bert")
    seen: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, dynamic=True)(torch.randint(0, 100, (2, 12)))
    return seen[-1]


def test_symbol_ranges_and_input_dims_come_from_the_dynamo_graph(
    dynamic_graph: tuple[fx.GraphModule, list[Any]],
) -> None:
    gm, _ = dynamic_graph
    ranges = symbol_ranges(gm)
    dims = input_dims(gm)
    ids = [d for d in dims.values() if len(d) == 2 and all(isinstance(x, str) for x in d)]
    assert ids, dims  # the token ids: (batch, length), both symbolic under dynamic=True
    batch, length = ids[0]
    assert ranges[batch] == Range(2, None)  # dynamo specializes 0 and 1; no upper bound
    # the length indexes the position embeddings: dynamo bounds it by their count
    assert ranges[length].lower == 2 and ranges[length].upper == 64
    weights = [d for d in dims.values() if all(isinstance(x, int) for x in d)]
    assert weights  # parameters: fixed sizes, the same in every profile


def test_one_profile_per_hot_shape_each_covering_the_sizes_up_to_it() -> None:
    dims = {"ids": (2, "s1"), "mask": (2, "s1"), "w": (100, 32)}
    ranges = {"s1": Range(2, None)}
    hot = [{"s1": 24}, {"s1": 16}, {"s1": 32}]
    profiles = bucket_profiles(dims, ranges, hot, tail_max=64)
    assert [p.shapes["ids"] for p in profiles] == [
        ((2, 2), (2, 16), (2, 16)),
        ((2, 17), (2, 24), (2, 24)),
        ((2, 25), (2, 32), (2, 32)),
        ((2, 33), (2, 33), (2, 64)),  # the tail: past the hottest, up to tail_max
    ]
    assert all(p.shapes["w"] == ((100, 32),) * 3 for p in profiles)
    assert [p.shapes["mask"] for p in profiles] == [p.shapes["ids"] for p in profiles]
    no_tail = bucket_profiles(dims, {"s1": Range(2, 32)}, hot, tail_max=64)
    assert len(no_tail) == 3  # the range ends at the hottest size: no tail


def test_two_symbols_each_get_their_own_ranges() -> None:
    dims = {"x": ("s0", "s1")}
    ranges = {"s0": Range(2, 8), "s1": Range(4, None)}
    hot = [{"s0": 4, "s1": 16}, {"s0": 8, "s1": 16}]
    (a, b) = bucket_profiles(dims, ranges, hot, tail_max=None)
    assert a.shapes["x"] == ((2, 4), (4, 16), (4, 16))
    assert b.shapes["x"] == ((5, 4), (8, 16), (8, 16))


@pytest.mark.parametrize(
    ("dims", "ranges", "hot", "match"),
    [
        ({"x": ("s0",)}, {}, [{"s0": 4}], "no range for symbol s0"),
        ({"x": ("s0",)}, {"s0": Range(2, 8)}, [{"s0": 9}], "s0=9 outside its range 2..8"),
        ({"x": ("s0",)}, {"s0": Range(2, 8)}, [{}], "the hot shape gives no size for s0"),
        ({"x": ("2*s0",)}, {"s0": Range(2, 8)}, [{"s0": 4}], "expression 2\\*s0"),
        ({"x": ("s0",)}, {"s0": Range(2, None)}, [], "no hot shape"),
    ],
)
def test_what_cannot_become_a_profile_is_a_reason(
    dims: dict[str, Any], ranges: dict[str, Range], hot: list[dict[str, int]], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        bucket_profiles(dims, ranges, hot, tail_max=64)


@pytest.mark.tensorrt
def test_an_engine_with_one_profile_per_bucket_runs_each_range() -> None:
    """A real engine with three profiles over a dynamic length (GPU and TensorRT only)."""
    import onnx
    from onnx import TensorProto, helper

    from backends.tensorrt.conversion.engine import build_engine
    from backends.tensorrt.conversion.onnx import OnnxModel

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, "s1"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "s1"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    onnx.checker.check_model(model)
    profiles = bucket_profiles(
        {"x": (2, "s1")}, {"s1": Range(2, None)}, [{"s1": 16}, {"s1": 32}], tail_max=64
    )
    engine, _ = build_engine(
        OnnxModel(data, ("x",), ("y",)), [], 1 << 28, 3, None, profiles=profiles
    )
    import tensorrt as trt

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    built = runtime.deserialize_cuda_engine(engine)
    assert built.num_optimization_profiles == 3
    assert tuple(built.get_tensor_profile_shape("x", 1)) == ((2, 17), (2, 32), (2, 32))
