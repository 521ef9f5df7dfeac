"""TensorRT optimization profiles per bucket range (backends.tensorrt.conversion.profiles):
min/opt/max per input from dynamo's symbol ranges and the hot shapes, computed on CPU from
a real dynamo graph; the engine build with those profiles runs only where TensorRT is."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import fx

from backends.common.fx_utils import symbolic_inputs
from backends.tensorrt.conversion.convert import by_onnx_name
from backends.tensorrt.conversion.graph_profiles import block_profiles, profile_refusal
from backends.tensorrt.conversion.onnx import export_block
from backends.tensorrt.conversion.profiles import (
    Range,
    bucket_profiles,
    input_dims,
    symbol_ranges,
)
from backends.tensorrt.pipeline import plan
from backends.tensorrt.settings import Settings
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


@pytest.fixture(scope="module")
def two_lengths() -> tuple[torch.nn.Module, fx.GraphModule, list[Any]]:
    """The graph dynamo hands a backend for a tiny BERT called at lengths 12 then 16: the
    length turns symbolic (automatic dynamic), the batch stays 2."""
    model, _ = build_extra("bert")
    seen: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=capture)
    with torch.no_grad():
        for length in (12, 16):
            compiled(torch.randint(0, 100, (2, length)))
    assert len(seen) == 2
    return model, *seen[-1]


def test_a_length_bounded_by_the_position_embeddings_can_get_profiles(
    two_lengths: tuple[torch.nn.Module, fx.GraphModule, list[Any]],
) -> None:
    _, gm, _ = two_lengths
    assert symbolic_inputs(gm, []), "dynamo should have made the length symbolic"
    assert profile_refusal(gm) is None


def test_an_unbounded_batch_cannot_get_profiles(
    dynamic_graph: tuple[fx.GraphModule, list[Any]],
) -> None:
    gm, _ = dynamic_graph  # dynamic=True: the batch is symbolic too, with no upper bound
    batch = next(d[0] for d in input_dims(gm).values() if len(d) == 2 and isinstance(d[0], str))
    reason = profile_refusal(gm)
    assert reason == (
        f"symbol(s) without an upper bound ({batch} >= 2): an optimization profile needs a max"
    )
    with pytest.raises(ValueError, match="without an upper bound"):
        block_profiles(gm, [], ())


def test_a_symbolic_graph_plans_and_exports_with_a_dynamic_length(
    two_lengths: tuple[torch.nn.Module, fx.GraphModule, list[Any]],
) -> None:
    """The whole pipeline short of TensorRT, on CPU: the ATen graph keeps the length
    symbolic, each block exports with it as a dynamic ONNX axis (checked by running the
    ONNX model with ONNX Runtime at other lengths), and gets one profile per range."""
    import onnx
    import onnxruntime as ort

    _, gm, example_inputs = two_lengths
    the_plan = plan(gm, example_inputs, Settings().partition_options(), dynamic=True)
    assert list(the_plan.result.blocks) == ["_run_on_acc_0"]  # the whole BERT
    block = the_plan.block("_run_on_acc_0")
    inputs = the_plan.engine_inputs["_run_on_acc_0"]
    exported = export_block(block, inputs, dynamic=True)
    proto = onnx.load_from_string(exported.data)
    (ids,) = proto.graph.input
    batch, length = ids.type.tensor_type.shape.dim
    assert batch.dim_value == 2 and length.dim_param  # the length is a dynamic axis
    assert exported.input_positions == (1,)  # the SymInt length is read from the ids' shape

    profiles = by_onnx_name(block, exported, block_profiles(block, inputs, (8, 32)))
    assert [p.shapes[ids.name] for p in profiles] == [
        ((2, 2), (2, 8), (2, 8)),
        ((2, 9), (2, 16), (2, 16)),  # the example length is TensorRT's opt point
        ((2, 17), (2, 32), (2, 32)),
        ((2, 33), (2, 33), (2, 64)),  # up to the 64 position embeddings
    ]
    session = ort.InferenceSession(exported.data, providers=["CPUExecutionProvider"])
    for length in (5, 16, 40):
        tokens = torch.randint(0, 100, (2, length))
        args = [length, tokens, *example_inputs[2:]]
        with torch.no_grad():
            want = gm(*args)
        got = session.run(None, {ids.name: tokens.numpy()})
        assert [tuple(g.shape) for g in got] == [(2, length, 32), (2, 32)]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-4, atol=1e-4)


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


@pytest.mark.tensorrt
def test_the_backend_serves_every_length_of_a_symbolic_graph_from_one_engine(
    tmp_path: Any,
) -> None:
    """A tiny BERT on the GPU at lengths 12, 16 (symbolic from here), then 5, 20 and 40:
    one engine with profiles cut at 8 and 32 serves every length, matching eager."""
    from chain import Status, chain

    model, _ = build_extra("bert")
    model = model.cuda()
    options = {"tensorrt": {"cache_dir": str(tmp_path), "profile_sizes": [8, 32]}}
    c = chain("tensorrt", "eager", options=options, eager_floor=False)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        for length in (12, 16, 5, 20, 40):
            tokens = torch.randint(0, 100, (2, length), device="cuda")
            got, want = compiled(tokens), model(tokens)
            torch.testing.assert_close(
                got.last_hidden_state, want.last_hidden_state, rtol=1e-3, atol=1e-3
            )
    symbolic = c.report.graphs[-1].attempts[0]
    assert (symbolic.backend, symbolic.status) == ("tensorrt", Status.WON), symbolic.reason
    assert symbolic.details["engines"] == 1 and symbolic.details["profiles"] == 4
    assert len(c.report.graphs) == 2  # lengths 5, 20 and 40 reused the symbolic graph


def test_profile_sizes_is_an_option_of_sizes() -> None:
    import backends
    from backends.errors import InvalidOption

    assert Settings.from_options({"profile_sizes": [32, 8]}).profile_sizes == (32, 8)
    assert Settings().profile_sizes == ()
    with pytest.raises(InvalidOption, match="a list of sizes"):
        backends.lookup_backend("tensorrt").check_options({"profile_sizes": 8})
