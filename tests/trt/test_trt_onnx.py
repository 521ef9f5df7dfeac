"""The ONNX model exported for each TensorRT block matches the block in ONNX Runtime (CPU).

This is the model TensorRT's parser would read; checking it here means an engine built from
it starts from the right numbers.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

from backends.tensorrt.conversion.onnx import export_block
from backends.tensorrt.partitioning import PartitionOptions
from backends.tensorrt.pipeline import plan
from tests.trt.helpers import dynamo_graph

ort = pytest.importorskip("onnxruntime")
graph = functools.cache(dynamo_graph)


@pytest.mark.parametrize(
    ("name", "min_block_size"), [("cnn", 5), ("transformer", 5), ("mlp", 5), ("two_outputs", 1)]
)
def test_each_block_exports_to_onnx_matching_pytorch(name: str, min_block_size: int) -> None:
    gm, inputs, _ = graph(name)
    the_plan = plan(gm, inputs, PartitionOptions(min_block_size=min_block_size))
    assert the_plan.result.blocks
    for block_name in the_plan.result.blocks:
        block, block_inputs = the_plan.block(block_name), the_plan.engine_inputs[block_name]
        model = export_block(block, block_inputs)
        proto = onnx.load_from_string(model.data)
        assert len(proto.graph.initializer) > 0 or name == "two_outputs"
        assert len(model.input_names) == len(block_inputs)  # weights are not inputs
        session = ort.InferenceSession(model.data, providers=["CPUExecutionProvider"])
        feeds = {n: t.numpy() for n, t in zip(model.input_names, block_inputs, strict=True)}
        got = session.run(list(model.output_names), feeds)
        with torch.no_grad():
            want = block(*block_inputs)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)
