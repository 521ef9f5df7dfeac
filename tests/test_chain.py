"""The chain on CPU: fault injection, graph breaks, both modes, strictness, bad input."""

from __future__ import annotations

import pytest
import torch

import backends
import chain.judge.rounds as rounds
from chain import AllCandidatesFailed, Chain, Mismatch, Status, chain
from chain.report.records import TIED
from tests import faults
from tests.clock import ROUNDS, VirtualClock
from tests.helpers import compile_and_check
from tests.models import build


def unwrap(exc: BaseException) -> BaseException:
    """The chain's own exception inside dynamo's BackendCompilerFailed wrapper."""
    return getattr(exc, "inner_exception", exc)


FAULTS = {
    "raises_at_compile": (
        faults.raises_at_compile,
        Status.COMPILE_ERROR,
        "RuntimeError: converter exploded",
    ),
    "raises_at_run": (
        faults.raises_at_run,
        Status.RUNTIME_ERROR,
        "RuntimeError: kernel launch failed",
    ),
    "wrong_numbers": (
        faults.wrong_numbers,
        Status.MISMATCH,
        "output 0: RMSE vs float64 1 is",
    ),
    "returns_nan": (faults.returns_nan, Status.MISMATCH, "NaN value(s) where eager has none"),
    "wrong_arity": (faults.wrong_arity, Status.MISMATCH, "output structure differs"),
    "not_callable": (faults.not_callable, Status.COMPILE_ERROR, "returned int, not a callable"),
    "declines": (faults.declines, Status.UNSUPPORTED, "no converter for aten.frobnicate"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("model_name", ["mlp", "two_outputs"])
def test_fault_falls_back_to_eager(fault: str, model_name: str) -> None:
    fn, status, reason = FAULTS[fault]
    model, args = build(model_name)
    backend = chain(fn, "eager")
    compile_and_check(model, args, backend)
    [graph] = backend.report.graphs
    first, second = graph.attempts
    assert (first.backend, first.status) == (fault, status)
    assert reason in first.reason
    assert (second.backend, second.status) == ("eager", Status.WON)
    assert graph.winner == "eager"
    if status in (Status.COMPILE_ERROR, Status.RUNTIME_ERROR):
        assert first.traceback and first.error_type


def test_unsupported_keeps_detail_in_json() -> None:
    model, args = build("mlp")
    backend = chain(faults.declines, "eager")
    compile_and_check(model, args, backend)
    attempt = backend.report.to_dict()["graphs"][0]["attempts"][0]
    assert attempt["details"]["detail"] == "node %7: aten.frobnicate"


def test_compile_timeout_is_a_compile_error() -> None:
    model, args = build("mlp")
    backend = chain(faults.hangs, "eager", compile_timeout_s=0.5)
    compile_and_check(model, args, backend, calls=1)
    first = backend.report.graphs[0].attempts[0]
    assert first.status is Status.COMPILE_ERROR
    assert first.error_type == "CompileTimeout" and "0.5s" in first.reason
    assert first.compile_s is not None and first.compile_s < 5


def test_transient_failures_are_retried_and_counted() -> None:
    model, args = build("mlp")
    flaky = faults.FlakyCompile(failures=2)
    backend = chain(flaky, "eager", max_retries=2, measure=False)  # eager's twin: no timing
    compile_and_check(model, args, backend)
    first = backend.report.graphs[0].attempts[0]
    assert (first.status, first.retries, flaky.calls) == (Status.WON, 2, 3)


def test_transient_failures_give_up_after_max_retries() -> None:
    model, args = build("mlp")
    flaky = faults.FlakyCompile(failures=5)
    backend = chain(flaky, "eager", max_retries=1)
    compile_and_check(model, args, backend)
    first = backend.report.graphs[0].attempts[0]
    assert (first.status, first.retries, flaky.calls) == (Status.COMPILE_ERROR, 1, 2)
    assert first.reason == "Transient: device busy"


def test_runtime_failure_after_winning_falls_back_and_is_recorded() -> None:
    model, args = build("mlp")
    backend = chain(faults.BreaksLater(after=1), "eager", measure=False)
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        expected = model(*args)
        for _ in range(3):  # call 1 verified at compile; call 2 raises and falls back
            torch.testing.assert_close(compiled(*args), expected)
    [graph] = backend.report.graphs
    assert graph.winner == "eager"
    first = graph.attempts[0]
    assert first.status is Status.RUNTIME_ERROR
    assert first.reason == "at run time: RuntimeError: engine lost its context"
    assert graph.attempts[1].status is Status.WON


def test_failure_while_timed_is_a_runtime_error() -> None:
    model, args = build("mlp")
    backend = chain(faults.BreaksLater(after=3), "eager")
    compile_and_check(model, args, backend)
    first, second = backend.report.graphs[0].attempts
    assert first.status is Status.RUNTIME_ERROR
    assert first.reason == "while timed: RuntimeError: engine lost its context"
    assert (second.backend, second.status) == ("eager", Status.WON)


def test_graph_breaks_give_one_record_per_graph() -> None:
    model, args = build("graph_break")
    backend = chain("inductor", "eager", eager_floor=False)  # tiny graphs: eager is faster
    compile_and_check(model, args, backend)
    graphs = backend.report.graphs
    assert [g.id for g in graphs] == [0, 1]
    assert all(g.winner == "inductor" for g in graphs)
    assert "graph break" in graphs[0].origin
    assert graphs[0].fingerprint != graphs[1].fingerprint
    assert graphs[0].ops and graphs[0].inputs[0]["shape"]


@pytest.mark.parametrize("mode", ["first", "fastest"])
@pytest.mark.parametrize("model_name", ["cnn", "transformer"])
def test_modes_on_real_models(mode: str, model_name: str) -> None:
    model, args = build(model_name)
    # the modes' rules, not the floor's: inductor may be slower than eager on this CPU
    backend = chain("inductor", "eager", mode=mode, measure_budget_s=0.05, eager_floor=False)
    compile_and_check(model, args, backend)
    for graph in backend.report.graphs:
        statuses = {a.backend: a.status for a in graph.attempts}
        won = [a for a in graph.attempts if a.status is Status.WON]
        assert len(won) == 1 and graph.winner == won[0].backend
        assert graph.eager_ms is not None and won[0].latency_ms is not None
        assert won[0].speedup == pytest.approx(graph.eager_ms / won[0].latency_ms)
        if mode == "first":
            assert statuses == {"inductor": Status.WON, "eager": Status.NOT_TRIED}
        else:
            assert set(statuses.values()) == {Status.WON, Status.SLOWER}


@pytest.fixture
def quiet_clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    """The timing rounds read a virtual clock on which the twin costs what eager costs, and
    their evidence says the machine is quiet: on the real clock a busy machine made the
    twin's verdict undecided (or noise-faster), and the outcome hung on the load."""
    monkeypatch.setattr(rounds, "running_threads", lambda: None)
    monkeypatch.setattr(rounds, "load_average", lambda: 0.0)
    return VirtualClock().install(monkeypatch, ROUNDS)


def test_fastest_mode_needs_more_than_noise_to_beat_eager(quiet_clock: VirtualClock) -> None:
    """A candidate no faster than eager (a tie) does not win in fastest mode: eager is kept."""
    model, args = build("mlp")
    backend = chain(faults.twin, "eager", mode="fastest")  # eager's copy: a tie at best
    compile_and_check(model, args, backend)
    graph = backend.report.graphs[0]
    twin, eager = graph.attempts
    assert twin.backend == "twin" and graph.winner == "eager" and eager.status is Status.WON
    assert (twin.status, twin.verdict) == (Status.SLOWER, TIED), twin.reason
    assert twin.reason.startswith("a tie with eager: "), twin.reason


def test_min_speedup_marks_slower_and_moves_on(quiet_clock: VirtualClock) -> None:
    """A tie passes the eager floor; min_speedup 100 still marks it slower. (On the real clock
    a busy machine left the twin undecided, and the floor's reason came first.)"""
    model, args = build("mlp")
    backend = chain(faults.twin, "eager", min_speedup=100.0)
    compile_and_check(model, args, backend)
    first, second = backend.report.graphs[0].attempts
    assert first.status is Status.SLOWER, first.reason
    assert first.reason == "1.00x over eager < min_speedup 100.0"
    assert second.status is Status.WON  # the last resort is exempt


def test_all_failed_names_every_backend() -> None:
    model, args = build("mlp")
    backend = chain(faults.raises_at_compile, faults.declines)
    with pytest.raises(Exception, match="every backend failed") as info:
        torch.compile(model, backend=backend)(*args)
    text = str(info.value)
    assert "raises_at_compile: compile_error: RuntimeError: converter exploded" in text
    assert "declines: unsupported: no converter for aten.frobnicate" in text
    assert isinstance(unwrap(info.value), AllCandidatesFailed)


def test_strict_raises_the_first_failure_as_is() -> None:
    model, args = build("mlp")
    with pytest.raises(Exception, match="converter exploded"):
        torch.compile(model, backend=chain(faults.raises_at_compile, "eager", strict=True))(*args)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="RMSE vs float64 1 is") as info:
        torch.compile(model, backend=chain(faults.wrong_numbers, "eager", strict=True))(*args)
    assert isinstance(unwrap(info.value), Mismatch)


def test_unavailable_backend_is_recorded_with_reason() -> None:
    model, args = build("mlp")
    with backends.registry.snapshot():

        @backends.register_backend("needs_gpu", available=lambda: "no CUDA device")
        def needs_gpu(gm: torch.fx.GraphModule, example_inputs: list) -> object:
            raise AssertionError("must not be compiled when unavailable")

        backend = chain("needs_gpu", "eager")
        compile_and_check(model, args, backend)
    first = backend.report.graphs[0].attempts[0]
    assert (first.status, first.reason) == (Status.UNAVAILABLE, "no CUDA device")
    assert "needs_gpu" not in backends.registry


def test_nested_chain_is_a_backend() -> None:
    model, args = build("mlp")
    inner = chain(faults.raises_at_compile, "eager")
    # The inner chain's guard costs a few us per call: the floor would rightly pick eager.
    outer = chain(faults.declines, inner, eager_floor=False)
    compile_and_check(model, args, outer)
    assert outer.report.graphs[0].winner == inner.name
    assert inner.report.graphs[0].attempts[0].status is Status.COMPILE_ERROR
    assert outer.report.graphs[0].attempts[1].details == {"graph": 0, "winner": "eager"}


def test_input_mutation_runs_on_clones() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2

    backend = chain("inductor", "eager")
    x = torch.zeros(4)
    out = torch.compile(fn, backend=backend)(x)
    assert torch.equal(x, torch.ones(4))  # mutated exactly once, by the real call
    assert torch.equal(out, torch.full((4,), 2.0))
    assert any("mutates its inputs" in n for n in backend.report.graphs[0].notes)


def test_random_graphs_are_not_verified() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)

    backend = chain(faults.wrong_numbers, "eager", measure=False)
    torch.compile(fn, backend=backend)(torch.zeros(3))
    graph = backend.report.graphs[0]
    assert graph.winner == "wrong_numbers"
    reason = "not verified: random ops (torch.rand_like at node rand_like)"
    assert graph.attempts[0].reason == reason
    assert graph.notes[0] == reason


def test_verify_false_runs_unverified_and_says_so() -> None:
    model, args = build("mlp")
    backend = chain(faults.wrong_numbers, "eager", verify=False, measure=False)
    torch.compile(model, backend=backend)(*args)
    graph = backend.report.graphs[0]
    assert graph.winner == "wrong_numbers"
    assert graph.attempts[0].reason == "not verified: verify=False"


def test_options_reach_the_backend() -> None:
    seen: dict = {}

    def spy(gm: torch.fx.GraphModule, example_inputs: list, **options: object) -> object:
        seen.update(options)
        return gm.forward

    model, args = build("mlp")
    compile_and_check(model, args, chain(spy, "eager", options={"spy": {"level": 3}}))
    assert seen == {"level": 3}


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: chain(), "InvalidBackend", "at least one backend"),
        (lambda: chain("no_such_backend"), "InvalidBackend", r"ours: .*eager.*; dynamo.s: "),
        (lambda: chain("eager", "eager"), "InvalidBackend", "more than once: eager"),
        (lambda: chain(42), "InvalidBackend", "is not a backend"),
        (lambda: chain("eager", mode="slowest"), "InvalidOption", "'first', 'fastest'"),
        (lambda: chain("eager", options={"inductor": {}}), "InvalidOption", "valid keys: eager"),
        (lambda: chain("eager", options={"eager": {"x": 1}}), "InvalidOption", "valid: none"),
        (lambda: chain("eager", mode="fastest", measure=False), "InvalidOption", "measure=True"),
    ],
)
def test_bad_input_fails_at_chain_time(make: object, error: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        make()  # type: ignore[operator]
    assert type(info.value).__name__ == error


def test_chain_is_printable() -> None:
    assert repr(Chain("inductor", "eager")) == "chain('inductor', 'eager', mode='first')"


def test_a_backend_that_mutates_the_graph_is_blamed() -> None:
    """The contract breaker is named; eager then sees the changed graph and fails
    verification against the original outputs, so nothing wrong is ever returned."""
    model, args = build("mlp")
    backend = chain(faults.mutates_graph, "eager", measure=False)
    with pytest.raises(Exception, match="every backend failed"):
        torch.compile(model, backend=backend)(*args)
    first, second = backend.report.graphs[0].attempts
    assert (first.status, first.error_type) == (Status.COMPILE_ERROR, "ContractViolation")
    assert "mutated the graph module it was given" in first.reason
    assert second.status is Status.MISMATCH
