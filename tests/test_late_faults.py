"""Faults that strike after a candidate's first run: while it is timed, and once it has won
(the rows of benchmarks/fault_matrix.py that failed before): SystemExit is that backend's
failure, weights changed while timed make it a mismatch and are restored, a winner that
writes an input eager leaves alone is demoted and the call says so."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import chain
from chain.report.records import Status
from chain.run.watch import InputsWritten
from chain.select.isolation import WeightsDamaged
from tests.models import build_extra

SHAPES = ((2, 8), (1, 5))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def strikes_after(calls: int, fault: Callable[[tuple[Any, ...]], None]) -> Callable[..., Any]:
    """A backend: the graph's forward, with `fault` on every call after the first `calls`."""

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        count = [0]

        def run(*args: Any) -> Any:
            count[0] += 1
            if count[0] > calls:
                fault(args)
            return gm.forward(*args)

        return run

    backend.__name__ = "late"
    return backend


def _exit(args: tuple[Any, ...]) -> None:
    raise SystemExit(3)


def _scale_weight_quietly(args: tuple[Any, ...]) -> None:
    weight = next(a for a in args if isinstance(a, torch.nn.Parameter))
    weight.data.mul_(2.0)  # behind the version counter


def _zero_integer_buffers(args: tuple[Any, ...]) -> None:
    with torch.no_grad():
        for a in args:
            if isinstance(a, torch.Tensor) and not a.is_floating_point():
                a.zero_()


def _run(model: torch.nn.Module, backend: Any, calls: int = 3) -> None:
    compiled = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for shape in SHAPES:
            ids = torch.randint(0, 100, shape)
            kept = ids.clone()
            expected = model(ids.clone()).last_hidden_state
            for _ in range(calls):
                torch.testing.assert_close(compiled(ids).last_hidden_state, expected)
            assert torch.equal(ids, kept)


@pytest.mark.parametrize("where", ["timed", "run time"])
def test_system_exit_after_the_first_run_is_that_backends_failure(where: str) -> None:
    model, _ = build_extra("bert")
    # timed: every call after the first run (the verification) exits; run time: measure off,
    # so the first real call after selection is the first to exit
    backend = chain(strikes_after(1, _exit), "eager", eager_floor=False, measure=where == "timed")
    _run(model, backend)
    for graph in backend.report.graphs:
        late = graph.attempts[0]
        assert late.status is Status.RUNTIME_ERROR, late
        assert "SystemExit(3)" in late.reason, late.reason
        assert graph.winner == "eager"


def test_weights_changed_while_timed_are_a_mismatch_and_restored() -> None:
    model, _ = build_extra("bert")
    before = _state(model)
    backend = chain(strikes_after(1, _scale_weight_quietly), "eager", eager_floor=False)
    _run(model, backend)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    for graph in backend.report.graphs:
        late = graph.attempts[0]
        assert late.status is Status.MISMATCH, late
        assert late.reason.startswith("while timed: changed weight "), late.reason
        assert "(restored)" in late.reason
        assert graph.winner == "eager"


def test_a_winner_writing_an_input_eager_leaves_alone_is_demoted_and_the_call_says_so(
    guard_path: str,
) -> None:
    model, _ = build_extra("bert")
    backend = chain(strikes_after(1, _zero_integer_buffers), "eager", measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    ids = torch.randint(1, 100, (2, 8))
    wrote = r"late wrote input\(s\) \[.*\] where eager"
    # its first run (selection's verification) is right; the next, the real call, is not
    with torch.no_grad(), pytest.raises(InputsWritten, match=wrote):
        compiled(ids)
    graph = backend.report.graphs[0]
    late = graph.attempts[0]
    assert late.status is Status.MISMATCH, late
    assert "at call" in late.reason and "where eager does not" in late.reason, late.reason
    assert graph.winner == "eager"


def wrong_after_first_run(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right on its first call (the verification), wrong on every later one."""
    count = [0]

    def run(*args: Any) -> Any:
        count[0] += 1
        out = gm.forward(*args)
        return out if count[0] == 1 else [o + 1.0 if o.is_floating_point() else o for o in out]

    return run


def test_a_candidate_going_wrong_after_its_first_run_is_caught_after_timing() -> None:
    model, _ = build_extra("bert")
    backend = chain(wrong_after_first_run, "eager", eager_floor=False)
    _run(model, backend)
    for graph in backend.report.graphs:
        late = graph.attempts[0]
        assert late.status is Status.MISMATCH, late
        assert late.reason.startswith("after timing: output 0"), late.reason
        assert graph.winner == "eager"


def test_weights_changed_behind_the_version_counter_at_run_time_raise_weights_damaged() -> None:
    model, _ = build_extra("bert")
    backend = chain(strikes_after(1, _scale_weight_quietly), "eager", measure=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        compiled(ids)  # the guard's call 1 is not re-verified; the fault strikes already
        # call 2 is re-verified: the weights' fingerprints changed and no copy is kept
        with pytest.raises(WeightsDamaged, match=r"^late, the winner \(at run time, call 2\)"):
            compiled(ids)
    graph = backend.report.graphs[0]
    assert graph.attempts[0].status is Status.RUNTIME_ERROR, graph.attempts[0]
    assert "WeightsDamaged" in graph.attempts[0].reason
    assert graph.winner == "eager"


def test_weights_damaged_stays_the_error_when_the_fall_back_fails_on_them() -> None:
    """Under threads, other calls of the winner may still damage the weights while the
    chain re-selects on them: eager's run then sees them change and the re-selection fails.
    Before: that call raised AllCandidatesFailed, hiding WeightsDamaged (fault matrix,
    weights x threads). Here the re-selection is made to fail so, deterministically."""
    from chain.select.core import AllCandidatesFailed

    model, _ = build_extra("bert")
    backend = chain(strikes_after(1, _scale_weight_quietly), "eager", measure=False)
    reselect = backend.fall_back

    def fails(guard: Any, exc: Exception, args: tuple[Any, ...]) -> None:
        try:
            reselect(guard, exc, args)
        finally:
            raise AllCandidatesFailed(backend.report.graphs[guard.graph_id])

    backend.fall_back = fails  # type: ignore[method-assign]
    compiled = torch.compile(model, backend=backend, dynamic=False)
    ids = torch.randint(0, 100, (2, 8))
    with torch.no_grad():
        compiled(ids)
        with pytest.raises(WeightsDamaged, match=r"^late, the winner \(at run time, call 2\)"):
            compiled(ids)
