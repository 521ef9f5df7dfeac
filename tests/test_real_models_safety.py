"""Real models never crash and never run wrong: changing shapes, dynamic graphs, in-place
writes, recompiles, the compile thread's modes and dynamo's restart signals (issue 10)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx

import chain
from backends import Unsupported
from backends.registry import registry
from chain.bench import zoo
from chain.report.records import Status
from chain.select.concrete import concretize

needs_transformers = pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))


def winners(c: chain.Chain) -> list[str | None]:
    return [g.winner for g in c.report.graphs]


def attempts(c: chain.Chain) -> list[tuple[str, Status, str]]:
    return [(a.backend, a.status, a.reason) for g in c.report.graphs for a in g.attempts]


def no_failures(c: chain.Chain) -> None:
    """No attempt crashed, mismatched or broke the contract: the chain ran each graph right."""
    bad = [a for a in attempts(c) if a[1] in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR)]
    bad += [a for a in attempts(c) if a[1] is Status.MISMATCH]
    assert not bad, bad


# -- transformers models at three shapes ------------------------------------------------


def run_shapes(name: str, backend: Any, device: str = "cpu", dynamic: bool | None = None) -> None:
    """Call the compiled model at its three shapes: each output as eager's."""
    model = zoo.build(name).to(device)
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    with torch.inference_mode():
        for shape in range(3):
            args = tuple(x.to(device) for x in zoo.inputs(name, shape))
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)


# Models x chains pairwise, not the product (each case compiles a real model): ONNX Runtime
# runs every model below, the default chain GPT-2 and inductor BERT, so each of the two
# models meets two chains and each chain a real model.
@needs_transformers
def test_the_default_chain_runs_a_transformers_model_at_three_shapes() -> None:
    """backend="chain" (the default chain, through dynamo's registry) used to crash at the
    second shape: symbolic sizes reached the chain's own runs of the graph."""
    run_shapes("gpt2", "chain")


@needs_transformers
@pytest.mark.parametrize("name", zoo.MODELS)
def test_onnxruntime_runs_each_transformers_model_at_three_shapes(name: str) -> None:
    """ORT exports the dynamic graph of the second shape with a symbolic dim and wins it."""
    c = chain.chain("onnxruntime", "eager", eager_floor=False)
    run_shapes(name, c)
    no_failures(c)
    dynamic = [g for g in c.report.graphs if any("dynamic:" in n for n in g.notes)]
    assert dynamic, "the second shape gives a dynamic graph"
    assert {g.winner for g in dynamic} == {"onnxruntime"}


@needs_transformers
def test_inductor_runs_a_transformers_model_at_three_shapes() -> None:
    """Inductor compiles the static first graph and the dynamic second one; both verified."""
    c = chain.chain("inductor", "eager", eager_floor=False)
    run_shapes("bert", c)
    no_failures(c)
    assert winners(c) == ["inductor", "inductor"]
    assert any("dynamic:" in n for n in c.report.graphs[1].notes)
    assert all(g.attempts[0].error is not None for g in c.report.graphs)  # verified


@pytest.mark.cuda
@needs_transformers
@pytest.mark.parametrize("dynamic", [None, False], ids=["automatic", "static"])
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_cudagraphs_takes_each_static_graph_on_a_gpu(name: str, dynamic: bool | None) -> None:
    """On CUDA, cudagraphs runs the first length and declines the symbolic graph dynamo
    makes at the second; with dynamic=False it runs all three lengths."""
    c = chain.chain("cudagraphs", "eager", measure=False)
    run_shapes(name, c, "cuda", dynamic)
    no_failures(c)
    first = [g.attempts[0] for g in c.report.graphs]
    assert {a.backend for a in first} == {"cudagraphs"}
    if dynamic is False:
        assert [a.status for a in first] == [Status.WON] * 3
    else:
        assert [a.status for a in first] == [Status.WON, Status.UNSUPPORTED]
        assert first[1].reason.startswith("dynamic shapes: cudagraphs")


# -- dynamic=True ----------------------------------------------------------------------


def pairs(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], -1, 2).sum(-1)


@pytest.mark.parametrize("first", ["eager", "onnxruntime", "inductor"])
def test_dynamic_true_graphs_run_verified_on_their_values(first: str) -> None:
    """The issue's repro: a view with a symbolic size crashed even chain("eager")."""
    c = chain.chain(*dict.fromkeys([first, "eager"]), eager_floor=False)
    compiled = torch.compile(pairs, backend=c, dynamic=True)
    for shape in ((4, 8), (6, 4), (3, 10)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), pairs(x))
    (graph,) = c.report.graphs  # one dynamic graph serves all three shapes
    assert graph.winner == first
    assert graph.winning_attempt is not None and graph.winning_attempt.error is not None
    assert any("symbolic size(s)" in n for n in graph.notes)


def test_concrete_values_are_the_symbols_hints() -> None:
    seen: list[Any] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append(concretize(example_inputs))
        return gm.forward

    torch.compile(pairs, backend=capture, dynamic=True)(torch.randn(4, 8))
    (concrete,) = seen
    assert concrete.symbolic == 2 and concrete.why_not is None
    assert concrete.values is not None and concrete.values[:2] == (4, 8)


def test_a_size_without_a_value_is_compiled_but_neither_verified_nor_timed() -> None:
    """An unbacked size (data-dependent) has no value: the chain cannot run the graph
    itself, so the candidate is not verified, and the report says why."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    size = ShapeEnv().create_unbacked_symint()
    gm = fx.symbolic_trace(lambda x, n: x * 2)
    c = chain.chain("eager")
    c(gm, [torch.randn(3), size])
    (graph,) = c.report.graphs
    won = graph.winning_attempt
    assert won is not None and won.backend == "eager"
    assert "not verified or timed: input 1" in won.reason and "data-dependent" in won.reason
    assert won.latency_ms is None


def test_a_fixed_shape_backend_is_unsupported_on_a_dynamic_graph() -> None:
    """A backend registered with dynamic=False never sees a symbolic graph."""
    calls: list[int] = []
    with registry.snapshot():

        @registry.register("fixed_only", dynamic=False)
        def fixed_only(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            calls.append(1)
            return gm.forward

        c = chain.chain("fixed_only", "eager", eager_floor=False)
        compiled = torch.compile(pairs, backend=c, dynamic=True)
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), pairs(x))
    assert not calls
    (fixed, eager) = c.report.graphs[0].attempts
    assert fixed.status is Status.UNSUPPORTED
    assert fixed.reason.startswith("dynamic shapes: fixed_only compiles for fixed shapes")
    assert eager.status is Status.WON


@pytest.mark.parametrize("dynamic", [None, False])
def test_dynamic_false_keeps_a_fixed_shape_backend_at_every_length(dynamic: bool | None) -> None:
    """Dynamo's automatic dynamic shapes hand the second length over symbolic: a fixed-shape
    backend then declines it. With torch.compile(dynamic=False) each length is a static
    graph, and the fixed-shape backend wins all three (as the README says)."""
    with registry.snapshot():

        @registry.register("fixed_only", dynamic=False)
        def fixed_only(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            return gm.forward

        c = chain.chain("fixed_only", "eager", eager_floor=False)
        compiled = torch.compile(pairs, backend=c, dynamic=dynamic)
        for length in (8, 12, 16):
            x = torch.randn(4, length)
            torch.testing.assert_close(compiled(x), pairs(x))
    if dynamic is False:
        assert winners(c) == ["fixed_only"] * 3
    else:  # the third length reuses the dynamic graph
        assert winners(c) == ["fixed_only", "eager"]
        assert c.report.graphs[1].attempts[0].reason.startswith("dynamic shapes: fixed_only")


def test_cudagraphs_declares_fixed_shapes_and_tensorrt_takes_bounded_symbolic_sizes() -> None:
    assert not registry.lookup("cudagraphs").dynamic
    # tensorrt builds optimization profiles for a symbolic graph whose sizes have finite
    # ranges, and declines the others itself (backends.tensorrt.conversion.graph_profiles)
    assert registry.lookup("tensorrt").dynamic
    assert registry.lookup("onnxruntime").dynamic and registry.lookup("inductor").dynamic


# -- in-place writes ---------------------------------------------------------------------


def doubles_in_place(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x + 1


@pytest.mark.parametrize("first", ["onnxruntime", "inductor"])
def test_a_write_to_the_callers_input_is_applied(first: str) -> None:
    c = chain.chain(first, "eager", eager_floor=False)
    x, expected = torch.arange(4.0), torch.arange(4.0)
    out = torch.compile(doubles_in_place, backend=c)(x)
    want = doubles_in_place(expected)
    torch.testing.assert_close(x, expected)
    torch.testing.assert_close(out, want)
    assert winners(c) == [first]


@pytest.fixture
def drops_writes() -> Iterator[str]:
    """A backend that computes the outputs on copies: right outputs, writes lost."""
    with registry.snapshot():

        @registry.register("drops_writes")
        def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            def run(*args: Any) -> Any:
                return gm(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])

            return run

        yield "drops_writes"


def test_a_backend_that_drops_a_write_is_a_mismatch(drops_writes: str) -> None:
    c = chain.chain(drops_writes, "eager", eager_floor=False)
    x = torch.arange(4.0)
    torch.compile(doubles_in_place, backend=c)(x)
    torch.testing.assert_close(x, torch.arange(4.0) * 2)  # eager ran it
    dropped, eager = c.report.graphs[0].attempts
    assert dropped.status is Status.MISMATCH
    assert dropped.reason.startswith("input 0 (l_x_) not updated as eager does")
    assert eager.status is Status.WON


# -- recompiles --------------------------------------------------------------------------


def test_inductor_wins_every_recompile_and_each_is_recorded() -> None:
    """Inductor specializes a size in dynamo's shape env (the symbol then prints as a number):
    that is not a rewrite of the graph, and it used to be recorded as one."""
    c = chain.chain("inductor", "eager", eager_floor=False)
    model = torch.nn.Linear(4, 4).eval()
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        for batch in (2, 3, 5):
            x = torch.randn(batch, 4)
            torch.testing.assert_close(compiled(x), model(x))
    assert winners(c) == ["inductor"] * len(c.report.graphs)
    assert len(c.report.graphs) >= 2
    first, second = c.report.graphs[:2]
    assert first.recompiles is None and first.compile_id == "0/0"
    assert second.recompiles == first.id and second.compile_id == "0/1"
    assert second.recompile_reason is not None and "size mismatch" in second.recompile_reason
    assert "graph 0: " in c.report.to_markdown()


def test_a_backend_that_rewrites_the_graph_is_still_caught() -> None:
    with registry.snapshot():

        @registry.register("rewrites")
        def rewrites(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            for node in gm.graph.nodes:  # the same sum, another graph: `x + 1` -> `x + 1.0`
                if node.op == "call_function" and node.target is torch.add:
                    node.args = (node.args[0], 1.0)
            gm.graph.lint()
            gm.recompile()
            return gm.forward

        c = chain.chain("rewrites", "eager", eager_floor=False)
        torch.compile(lambda x: torch.add(x, 1), backend=c, dynamic=True)(torch.randn(3))
    rewrote, eager = c.report.graphs[0].attempts
    assert eager.status is Status.WON
    assert rewrote.status is Status.COMPILE_ERROR and rewrote.error_type == "ContractViolation"


# -- the compile thread and dynamo's signals ----------------------------------------------


def test_the_compile_timeout_thread_keeps_inference_mode() -> None:
    """Under inference_mode the timed compile ran in a thread in grad mode: ORT then saw a
    training graph ("unsupported: training graph") every time."""
    c = chain.chain("onnxruntime", "eager", compile_timeout_s=120, eager_floor=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    with torch.inference_mode():
        x = torch.randn(2, 8)
        torch.testing.assert_close(torch.compile(model, backend=c)(x), model(x))
    assert winners(c) == ["onnxruntime"]


def test_the_compile_timeout_thread_sees_dynamos_tracing_context() -> None:
    """Inductor reads dynamo's fake mode and shape env from the tracing context, which is
    thread-local: a dynamic graph compiled in the timeout's thread needs it handed over."""
    c = chain.chain("inductor", "eager", compile_timeout_s=300, eager_floor=False)
    compiled = torch.compile(pairs, backend=c, dynamic=True)
    x = torch.randn(6, 4)
    torch.testing.assert_close(compiled(x), pairs(x))
    assert winners(c) == ["inductor"]


def power(x: torch.Tensor, s: float) -> torch.Tensor:
    return x.pow(s)


def test_dynamos_restart_signal_passes_through_untouched() -> None:
    """A float argument that inductor must specialize makes it raise dynamo's
    TensorifyScalarRestartAnalysis: dynamo's control flow, not a failure of inductor. (It
    failed while the chain handed inductor copies without dynamo's symbolic context:
    `chain.select.isolation.compile_copy` fixed both this and ConvNeXt's guard crash.)"""
    c = chain.chain("inductor", "eager", eager_floor=False)
    compiled = torch.compile(power, backend=c)
    x = torch.rand(4) + 0.5
    for s in (2.5, 3.5, 4.5):
        torch.testing.assert_close(compiled(x, s), power(x, s))
    assert [a for a in attempts(c) if "Restart" in a[2]] == []
    assert set(winners(c)) == {"inductor"}
    assert [g.id for g in c.report.graphs] == list(range(len(c.report.graphs)))


# -- data-dependent shapes -----------------------------------------------------------------


class Positives(torch.nn.Module):
    """Keeps the positive entries (a data-dependent size) and scales by a tensor's value."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept = x[x > 0]
        scale = x.abs().max().item()
        return kept * 2 + scale


@pytest.mark.parametrize("unbacked", [False, True], ids=["graph_breaks", "unbacked"])
def test_item_and_data_dependent_shapes_run_and_match(unbacked: bool) -> None:
    """By default dynamo breaks the graph at .item() and nonzero; with scalar outputs and
    dynamic output shapes captured, the graph holds unbacked sizes instead."""
    c = chain.chain("onnxruntime", "inductor", "eager", eager_floor=False)
    model = Positives().eval()
    patches = {
        "capture_scalar_outputs": unbacked,
        "capture_dynamic_output_shape_ops": unbacked,
    }
    with torch._dynamo.config.patch(patches), torch.no_grad():
        compiled = torch.compile(model, backend=c)
        for n in (6, 9, 12):
            x = torch.randn(n, generator=torch.Generator().manual_seed(n))
            torch.testing.assert_close(compiled(x), model(x))
    assert c.report.graphs and all(g.winner for g in c.report.graphs)
    assert not [a for a in attempts(c) if a[1] is Status.MISMATCH]


def test_unsupported_is_raised_before_a_fixed_shape_compiler_runs() -> None:
    """The contract's own check: Backend.__call__ refuses a symbolic graph."""
    with registry.snapshot():

        @registry.register("fixed", dynamic=False)
        def fixed(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            raise AssertionError("never called on a dynamic graph")

        seen: list[Any] = []

        def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            with pytest.raises(Unsupported, match=r"^dynamic shapes: fixed compiles for fixed"):
                registry.lookup("fixed")(gm, example_inputs)
            seen.append(1)
            return gm.forward

        torch.compile(pairs, backend=capture, dynamic=True)(torch.randn(4, 8))
    assert seen == [1]
