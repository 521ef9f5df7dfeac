"""ONNX Runtime compiled for one shape, as a per-shape bucket asks (chain.run.buckets): the
graph specialized for a call's sizes hands its ints in as plain ints, which the export
inlines (`OnnxGraph.fixed`) and the runner checks at every call. On CUDA the backend
builds such a session; on CPU it declines, with the measured reason (`FIXED_ON_CPU`).

Before, the exporter refused a plain int ("only symbolic ints"), so ONNX Runtime, its CUDA
graphs variant included, could never serve a hot length of a `dynamic=True` graph, and the
bucket said only "no fixed-shape candidate passed". And a graph's module floats (a norm's
eps, passed as a 0-d tensor under `dynamic=True`) were lost to any compile after dynamo's:
it deletes its record of where each input comes from once the backend returns.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

from backends import Unsupported, lookup_backend
from backends.common.fx_utils import keep_graphargs
from backends.common.onnx_export import export_onnx
from backends.common.onnx_prepare import module_scalars
from backends.onnxruntime import FIXED_ON_CPU, OrtRunner, build_runner
from backends.onnxruntime.artefact import FORMAT, from_artefact
from backends.onnxruntime.facts import output_nodes, output_specs
from backends.onnxruntime.runtime import FixedIntChanged
from chain import chain
from chain.report.bucket_stats import LOST
from chain.run.buckets.shapes import specialize
from tests.models import build_extra

BACKEND = lookup_backend("onnxruntime")
MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
}


def scaled(x: torch.Tensor) -> torch.Tensor:
    """Reads its length as a number (dynamo passes it as an int input under dynamic=True)."""
    return x * x.shape[1] + torch.arange(x.shape[1], dtype=x.dtype)


def specialized(x: torch.Tensor) -> tuple[torch.fx.GraphModule, list[Any]]:
    """`scaled`'s dynamic graph specialized for `x`, with the call's concrete inputs: what a
    bucket compiles (chain.run.buckets.shapes.specialize)."""
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(scaled, backend=backend, dynamic=True)(x)
    ((gm, inputs),) = graphs
    concrete = [x if isinstance(v, torch.Tensor) else int(v.node.hint) for v in inputs]
    assert any(type(v) is int for v in concrete), inputs  # the graph does take its length
    return specialize(gm), concrete


def fixed_runner(gm: torch.fx.GraphModule, inputs: list[Any]) -> OrtRunner:
    """The backend's runner with its ints inlined, as it builds one on CUDA."""
    outputs, single = output_nodes(gm)
    export = lambda x: export_onnx(gm, x, carry_ints=True, fix_ints=True)  # noqa: E731
    return build_runner(inputs, None, output_specs(outputs), single, export)


def test_a_plain_int_is_inlined_and_another_value_refused() -> None:
    """Inlined, answered right, and a call with another int raises (never a wrong answer);
    the export without `fix_ints` still refuses it; the backend on CPU declines, saying why."""
    x = torch.randn(2, 7)
    gm, inputs = specialized(x)
    runner = fixed_runner(gm, inputs)
    (position,) = runner.graph.fixed  # the length, the one int the graph reads
    assert runner.graph.fixed == {position: 7} and inputs[position] == 7
    assert runner.chain_details["fixed_ints"] == {str(position): 7}
    torch.testing.assert_close(runner(*inputs)[0], scaled(x))
    other = [8 if i == position else v for i, v in enumerate(inputs)]
    with pytest.raises(FixedIntChanged, match="compiled for 7"):
        runner(*other)
    with pytest.raises(Unsupported, match="plain int"):
        export_onnx(gm, inputs)
    with pytest.raises(Unsupported) as declined:
        BACKEND(gm, inputs)
    assert declined.value.reason == FIXED_ON_CPU


def test_the_artefact_keeps_its_fixed_ints_and_reads_the_format_before() -> None:
    """A stored export rebuilds a runner that still checks its int; an artefact of format 2
    (written before fixed ints existed) reads as having none."""
    x = torch.randn(2, 5)
    gm, inputs = specialized(x)
    runner = fixed_runner(gm, inputs)
    data = runner.chain_artefact.data
    again = from_artefact(data)
    assert again.fixed == runner.graph.fixed != {}
    outputs, single = output_nodes(gm)
    rebuilt = build_runner(inputs, again, output_specs(outputs), single, lambda _: again)
    (position,) = again.fixed
    torch.testing.assert_close(rebuilt(*inputs)[0], scaled(x))
    with pytest.raises(FixedIntChanged):
        rebuilt(*[4 if i == position else v for i, v in enumerate(inputs)])
    first, _, rest = data.partition(b"\n")
    assert first.split(b" ")[1] == str(FORMAT).encode()
    # the same model without the field, as format 2 wrote it: read, with no fixed int
    size = int(first.split(b" ")[2])
    header = json.loads(rest[:size])
    del header["fixed"]
    text = json.dumps(header, sort_keys=True).encode()
    old = b"onnxruntime-artefact 2 " + str(len(text)).encode() + b"\n" + text + rest[size:]
    assert from_artefact(old).fixed == {}


@pytest.mark.parametrize("kept", [True, False], ids=["kept", "dropped"])
def test_module_floats_are_found_after_dynamos_compile_returned(kept: bool) -> None:
    """A tiny BERT under dynamic=True passes its norms' eps as 0-d tensors; a compile after
    dynamo's (a bucket, a re-export) inlines them only if the chain kept dynamo's records
    (`keep_graphargs`, which the chain calls on every graph), and the export then answers
    as eager. Dropped, the export stops at the `.item()` it cannot trace."""
    model, _ = build_extra("bert")
    graphs: list[tuple[torch.fx.GraphModule, list[Any]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        if kept:
            keep_graphargs(gm)
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    x = torch.randint(0, 100, (2, 6))
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=True)(x)
    ((gm, inputs),) = graphs  # dynamo has dropped meta["grapharg"] by now
    assert all("grapharg" not in n.meta for n in gm.graph.find_nodes(op="placeholder"))
    concrete = [v if isinstance(v, torch.Tensor) else int(v.node.hint) for v in inputs]
    assert bool(module_scalars(gm, concrete)) == kept
    special = specialize(gm)
    with torch.no_grad():
        if not kept:
            with pytest.raises(Unsupported, match="data-dependent"):
                export_onnx(special, concrete, fix_ints=True)
            return
        runner = fixed_runner(special, concrete)
        for got, want in zip(runner(*concrete), gm(*concrete), strict=True):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
@pytest.mark.parametrize("mode", list(MODES))
def test_on_cpu_hot_lengths_keep_the_general_session_and_say_why(
    mode: str, dynamic: bool | None
) -> None:
    """A tiny BERT, ONNX Runtime the general winner, buckets on: each hot length's bucket is
    declined with the measured reason (not "no candidate passed" alone), and every answer
    is eager's, including after `load_state_dict` and an in-place update of every weight."""
    model, _ = build_extra("bert")
    backend = chain("onnxruntime", "eager", bucket_after=2, measure_budget_s=0.05)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    lengths = (6, 9, 6, 9, 6, 9, 6, 9)

    def check() -> None:
        with MODES[mode]():
            for n in lengths:
                x = torch.randint(0, 100, (2, n), generator=torch.Generator().manual_seed(n))
                torch.testing.assert_close(
                    compiled(x).last_hidden_state, model(x).last_hidden_state
                )

    check()
    (graph,) = [g for g in backend.report.graphs if g.buckets is not None]
    assert graph.winner == "onnxruntime"
    buckets = graph.buckets.buckets
    assert len(buckets) == 2
    for bucket in buckets:
        (attempt,) = bucket.attempts
        assert (attempt.backend, attempt.reason) == ("onnxruntime", FIXED_ON_CPU)
        assert bucket.state == LOST and bucket.calls == 0
    other, _ = build_extra("bert")
    torch.manual_seed(1)
    for p in other.parameters():
        p.data.normal_(0, 0.05)
    model.load_state_dict(other.state_dict())
    check()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9).add_(0.01)
    check()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", list(MODES))
def test_on_cuda_onnxruntime_serves_hot_lengths_as_buckets(mode: str) -> None:
    """On CUDA, a hot length of a dynamic=True tiny BERT gets an ONNX Runtime session of its
    own (verified, timed: serving, racing or lost on its timing, never declined), and every
    answer is eager's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA execution provider (onnxruntime-gpu)")
    model, _ = build_extra("bert")
    model = model.cuda()
    backend = chain("onnxruntime", "eager", bucket_after=2, measure_budget_s=0.05)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with MODES[mode]():
        for n in (6, 9, 6, 9, 6, 9, 6, 9):
            x = torch.randint(0, 100, (2, n), device="cuda")
            torch.testing.assert_close(compiled(x).last_hidden_state, model(x).last_hidden_state)
    (graph,) = [g for g in backend.report.graphs if g.buckets is not None]
    for bucket in graph.buckets.buckets:
        (attempt, *_) = bucket.attempts
        assert attempt.backend == "onnxruntime"
        assert attempt.status.value in ("won", "slower"), (bucket.reason, attempt.reason)
