"""The chain's `cuda_graphs` stage: option, CPU behaviour, selection, report; CUDA variants."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn

import backends
from backends.cudagraphs import cudagraphs_available
from backends.errors import InvalidOption
from backends.inductor.config import config_patches
from chain import Attempt, Report, Status, chain
from chain.run.graphs import GraphsStage, base_name, check_cuda_graphs, prefer_graphed, variant_name
from tests.helpers import compile_and_check
from tests.models import build, launch_bound

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")


# ---- the option ----


@pytest.mark.parametrize("value", ["yes", 1, 0, None, "true"])
def test_bad_cuda_graphs_value_fails_at_chain_time(value: object) -> None:
    with pytest.raises(ValueError, match=r"cuda_graphs=.*expected 'auto', True or False"):
        chain("eager", cuda_graphs=value)


@pytest.mark.parametrize("value", ["auto", True, False])
def test_valid_values_are_kept(value: object) -> None:
    assert check_cuda_graphs(value) is value or check_cuda_graphs(value) == value
    assert chain("eager", cuda_graphs=value).graphs.setting == value


def test_names_of_variants() -> None:
    assert variant_name("inductor") == "inductor+graphs"
    assert base_name("inductor+graphs") == "inductor"
    assert base_name("eager") == "eager"


def test_every_builtin_with_kernels_has_a_variant() -> None:
    for name in ("eager", "inductor", "onnxruntime", "tensorrt"):
        assert backends.registry.lookup(name).graphed is not None, name
    assert backends.registry.lookup("cudagraphs").graphed is None


def test_eager_variant_is_skipped_when_cudagraphs_is_in_the_chain() -> None:
    stage = chain("cudagraphs", "eager").graphs
    assert stage.variant(backends.registry.lookup("eager")) is None
    alone = chain("eager").graphs.variant(backends.registry.lookup("eager"))
    assert alone is not None and alone.name == "eager+graphs"


# ---- CPU: nothing is tried, one note per chain ----


@CPU_ONLY
def test_auto_on_cpu_adds_no_attempt_and_one_note_per_chain() -> None:
    model, args = build("graph_break")  # two graphs
    backend = chain("inductor", "eager", mode="fastest")
    compile_and_check(model, args, backend)
    graphs = backend.report.graphs
    assert len(graphs) == 2
    assert all(not a.backend.endswith("+graphs") for g in graphs for a in g.attempts)
    assert all(not a.cuda_graphs for g in graphs for a in g.attempts)
    notes = [n for g in graphs for n in g.notes if "cuda_graphs" in n]
    assert notes == [
        f"cuda_graphs='auto': CUDA graphs do not apply: {cudagraphs_available()} "
        "(no variant tried on any graph of this chain)"
    ]


@CPU_ONLY
def test_true_on_cpu_records_a_refusal_per_compiled_candidate() -> None:
    model, args = build("mlp")
    backend = chain("inductor", "eager", mode="fastest", cuda_graphs=True)
    compile_and_check(model, args, backend)
    [graph] = backend.report.graphs
    refusals = {a.backend: a for a in graph.attempts if a.cuda_graphs}
    assert set(refusals) == {"inductor+graphs", "eager+graphs"}
    for attempt in refusals.values():
        assert attempt.status is Status.UNAVAILABLE
        assert attempt.reason == f"CUDA graphs do not apply: {cudagraphs_available()}"
    assert graph.winner in ("inductor", "eager")
    assert not [n for n in graph.notes if "cuda_graphs" in n]


@CPU_ONLY
def test_false_says_nothing() -> None:
    model, args = build("mlp")
    backend = chain("eager", cuda_graphs=False)
    compile_and_check(model, args, backend)
    [graph] = backend.report.graphs
    assert [a.backend for a in graph.attempts] == ["eager"]
    assert graph.notes == ()


def test_a_chain_without_variants_gets_no_note() -> None:
    def plain(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        return gm.forward

    model, args = build("mlp")
    backend = chain(plain)
    compile_and_check(model, args, backend)
    assert backend.report.graphs[0].notes == ()


# ---- selection between the plain and the graphed variant (CPU hooks) ----


def test_first_mode_prefers_graphed_when_not_slower() -> None:
    plain = Attempt("inductor", Status.WON, latency_ms=2.0)
    graphed = Attempt("inductor+graphs", Status.WON, latency_ms=1.0, cuda_graphs=True)
    p, g = prefer_graphed(plain, graphed)
    assert (p.status, g.status) == (Status.SLOWER, Status.WON)
    assert p.reason == "2.000 ms vs 1.000 ms for inductor+graphs"
    tie = dataclass_latency(graphed, 2.0)
    assert prefer_graphed(plain, tie)[1].status is Status.WON  # ties go to the graphed variant


def test_first_mode_keeps_plain_when_graphed_is_slower_or_failed() -> None:
    plain = Attempt("onnxruntime", Status.WON, latency_ms=1.0)
    graphed = Attempt("onnxruntime+graphs", Status.WON, latency_ms=3.0, cuda_graphs=True)
    p, g = prefer_graphed(plain, graphed)
    assert (p.status, g.status) == (Status.WON, Status.SLOWER)
    assert g.reason == "3.000 ms vs 1.000 ms for onnxruntime"
    failed = Attempt("onnxruntime+graphs", Status.UNSUPPORTED, "input mutation", cuda_graphs=True)
    assert prefer_graphed(plain, failed) == (plain, failed)


def dataclass_latency(attempt: Attempt, ms: float) -> Attempt:
    import dataclasses

    return dataclasses.replace(attempt, latency_ms=ms)


@pytest.fixture
def variant_backend(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A CPU backend whose `graphed` hook is a plain callable, with the stage told it applies.

    Tests the chain's bookkeeping of variants (names, fields, selection, the runtime
    guard) on CPU; the real CUDA variants are the `cuda` tests below.
    """
    calls: list[str] = []

    def graphed(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            calls.append("graphed")
            return gm(*args)

        run.chain_details = {"cuda_graphs": True}  # type: ignore[attr-defined]
        return run

    monkeypatch.setattr(GraphsStage, "why_not", lambda self, gm, inputs: None)
    with backends.registry.snapshot():

        @backends.register_backend("plainish", graphed=graphed)
        def plainish(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            return gm.forward

        yield calls


@pytest.mark.parametrize("mode", ["first", "fastest"])
def test_variant_is_its_own_attempt_and_one_of_the_pair_wins(
    variant_backend: list[str], mode: str
) -> None:
    model, args = build("mlp")
    # plainish runs as fast as eager: without the floor, timing noise cannot hand eager the graph
    backend = chain("plainish", "eager", mode=mode, eager_floor=False)
    compile_and_check(model, args, backend)
    [graph] = backend.report.graphs
    by_name = {a.backend: a for a in graph.attempts}
    assert by_name["plainish+graphs"].cuda_graphs and not by_name["plainish"].cuda_graphs
    pair = {by_name["plainish"].status, by_name["plainish+graphs"].status}
    assert pair <= {Status.WON, Status.SLOWER}
    if mode == "first":
        assert pair == {Status.WON, Status.SLOWER}
        assert by_name["eager"].status is Status.NOT_TRIED
    assert [a.status for a in graph.attempts].count(Status.WON) == 1
    assert all(a.latency_ms is not None for a in graph.attempts if a.status is Status.WON)
    assert "graphed" in variant_backend  # the variant ran (verified and timed)


def test_graphed_winner_falls_back_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GraphsStage, "why_not", lambda self, gm, inputs: None)
    state = {"broken": False}

    def graphed(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if state["broken"]:
                raise RuntimeError("replay failed")
            return gm(*args)

        return run

    with backends.registry.snapshot():

        @backends.register_backend("flaky", graphed=graphed)
        def flaky(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
            return gm.forward

        model, args = build("mlp")
        backend = chain("flaky", "eager", measure=False)
        with torch.no_grad():
            compiled = torch.compile(model, backend=backend)
            compiled(*args)
            assert backend.report.graphs[0].winner == "flaky+graphs"
            state["broken"] = True
            torch.testing.assert_close(compiled(*args), model(*args))
    graph = backend.report.graphs[0]
    by_name = {a.backend: a for a in graph.attempts}
    assert by_name["flaky+graphs"].status is Status.RUNTIME_ERROR
    assert by_name["flaky+graphs"].reason == "at run time: RuntimeError: replay failed"
    assert graph.winner == "eager"
    # the fallback tried eager's variant too (here refused: a CPU graph); it is recorded
    assert by_name["eager+graphs"].status is Status.UNSUPPORTED
    assert by_name["eager+graphs"].cuda_graphs


# ---- the report ----


def test_cuda_graphs_field_round_trips_through_json(tmp_path: Any) -> None:
    from chain.report.records import GraphRecord

    attempt = Attempt(
        "inductor+graphs", Status.WON, latency_ms=0.5, details={"cuda_graphs": True},
        cuda_graphs=True,
    )  # fmt: skip
    record = GraphRecord(0, "f", "o", 3, {}, [], (Attempt("inductor", Status.SLOWER), attempt),
                         "inductor+graphs", notes=("n",))  # fmt: skip
    path = Report([record]).save(tmp_path / "r.json")
    loaded = Report.load(path).graphs[0]
    assert loaded.attempts[1].cuda_graphs is True
    assert loaded.attempts[0].cuda_graphs is False
    assert loaded == record
    assert "inductor+graphs" in Report([record]).render()
    old = Attempt.from_dict({"backend": "eager", "status": "won"})  # reports before the field
    assert old.cuda_graphs is False


# ---- inductor's modes ----


def test_inductor_mode_gives_the_modes_settings_and_options_win() -> None:
    assert config_patches("max-autotune-no-cudagraphs", {}) == {
        "max_autotune": True,
        "coordinate_descent_tuning": True,
    }
    assert config_patches("max-autotune", {"coordinate_descent_tuning": False}) == {
        "max_autotune": True,
        "triton.cudagraphs": True,
        "coordinate_descent_tuning": False,
    }
    assert config_patches(None, {"max_autotune": True}) == {"max_autotune": True}
    with pytest.raises(InvalidOption, match=r"valid: default, .*reduce-overhead"):
        config_patches("fast", {})


def test_inductor_mode_runs_through_the_chain() -> None:
    model, args = build("mlp")
    backend = chain("inductor", options={"inductor": {"mode": "default"}}, eager_floor=False)
    compile_and_check(model, args, backend)
    assert backend.report.graphs[0].winner == "inductor"


@CPU_ONLY
def test_inductor_mode_with_cuda_graphs_on_cpu_is_unsupported_with_the_reason() -> None:
    model, args = build("mlp")
    backend = chain("inductor", "eager", options={"inductor": {"mode": "reduce-overhead"}})
    compile_and_check(model, args, backend)
    first = backend.report.graphs[0].attempts[0]
    assert first.status is Status.UNSUPPORTED
    assert first.reason == f"CUDA graphs: {cudagraphs_available()}"


# ---- CUDA: the real variants ----


def _ort_cuda_reason() -> str | None:
    if importlib.util.find_spec("onnxruntime") is None:
        return "onnxruntime is not installed"
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider (pip install onnxruntime-gpu)"
    return None


def _variant(name: str) -> Callable[..., Any]:
    if name == "onnxruntime" and (reason := _ort_cuda_reason()):
        pytest.skip(reason)
    hook = backends.registry.lookup(name).graphed
    assert hook is not None
    return hook


def _dynamo_graph(model: nn.Module, x: torch.Tensor) -> tuple[fx.GraphModule, list[Any]]:
    seen: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        torch.compile(model, backend=capture)(x)
    [(gm, inputs)] = seen
    return gm, inputs


VARIANTS = ["inductor", "onnxruntime", "eager"]


@pytest.mark.cuda
@pytest.mark.parametrize("name", VARIANTS)
def test_graphed_variant_matches_eager_and_holds_outputs(name: str) -> None:
    hook = _variant(name)
    model, (x,) = launch_bound("cuda")
    gm, inputs = _dynamo_graph(model, x)
    with torch.no_grad():
        run = hook(gm, inputs)
        a, b = torch.randn_like(x), torch.randn_like(x)
        args_a = [a if t is x else t for t in inputs]
        args_b = [b if t is x else t for t in inputs]
        held = run(*args_a)
        other = run(*args_b)
        held = held[0] if isinstance(held, list | tuple) else held
        other = other[0] if isinstance(other, list | tuple) else other
        torch.testing.assert_close(held, model(a))  # not overwritten by the second replay
        torch.testing.assert_close(other, model(b))
    assert run.chain_details["cuda_graphs"] is True


@pytest.mark.cuda
@pytest.mark.parametrize("name", VARIANTS)
def test_graphed_variant_copies_no_parameter_per_replay(name: str) -> None:
    hook = _variant(name)
    model, (x,) = launch_bound("cuda")
    gm, inputs = _dynamo_graph(model, x)
    weights = sum(1 for t in inputs if isinstance(t, nn.Parameter))
    assert weights == 2 * len(model.layers)  # dynamo hands the weights over as inputs
    with torch.no_grad():
        run = hook(gm, inputs)
    assert run.chain_details["inputs_copied_per_replay"] == 1  # x only


@pytest.mark.cuda
def test_torchs_own_backend_copies_the_parameters_ours_does_not() -> None:
    """The defect fixed in backends/cudagraphs.py: torch's backend copies every weight."""
    from torch._dynamo.backends.cudagraphs import cudagraphs as torch_cudagraphs

    from backends.cudagraphs import watch_cudagraph_skips

    model, (x,) = launch_bound("cuda")
    gm, inputs = _dynamo_graph(model, x)
    with torch.no_grad(), watch_cudagraph_skips() as watch:
        theirs = torch_cudagraphs(gm, inputs)
        for _ in range(3):
            theirs(*inputs)
    assert watch.copied_inputs == len(inputs)  # every weight copied into the graph's buffers
    with torch.no_grad():
        ours = backends.registry.lookup("cudagraphs")(gm, inputs)
    assert ours.chain_details["inputs_copied_per_replay"] == 1


class AddsInPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.add_(1))


@pytest.mark.cuda
@pytest.mark.parametrize("name", VARIANTS)
def test_input_mutation_is_refused_under_graphs_with_the_reason(name: str) -> None:
    _variant(name)
    model = AddsInPlace().eval().cuda()
    x = torch.randn(1, 64, device="cuda")
    fallback = () if name == "eager" else ("eager",)  # eager's own graphed variant is tried
    backend = chain(name, *fallback, cuda_graphs=True)
    with torch.no_grad():
        expected = model(x.clone())
        torch.testing.assert_close(torch.compile(model, backend=backend)(x.clone()), expected)
    [graph] = backend.report.graphs
    refusal = next(a for a in graph.attempts if a.backend == f"{name}+graphs")
    assert refusal.status is Status.UNSUPPORTED
    assert refusal.reason.startswith("CUDA graphs do not apply: input mutation: add_ writes input")


@pytest.mark.cuda
def test_fastest_chain_times_both_variants_on_cuda() -> None:
    model, args = launch_bound("cuda")
    backend = chain("inductor", "eager", mode="fastest")
    compile_and_check(model, args, backend, calls=3)
    [graph] = backend.report.graphs
    names = {a.backend: a for a in graph.attempts}
    assert {"inductor", "inductor+graphs", "eager", "eager+graphs"} <= set(names)
    assert names["inductor+graphs"].cuda_graphs
    assert names["inductor+graphs"].latency_ms is not None
