"""Isolation during selection: candidates run on copies of the caller's inputs, their
effect on every input is compared with eager's, weights are watched, SystemExit is a
backend's failure, and a correct large reduction is not rejected."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx

from chain import AllCandidatesFailed, Status, chain
from chain.judge.accuracy import reduction_lengths
from chain.select import isolation as isolation_module
from chain.select.isolation import WeightsDamaged
from tests.models import build, build_extra


def unwrap(exc: BaseException) -> BaseException:
    """The chain's own exception inside dynamo's BackendCompilerFailed wrapper."""
    return getattr(exc, "inner_exception", exc)


def _tensor_args(args: tuple[Any, ...]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def zeroes_input(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right outputs, then zeroes every non-parameter input it was handed."""

    def run(*args: Any) -> Any:
        out = gm(*args)
        for a in _tensor_args(args):
            if not isinstance(a, torch.nn.Parameter) and a.is_floating_point():
                a.zero_()
        return out

    return run


def scribbles_then_raises(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Writes garbage into its inputs, then fails."""

    def run(*args: Any) -> Any:
        for a in _tensor_args(args):
            if not isinstance(a, torch.nn.Parameter) and a.is_floating_point():
                a.fill_(7.0)
        raise RuntimeError("kernel failed after scribbling")

    return run


def _first_parameter(args: tuple[Any, ...]) -> torch.nn.Parameter:
    return next(a for a in args if isinstance(a, torch.nn.Parameter) and a.is_floating_point())


def scales_a_parameter(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Right outputs, then doubles a parameter in place (its version counter moves)."""

    def run(*args: Any) -> Any:
        out = gm(*args)
        with torch.no_grad():
            _first_parameter(args).mul_(2)
        return out

    return run


def scales_a_parameter_quietly(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """Doubles a parameter through `.data`, which bypasses its version counter."""

    def run(*args: Any) -> Any:
        out = gm(*args)
        _first_parameter(args).data.mul_(2)
        return out

    return run


def raises_system_exit_at_compile(
    gm: fx.GraphModule, example_inputs: list[Any]
) -> Callable[..., Any]:
    raise SystemExit("compiler called exit(3)")


def raises_system_exit_at_run(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        raise SystemExit(3)

    return run


def interrupted(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    raise KeyboardInterrupt


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same_state(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> None:
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed"


# -- inputs ------------------------------------------------------------------------------


def test_a_candidate_zeroing_its_input_cannot_win_and_the_input_is_intact() -> None:
    model, (x,) = build("mlp")
    kept, expected = x.clone(), model(x).detach()
    c = chain(zeroes_input, "eager", measure=False)
    with torch.no_grad():
        compiled = torch.compile(model, backend=c)
        for _ in range(2):
            torch.testing.assert_close(compiled(x), expected)
    assert torch.equal(x, kept), "the caller's input was written during selection"
    zeroing, eager = c.report.graphs[0].attempts
    assert zeroing.status is Status.MISMATCH
    assert "(l_x_) written where eager does not" in zeroing.reason
    assert eager.status is Status.WON


def test_a_write_where_eager_writes_nothing_names_the_input() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    x, y = torch.randn(8), torch.randn(8)
    c = chain(zeroes_input, "eager", measure=False)
    torch.compile(f, backend=c)(x, y)
    [zeroing, _] = c.report.graphs[0].attempts
    assert zeroing.status is Status.MISMATCH
    assert zeroing.reason.startswith("input 0 (l_x_) written where eager does not")


def test_a_scribble_then_raise_does_not_poison_eager() -> None:
    model, (x,) = build("mlp")
    kept, expected = x.clone(), model(x).detach()
    c = chain(scribbles_then_raises, "eager", measure=False)
    with torch.no_grad():
        out = torch.compile(model, backend=c)(x)
    torch.testing.assert_close(out, expected)
    assert torch.equal(x, kept)
    scribbler, eager = c.report.graphs[0].attempts
    assert scribbler.status is Status.RUNTIME_ERROR
    assert "kernel failed after scribbling" in scribbler.reason
    assert eager.status is Status.WON


def test_a_graph_that_writes_its_input_writes_it_once() -> None:
    def doubles_in_place(x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x + 1

    x = torch.arange(4.0)
    c = chain(zeroes_input, "eager", measure=False)
    out = torch.compile(doubles_in_place, backend=c)(x)
    torch.testing.assert_close(x, torch.arange(4.0) * 2)
    torch.testing.assert_close(out, torch.arange(4.0) * 2 + 1)
    assert c.report.graphs[0].winner == "eager"


# -- weights -----------------------------------------------------------------------------


@pytest.mark.parametrize("fault", [scales_a_parameter, scales_a_parameter_quietly])
def test_a_candidate_scaling_a_parameter_is_a_mismatch_and_the_weight_is_restored(
    fault: Callable[..., Any],
) -> None:
    model, _ = build_extra("bert")
    before = _state(model)
    c = chain(fault, "eager", measure=False)
    compiled = torch.compile(model, backend=c, dynamic=False)
    with torch.no_grad():
        for shape in ((2, 8), (1, 5)):
            ids = torch.randint(0, 100, shape)
            expected = model(ids).last_hidden_state
            torch.testing.assert_close(compiled(ids).last_hidden_state, expected)
    _assert_same_state(model, before)
    assert len(c.report.graphs) == 2
    for graph in c.report.graphs:
        scaler, eager = graph.attempts
        assert scaler.status is Status.MISMATCH
        assert scaler.reason.startswith("changed weight "), scaler.reason
        assert "embeddings" in scaler.reason and "(restored)" in scaler.reason
        assert eager.status is Status.WON


def test_damaged_weights_without_a_snapshot_raise_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(isolation_module, "SNAPSHOT_BYTES", 0)
    model, (ids,) = build_extra("bert")
    c = chain(scales_a_parameter, "eager", measure=False)
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(model, backend=c)(ids)
    err = unwrap(info.value)
    assert isinstance(err, WeightsDamaged)
    assert "scales_a_parameter" in str(err) and "embeddings" in str(err)


# -- SystemExit and KeyboardInterrupt ----------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "reason"),
    [
        (raises_system_exit_at_compile, Status.COMPILE_ERROR, "compiler called exit(3)"),
        (raises_system_exit_at_run, Status.RUNTIME_ERROR, "SystemExit: 3"),
    ],
)
def test_system_exit_from_a_backend_is_its_failure(
    fault: Callable[..., Any], status: Status, reason: str
) -> None:
    model, (x,) = build("mlp")
    c = chain(fault, "eager", measure=False)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=c)(x), model(x))
    failed, eager = c.report.graphs[0].attempts
    assert failed.status is status
    assert reason in failed.reason
    assert failed.error_type == "SystemExit"
    assert eager.status is Status.WON


def test_keyboard_interrupt_propagates() -> None:
    model, (x,) = build("mlp")
    c = chain(interrupted, "eager", measure=False)
    with pytest.raises(KeyboardInterrupt), torch.no_grad():
        torch.compile(model, backend=c)(x)


# -- large reductions --------------------------------------------------------------------


class Sum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def drops_a_block(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
    """A wrong sum: the last 1000 of a million values are left out."""

    def run(x: torch.Tensor) -> tuple[torch.Tensor]:
        return (x[:-1000].sum(),)

    return run


def test_a_correct_onnxruntime_sum_of_a_million_values_wins() -> None:
    torch.manual_seed(0)
    x = torch.randn(1_000_000)
    c = chain("onnxruntime", "eager", measure=False)
    with torch.no_grad():
        torch.compile(Sum(), backend=c)(x)
    ort = c.report.graphs[0].attempts[0]
    assert ort.status is Status.WON, ort.reason
    assert ort.error_ratio is not None and ort.error_ratio > 3  # the floor admitted it


def test_a_sum_off_by_a_real_error_is_still_a_mismatch() -> None:
    torch.manual_seed(0)
    x = torch.randn(1_000_000)
    c = chain(drops_a_block, "eager", measure=False)
    with torch.no_grad():
        torch.compile(Sum(), backend=c)(x)
    wrong = c.report.graphs[0].attempts[0]
    assert wrong.status is Status.MISMATCH
    assert wrong.reason.startswith("output 0: RMSE vs float64")


class SumsMixed(torch.nn.Module):
    """Two sums added and scaled, and a mean broadcast back over its input."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.sum() * 0.5 + y.sum(), x - x.mean(-1, keepdim=True)


def _traced(model: torch.nn.Module, *inputs: torch.Tensor) -> fx.GraphModule:
    graphs: list[fx.GraphModule] = []

    def keep(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=keep)(*inputs)
    (gm,) = graphs
    return gm


def test_arithmetic_on_a_sum_keeps_its_length_a_broadcast_mean_does_not() -> None:
    """The floor follows a sum through `* 0.5 + y.sum()`; a mean broadcast back over a
    larger tensor leaves that output at one ulp (its rounding is small next to it)."""
    gm = _traced(SumsMixed(), torch.randn(40, 50), torch.randn(30))
    assert reduction_lengths(gm) == (2000, 1)


def test_a_correct_onnxruntime_sum_of_sums_wins_a_wrong_one_does_not() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(1000, 1000), torch.randn(30)
    c = chain("onnxruntime", "eager", measure=False)
    with torch.no_grad():
        torch.compile(SumsMixed(), backend=c)(x, y)
    assert c.report.graphs[0].attempts[0].status is Status.WON, c.report.graphs[0].attempts

    def drops_a_block(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.view(-1)[:-1000].sum() * 0.5 + y.sum(), x - x.mean(-1, keepdim=True)

        return run

    c = chain(drops_a_block, "eager", measure=False)
    with torch.no_grad():
        torch.compile(SumsMixed(), backend=c)(x, y)
    wrong = c.report.graphs[0].attempts[0]
    assert wrong.status is Status.MISMATCH and wrong.reason.startswith("output 0: RMSE"), wrong


def test_every_candidate_failing_still_names_each() -> None:
    model, (x,) = build("mlp")
    c = chain(scribbles_then_raises, measure=False)
    with pytest.raises(Exception) as info, torch.no_grad():
        torch.compile(model, backend=c)(x)
    assert isinstance(unwrap(info.value), AllCandidatesFailed)


def _bert_weights() -> tuple[dict[int, torch.Tensor], dict[int, str]]:
    model, _ = build_extra("bert")
    tensors = dict(enumerate([*model.parameters(), *model.buffers()]))
    names = [*(n for n, _ in model.named_parameters()), *(n for n, _ in model.named_buffers())]
    return tensors, dict(enumerate(names))


def _unsampled_element(t: torch.Tensor) -> None:
    """Changes one element the fingerprint's strided sample skips, bypassing the version."""
    t.data.view(-1)[1] += 1


def _int_buffer_element(t: torch.Tensor) -> None:
    t.data.view(-1)[-1] += 1


def _nan(t: torch.Tensor) -> None:
    t.data.view(-1)[1] = float("nan")


@pytest.mark.parametrize(
    ("pick", "write"),
    [
        (lambda t: t.is_floating_point() and t.numel() > 64, _unsampled_element),
        (lambda t: not t.is_floating_point(), _int_buffer_element),
        (lambda t: t.is_floating_point() and t.numel() > 64, _nan),
    ],
    ids=["unsampled element", "integer buffer", "nan"],
)
def test_the_joined_weight_check_sees_a_write_that_bypasses_the_version(
    pick: Callable[[torch.Tensor], bool], write: Callable[[torch.Tensor], None]
) -> None:
    """The run-time weight check compares every floating weight's fingerprint in one go;
    a write it must see: an element off the sample (the sum shows it), an integer buffer
    (checked one by one), a NaN (not equal to itself: the weight-by-weight check names it)."""
    tensors, names = _bert_weights()
    watch = isolation_module.WeightWatch(tensors, names, snapshots=False)
    assert watch.unchanged() and watch.changed() == ([], [])
    i = next(i for i, t in tensors.items() if pick(t))
    version = tensors[i]._version
    write(tensors[i])
    assert tensors[i]._version == version  # bypassed the counter
    assert not watch.unchanged()
    assert watch.changed() == ([i], [])
    with pytest.raises(WeightsDamaged, match=names[i].replace(".", r"\.")):
        watch.check("a backend")


def test_run_time_weight_checks_cover_every_weight_in_turn() -> None:
    """After selection the fingerprints are compared one part at a time: every floating
    weight is in exactly one part, and a write bypassing the version counter to the last
    weight is seen within `parts` checks (by the part that holds it, not before), then
    named by the full check."""
    tensors, names = _bert_weights()
    watch = isolation_module.WeightWatch(tensors, names, snapshots=False, parts=8)
    floating = [t for t in tensors.values() if t.is_floating_point()]
    assert len(watch.groups) == 8
    assert [id(t) for group in watch.groups for t in group] == [id(t) for t in floating]
    assert all(watch.unchanged() for _ in range(8))  # a whole round: nothing changed
    last = max(i for i, t in tensors.items() if t.is_floating_point())
    _unsampled_element(tensors[last])
    seen = [watch.unchanged() for _ in range(8)]
    assert seen == [True] * 7 + [False]  # the last part holds the last weight
    assert [watch.check("a backend") for _ in range(7)] == [None] * 7  # parts 1 to 7
    with pytest.raises(WeightsDamaged, match=names[last].replace(".", r"\.")):
        watch.check("a backend")  # the eighth part: the full check names the weight
