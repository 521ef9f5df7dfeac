"""cudagraphs backend: precondition reasons on CPU graphs, torch's skips as reasons, CUDA runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.experimental.proxy_tensor import make_fx

from backends import Unsupported, lookup_backend
from backends.common.cudagraph_preconditions import check_preconditions
from backends.cudagraphs import (
    clone_outputs,
    compile_with_torch,
    cudagraphs,
    cudagraphs_available,
    watch_cudagraph_skips,
)
from chain.report.records import UNDECIDED
from tests.helpers import compile_and_check
from tests.models import MODELS, build, launch_bound
from tests.timed import until_decided

Captured = tuple[fx.GraphModule, list[Any]]


def dynamo_graphs(fn: Callable[..., Any], *args: Any, **compile_kwargs: Any) -> list[Captured]:
    """The graphs (and example inputs) dynamo hands a backend for `fn(*args)`."""
    seen: list[Captured] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=capture, **compile_kwargs)(*args)
    return seen


def reason_through_dynamo(fn: Callable[..., Any], *args: Any, **compile_kwargs: Any) -> str | None:
    ((gm, example_inputs),) = dynamo_graphs(fn, *args, **compile_kwargs)
    return check_preconditions(gm, example_inputs)


def hand_graph(build_body: Callable[[fx.Graph, fx.Node], fx.Node]) -> fx.GraphModule:
    """A graph with one placeholder `x`, built node by node, without any metadata."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build_body(graph, x))
    return fx.GraphModule(nn.Module(), graph)


def test_registered_under_its_name() -> None:
    assert lookup_backend("cudagraphs").compiler is cudagraphs.compiler


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_available_says_why_not_on_this_machine() -> None:
    built = torch.backends.cuda.is_built()
    assert cudagraphs_available() == ("no CUDA device" if built else "torch built without CUDA")


DYNAMO_CASES = {
    "in-place add": (lambda x: x.add_(1), {}, "input mutation: add_ writes input l_x_ in place"),
    "write through a view": (
        lambda x: x[0].mul_(2),
        {},
        "input mutation: mul_ writes input l_x_ in place",
    ),
    "relu inplace=True": (
        lambda x: F.relu(x, inplace=True),
        {},
        "input mutation: relu writes input l_x_ in place",
    ),
    "in-place add on a copy (reshape of a transpose)": (
        lambda x: x.t().reshape(-1).add_(1),
        {},
        "CPU tensor in the graph: input l_x_ is on cpu",
    ),
    "dynamic=True": (lambda x: x.sin() * x.shape[0], {"dynamic": True}, "dynamic shapes: input s"),
    "torch.rand": (lambda x: x + torch.rand(3), {}, "random op: rand"),
    "dropout in train mode": (
        lambda x: F.dropout(x, 0.5, training=True),
        {},
        "random op: dropout in training mode",
    ),
    "plain CPU graph": (lambda x: x.sin() + 1, {}, "CPU tensor in the graph: input l_x_ is on cpu"),
}


@pytest.mark.parametrize("case", DYNAMO_CASES)
def test_dynamo_graph_reasons(case: str) -> None:
    fn, compile_kwargs, expected = DYNAMO_CASES[case]
    reason = reason_through_dynamo(fn, torch.randn(4, 3), **compile_kwargs)
    assert reason is not None and reason.startswith(expected), reason


def test_nonzero_is_data_dependent() -> None:
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        reason = reason_through_dynamo(lambda x: torch.nonzero(x).sum(), torch.randn(4, 3))
    assert reason == "data-dependent op: nonzero"


def test_batchnorm_in_train_mode_mutates_its_buffers() -> None:
    reason = reason_through_dynamo(nn.BatchNorm1d(3).train(), torch.randn(4, 3))
    assert reason is not None and reason.startswith("input mutation: add_ writes input ")
    assert "buffers" in reason


def test_grad_mode_with_parameters_is_a_training_graph() -> None:
    reason = reason_through_dynamo(nn.Linear(3, 3), torch.randn(4, 3))
    assert reason == (
        "training graph: output linear requires grad "
        "(compile and run under torch.no_grad() or torch.inference_mode())"
    )


def test_hand_built_graph_with_trainable_input_in_grad_mode_is_training() -> None:
    gm = hand_graph(lambda g, x: g.call_method("relu", (x,)))
    x = torch.empty(3, device="meta", requires_grad=True)
    reason = check_preconditions(gm, [x])
    assert reason is not None and reason.startswith("training graph: input x requires grad")
    with torch.no_grad():
        assert check_preconditions(gm, [x]) == "no CUDA tensor in the graph"


def test_dropout_module_in_eval_mode_is_not_random() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).eval()
    with torch.no_grad():
        reason = reason_through_dynamo(model, torch.randn(4, 3))
    assert reason is not None and reason.startswith("CPU tensor in the graph: input ")


@pytest.mark.parametrize("name", MODELS)
def test_real_models_only_fail_on_their_device(name: str) -> None:
    """No false positives: the test models' graphs are refused only for being on CPU."""
    model, args = build(name)
    with torch.no_grad():
        graphs = dynamo_graphs(model, *args)
    assert graphs
    for gm, example_inputs in graphs:
        reason = check_preconditions(gm, example_inputs)
        assert reason is not None and reason.startswith("CPU tensor in the graph: input "), reason


META_CASES = {
    "aten add_": (lambda x: x.add_(1), "input mutation: add_ writes input x_1 in place"),
    "aten rand": (lambda x: x + torch.rand(3, device="meta"), "random op: rand"),
    "aten dropout": (lambda x: F.dropout(x, 0.5, training=True), "random op: bernoulli_"),
    "CPU constant": (
        lambda x: x + torch.ones(3).to("meta"),
        "CPU tensor in the graph: node ones is on cpu",
    ),
    "clean": (lambda x: x.relu() * 2, "no CUDA tensor in the graph"),
}


@pytest.mark.parametrize("case", META_CASES)
def test_meta_device_aten_graph_reasons(case: str) -> None:
    fn, expected = META_CASES[case]
    x = torch.empty(4, 3, device="meta")
    assert check_preconditions(make_fx(fn)(x), [x]) == expected


def test_symbolic_placeholders_are_dynamic() -> None:
    x = torch.randn(4, 3)
    gm = make_fx(lambda x: x.relu() * 2, tracing_mode="symbolic")(x)
    reason = check_preconditions(gm, [x])
    assert reason is not None and reason.startswith("dynamic shapes: input x_1 has symbolic shape")


HAND_CASES = {
    "x.add_": (
        lambda g, x: g.call_method("add_", (x, 1)),
        "input mutation: add_ writes input x in place",
    ),
    "setitem on a view": (
        lambda g, x: g.call_method("__setitem__", (g.call_method("view", (x, -1)), 0, 1.0)),
        "input mutation: __setitem__ writes input x in place",
    ),
    "nonzero": (lambda g, x: g.call_function(torch.nonzero, (x,)), "data-dependent op: nonzero"),
    "item": (lambda g, x: g.call_method("item", (x,)), "data-dependent op: item"),
    "randn": (lambda g, x: g.call_function(torch.randn, (3,)), "random op: randn"),
    "CPU node": (
        lambda g, x: g.call_function(torch.ones, (3,), {"device": "cpu"}),
        "CPU tensor in the graph: ones puts a tensor on cpu",
    ),
    "x.cpu()": (
        lambda g, x: g.call_method("cpu", (x,)),
        "CPU tensor in the graph: cpu moves a tensor to the host",
    ),
    "pure": (lambda g, x: g.call_method("relu", (x,)), "no CUDA tensor in the graph"),
}


@pytest.mark.parametrize("case", HAND_CASES)
def test_hand_built_graph_reasons(case: str) -> None:
    body, expected = HAND_CASES[case]
    x = torch.empty(4, 3, device="meta")
    assert check_preconditions(hand_graph(body), [x]) == expected


@torch.no_grad()
def test_backend_refuses_a_cpu_graph_before_asking_torch() -> None:
    ((gm, example_inputs),) = dynamo_graphs(nn.Linear(4, 4), torch.randn(2, 4))
    code = gm.code
    with pytest.raises(Unsupported, match=r"^CPU tensor in the graph: input "):
        cudagraphs(gm, example_inputs)
    assert gm.code == code


def test_torch_skip_becomes_unsupported_with_torchs_reason() -> None:
    """Torch's own backend on a CPU graph: it skips quietly; we raise with its reason."""
    from torch._dynamo.utils import counters

    ((gm, example_inputs),) = dynamo_graphs(nn.Linear(4, 4), torch.randn(2, 4))
    code, before = gm.code, counters["inductor"]["cudagraph_skips"]
    with pytest.raises(Unsupported) as raised:
        compile_with_torch(gm, example_inputs)
    assert raised.value.reason.startswith("torch skipped cudagraphs: cpu device (")
    assert "skipping cudagraphs due to" in (raised.value.detail or "")
    assert counters["inductor"]["cudagraph_skips"] == before + 1
    assert gm.code == code


def test_skip_watch_strips_torchs_prefix_and_stack_trace() -> None:
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    with watch_cudagraph_skips() as watch:
        log_cudagraph_skip_and_bump_counter(
            "skipping cudagraphs due to mutated inputs (2 instances). Found from : \n  File x.py"
        )
    assert watch.skips == 1
    assert watch.reason() == "torch skipped cudagraphs: mutated inputs (2 instances)"


def test_skip_watch_without_skips_counts_none() -> None:
    with watch_cudagraph_skips() as watch:
        torch.ones(2).sum()
    assert (watch.skips, watch.messages) == (0, [])


def test_clone_outputs_survive_a_reused_output_buffer() -> None:
    """The hazard of replays, without a GPU: a function that writes one buffer each call."""
    buffer, weight = torch.zeros(3), torch.ones(3)

    def reuses_buffer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        buffer.copy_(x * 2)
        return buffer, weight

    run = clone_outputs(reuses_buffer, [True, False])
    first, first_weight = run(torch.ones(3))
    second, _ = run(torch.full((3,), 5.0))
    assert torch.equal(first, torch.full((3,), 2.0))
    assert torch.equal(second, torch.full((3,), 10.0))
    assert first_weight is weight  # an input alias is handed back as it is


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.parametrize("name", MODELS)
def test_chain_records_unavailable_and_falls_to_eager(name: str) -> None:
    from chain import Status, chain

    model, args = build(name)
    backend = chain("cudagraphs", "eager")
    compile_and_check(model, args, backend)
    assert backend.report.graphs
    for graph in backend.report.graphs:
        first, second = graph.attempts
        assert (first.backend, first.status) == ("cudagraphs", Status.UNAVAILABLE)
        assert first.reason == cudagraphs_available()
        assert (second.backend, second.status, graph.winner) == ("eager", Status.WON, "eager")


# ---- CUDA: real CUDA graphs (skipped on machines without a CUDA device) ----


@pytest.mark.cuda
def test_launch_bound_model_matches_eager_on_cuda() -> None:
    model, (x,) = launch_bound("cuda")
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend=cudagraphs)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), expected)


@pytest.mark.cuda
@pytest.mark.timing
def test_launch_bound_model_wins_in_the_chain() -> None:
    """The win is timed on the real clock (it is the point: CUDA graphs beat eager's launches),
    so it runs with the timing tests: retried while the verdict against eager is undecided."""
    from chain import Status, chain

    def attempt() -> Any:
        model, args = launch_bound("cuda")
        backend = chain("cudagraphs", "eager")
        compile_and_check(model, args, backend, calls=3)
        [graph] = backend.report.graphs
        return graph

    def undecided(graph: Any) -> str | None:
        first = graph.attempts[0]
        return first.reason if first.verdict == UNDECIDED else None

    graph = until_decided(attempt, undecided)
    first = graph.attempts[0]
    assert (first.backend, first.status, graph.winner) == ("cudagraphs", Status.WON, "cudagraphs")
    assert first.details["cloned_outputs"] == 1


class AddsInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1).relu()


class UsesCPUTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.arange(64).float().mean().to(x.device)


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (AddsInPlace(), "input mutation: add_ writes input l_x_ in place"),
        (UsesCPUTensor(), "CPU tensor in the graph: "),
    ],
)
def test_cuda_graph_refused_with_reason_falls_to_next(model: nn.Module, expected: str) -> None:
    from chain import Status, chain

    x = torch.randn(1, 64, device="cuda")
    backend = chain("cudagraphs", "eager")
    with torch.no_grad():
        reference = model(x.clone())
        torch.testing.assert_close(torch.compile(model, backend=backend)(x.clone()), reference)
    [graph] = backend.report.graphs
    first = graph.attempts[0]
    assert (first.backend, first.status, graph.winner) == (
        "cudagraphs",
        Status.UNSUPPORTED,
        "eager",
    )
    assert first.reason.startswith(expected), first.reason


@pytest.mark.cuda
def test_outputs_held_across_calls_are_not_overwritten() -> None:
    model, _ = launch_bound("cuda")
    a, b = torch.randn(1, 64, device="cuda"), torch.randn(1, 64, device="cuda")
    with torch.no_grad():
        compiled = torch.compile(model, backend=cudagraphs)
        held = compiled(a)  # replays: the backend's probe already warmed up and recorded
        other = compiled(b)
        assert held.data_ptr() != other.data_ptr()
        torch.testing.assert_close(held, model(a))
        torch.testing.assert_close(other, model(b))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_benchmark_says_why_it_cannot_measure(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.launch_bound import main

    assert main([]) == 1
    assert f"nothing to measure: {cudagraphs_available()}" in capsys.readouterr().err
