"""Verification against float64: real models in eval verified, wrong answers rejected,
correct low-precision results kept, random graphs named by the node that makes them so."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from chain import Chain, Status, chain
from chain.judge import accuracy
from chain.judge.fp64 import fp64_graph, run_fp64
from chain.judge.verify import TOLERANCES, channels_last, compare
from chain.report import graphinfo
from tests import faults
from tests.models import build, build_extra

FAULTS = {
    "perturbed": faults.perturbed,
    "drops_residual": faults.drops_residual,
    "stale": faults.stale,
}


def _run(model_name: str, backend: Any, dtype: torch.dtype = torch.float32) -> Chain:
    """Compile a test model with chain(*backend, 'eager') and call it once (no timing)."""
    model, args = build_extra(model_name) if model_name != "transformer" else build(model_name)
    model = model.to(dtype)
    args = tuple(x.to(dtype) if x.is_floating_point() else x for x in args)
    backends = backend if isinstance(backend, tuple) else (backend,)
    c = chain(*backends, "eager", measure=False)
    with torch.no_grad():
        torch.compile(model, backend=c)(*args)
    return c


def _verified(c: Chain) -> None:
    for graph in c.report.graphs:
        assert not any(n.startswith(("not verified", "no float64")) for n in graph.notes)


# -- random ops ---------------------------------------------------------------------------


def test_eval_dropout_is_not_random_and_active_dropout_names_its_node() -> None:
    def inactive(x: torch.Tensor) -> torch.Tensor:
        y = F.dropout(x, 0.1, training=False) + F.dropout(x, 0.1, False, False)
        y = y + F.dropout(x, 0.0) + torch.dropout(x, 0.2, False)
        return y + torch.ops.aten.native_dropout.default(x, 0.2, False)[0] + F.rrelu(x)

    def active(x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.1) + torch.ops.aten.native_dropout.default(x, 0.2, True)[0]

    assert graphinfo.random_nodes(torch.fx.symbolic_trace(inactive)) == []
    found = [str(r) for r in graphinfo.random_nodes(torch.fx.symbolic_trace(active))]
    assert found == [
        "torch.nn.functional.dropout at node dropout (training=True, p=0.1)",
        "aten.native_dropout.default at node native_dropout_default (train=True, p=0.2)",
    ]


def test_training_dropout_graph_is_unverified_and_says_which_node() -> None:
    model, args = build_extra("dropout_residual")
    c = chain(faults.perturbed, "eager", measure=False)
    torch.compile(model.train(), backend=c)(*args)
    [graph] = c.report.graphs
    assert graph.winner == "perturbed"  # random: it cannot be compared, so it is not rejected
    assert graph.notes[0].startswith("not verified: random ops (torch.nn.functional.dropout")
    assert "training=True, p=0.1" in graph.notes[0]


# -- real models in eval: verified, faults rejected ------------------------------------------


def test_eval_model_with_dropout_is_verified_and_inductor_passes() -> None:
    c = _run("dropout_residual", "inductor")
    _verified(c)
    [graph] = c.report.graphs
    won = graph.attempts[0]
    assert (won.backend, won.status, won.reason) == ("inductor", Status.WON, "")
    assert won.error is not None and won.eager_error is not None
    assert won.error <= accuracy.MULTIPLE * won.eager_error + 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("model_name", ["bert", "dropout_residual"])
def test_faults_are_mismatches_with_both_errors(model_name: str, dtype: torch.dtype) -> None:
    c = _run(model_name, tuple(FAULTS.values()), dtype)
    _verified(c)
    [graph] = c.report.graphs
    *wrong, eager = graph.attempts
    assert [(a.backend, a.status) for a in wrong] == [(f, Status.MISMATCH) for f in FAULTS]
    for a in wrong:
        assert a.error_ratio is not None and a.error_ratio > accuracy.MULTIPLE
        assert a.error is not None and a.eager_error is not None
        assert f"RMSE vs float64 {a.error:.3g} is" in a.reason
        assert f"eager's {a.eager_error:.3g}" in a.reason
    assert eager.status is Status.WON


# -- low precision: rounding is not a wrong answer ------------------------------------------


@pytest.mark.parametrize("model_name", ["dropout_residual", "transformer"])
def test_bf16_inductor_passes_where_faults_fail(model_name: str) -> None:
    c = _run(model_name, "inductor", torch.bfloat16)
    _verified(c)
    first = c.report.graphs[0].attempts[0]
    assert first.status is Status.WON, first.reason
    assert first.error_ratio is not None and first.error_ratio <= accuracy.MULTIPLE
    torch._dynamo.reset()
    wrong = _run(model_name, faults.perturbed, torch.bfloat16).report.graphs[0].attempts[0]
    assert wrong.status is Status.MISMATCH


def test_bf16_onnxruntime_is_never_a_mismatch() -> None:
    """ONNX Runtime's CPU provider has no bf16 MatMul: it declines, it is not called wrong."""
    first = _run("dropout_residual", "onnxruntime", torch.bfloat16).report.graphs[0].attempts[0]
    assert first.status in (Status.WON, Status.UNSUPPORTED), first.reason
    if first.status is Status.WON:
        assert first.error_ratio is not None and first.error_ratio <= accuracy.MULTIPLE
    else:
        assert "NOT_IMPLEMENTED" in first.reason


def test_bf16_correct_result_that_fixed_tolerances_reject_passes() -> None:
    """One value off by 2 ulp of bf16 in a rounding-sized way: tolerances say mismatch,
    the error rule (eager is as far from float64) says pass."""
    torch.manual_seed(0)
    exact = torch.randn(4096, dtype=torch.float64) * 4
    eager = exact.to(torch.bfloat16)
    candidate = (exact * (1 + 2e-3 * torch.randn_like(exact))).to(torch.bfloat16)
    candidate[0] = eager[0] + 8 * torch.finfo(torch.bfloat16).eps * eager[0].abs() + 0.02
    assert compare(eager, candidate).reason is not None
    verdict = compare(eager, candidate, fp64=exact)
    assert verdict.reason is None and verdict.worst is not None
    assert verdict.worst.ratio is not None and verdict.worst.ratio < accuracy.MULTIPLE


# -- the float64 reference -------------------------------------------------------------------


def test_fp64_graph_widens_casts_and_leaves_the_original() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = x.half().float() + torch.ones(3, dtype=torch.float32)
        return y.to(torch.bfloat16).to(x.dtype) * 3

    gm = torch.fx.symbolic_trace(fn)
    before = gm.code
    out = fp64_graph(gm)(torch.full((3,), 1 / 3, dtype=torch.float64))
    assert out.dtype == torch.float64
    assert out.tolist() == pytest.approx([4.0] * 3, abs=1e-12)  # no fp16/bf16 rounding left
    assert gm.code == before
    assert run_fp64(gm, [torch.full((3,), 1 / 3)]).dtype == torch.float64


@torch.library.custom_op("chain_test::fp32_only", mutates_args=())
def _fp32_only(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float64:
        raise NotImplementedError("no float64 kernel")
    return x * 2


@_fp32_only.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_no_fp64_kernel_falls_back_to_tolerances_and_says_so() -> None:
    c = chain(faults.wrong_numbers, "eager", measure=False)
    torch.compile(lambda x: _fp32_only(x) + 1, backend=c)(torch.randn(8))
    [graph] = c.report.graphs
    assert any(
        n.startswith("no float64 reference (NotImplementedError: no float64 kernel)")
        and n.endswith("verified with dtype tolerances")
        for n in graph.notes
    )
    first = graph.attempts[0]
    assert first.status is Status.MISMATCH and "values not close" in first.reason
    assert first.error is None and graph.winner == "eager"


# -- the error rule --------------------------------------------------------------------------


def test_rule_floor_admits_rounding_where_eager_is_exact() -> None:
    exact = torch.linspace(-3, 3, 1000, dtype=torch.float64)
    eager = exact.float()  # eager rounds once
    other = (exact * (1 + 2**-24)).float()  # another rounding of the same value
    result = accuracy.output_error(0, exact, eager, other)
    assert result.passed
    result = accuracy.output_error(0, exact, eager, (exact * (1 + 1e-4)).float())
    assert not result.passed and "allowed 3x eager + floor" in result.reason()


@pytest.mark.parametrize("rule", ["tolerances", "float64", "near eager"])
def test_values_not_finite_in_both_are_left_out_as_if_absent(rule: str) -> None:
    """NaN/inf where eager has them too are left out of every figure (the masked path); the
    same outputs without those values (the all-finite path, no masks) give the same ones."""
    eager = torch.tensor([1.0, float("nan"), 2.0, float("inf"), -3.0])
    cand = torch.tensor([1.0 + 1e-6, float("nan"), 2.0 - 2e-6, float("inf"), -3.0])
    keep = [0, 2, 4]
    fp64 = eager.double() if rule == "float64" else None
    recorded = [1e-7] if rule == "near eager" else None
    masked = compare(eager, cand, fp64=fp64, recorded=recorded)
    finite = compare(
        eager[keep], cand[keep], fp64=None if fp64 is None else fp64[keep], recorded=recorded
    )
    assert masked.max_abs_err == finite.max_abs_err == pytest.approx(2e-6, rel=0.1)
    assert masked.reason == finite.reason
    if masked.worst is not None:
        assert finite.worst is not None
        assert (masked.worst.error, masked.worst.allowed) == (
            finite.worst.error,
            finite.worst.allowed,
        )


def test_new_inf_or_nan_is_a_mismatch_exact_ints_compared() -> None:
    exact = torch.ones(4, dtype=torch.float64)
    bad = torch.tensor([1.0, float("inf"), 1.0, 1.0])
    assert "1 inf value(s) where eager has none" in str(compare(exact.float(), bad, fp64=exact))
    nan = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert "1 NaN value(s)" in str(compare(exact.float(), nan, fp64=exact).reason)
    ints = torch.arange(4)
    assert compare(ints, ints + (ints == 3), fp64=ints).reason == "output 0: 1 of 4 values differ"


def test_a_winner_must_keep_eagers_channels_last_layout() -> None:
    """Selection checks the layout the run-time watch checks: a candidate that returns a
    plain-contiguous tensor where eager's is channels_last is a mismatch (before, it won and
    was demoted on its first real call)."""
    eager = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    assert compare(eager, eager.clone()).reason is None
    verdict = compare(eager, eager.contiguous(), fp64=eager.double())
    assert verdict.reason == "output 0 is not channels_last as eager's is"
    ones = torch.randn(2, 3, 1, 1).contiguous(memory_format=torch.channels_last)
    assert compare(ones, ones.contiguous()).reason is None  # 1x1 maps are both layouts at once


@pytest.mark.slow
def test_onnxruntime_keeps_convnexts_channels_last_output() -> None:
    """A small ConvNeXt (transformers, random weights) at two image sizes (a static graph,
    then a symbolic one): eager's last hidden state is channels_last; ONNX Runtime returns
    it in that layout, so it wins each graph and is never demoted (before: it won, then was
    demoted on its first real call for the layout)."""
    pytest.importorskip("onnxruntime")
    from transformers import ConvNextConfig, ConvNextModel

    config = ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)
    model = ConvNextModel(config).eval()
    c = chain("onnxruntime", "eager", measure=False)
    compiled = torch.compile(model, backend=c)
    with torch.no_grad():
        for size in (32, 48, 40, 40):
            x = torch.randn(2, 3, size, size)
            got, want = compiled(x).last_hidden_state, model(x).last_hidden_state
            torch.testing.assert_close(got, want)
            assert channels_last(want) and channels_last(got)
    assert [g.winner for g in c.report.graphs] == ["onnxruntime", "onnxruntime"]
    assert not [f for g in c.report.graphs if g.watch for f in g.watch.failures]


@pytest.mark.cuda
def test_compare_on_cuda_decides_as_on_the_cpu() -> None:
    """Without float64 references, outputs on the GPU are compared there (a race pair's
    check); the verdicts are the CPU's: equal, slightly off within tolerance, 1% off, NaN."""
    torch.manual_seed(0)
    exp = torch.randn(64, 1000)
    for act in (exp.clone(), exp + 1e-7, exp * 1.01, exp.masked_fill(exp > 2, float("nan"))):
        on_cpu = compare(exp, act, layout=False)
        on_gpu = compare(exp.cuda(), act.cuda(), layout=False)
        assert on_gpu.reason == on_cpu.reason, (on_gpu, on_cpu)
        assert on_gpu.max_abs_err == pytest.approx(on_cpu.max_abs_err)
    assert compare(exp.cuda(), (exp * 1.01).cuda(), layout=False).reason is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tolerance_check_counts_as_isclose_does(dtype: torch.dtype) -> None:
    """Under tolerances the check takes one difference (fast on a GPT-2's logits); its
    verdict and count of values not close are isclose's, its error the float64 one, on
    perturbations each side of the tolerance, values near zero, and new NaN and inf."""
    torch.manual_seed(0)
    rtol, atol = TOLERANCES[dtype]
    exp = torch.randn(4096, dtype=dtype) * torch.logspace(-6, 3, 4096, dtype=dtype)
    for scale in (0.0, 0.3, 0.9, 1.1, 3.0):
        noise = torch.randn_like(exp).sign() * (atol + rtol * exp.abs()) * scale
        for act in (exp + noise, (exp + noise).index_fill(0, torch.tensor([7]), float("nan")),
                    (exp + noise).index_fill(0, torch.tensor([9]), float("inf"))):  # fmt: skip
            verdict = compare(exp, act, layout=False)
            close = torch.isclose(act, exp, rtol=rtol, atol=atol)
            if not torch.isfinite(act).all():
                assert verdict.reason is not None and "where eager has none" in verdict.reason
                continue
            wrong = int((~close).sum())
            assert (verdict.reason is None) == (wrong == 0), (scale, verdict)
            if wrong:
                assert f"{wrong} of 4096 values not close" in str(verdict.reason)
            err = float((exp.double() - act.double()).abs().max())
            assert verdict.max_abs_err == pytest.approx(err, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_near_eager_from_one_difference_is_the_float64_figure(dtype: torch.dtype) -> None:
    """The run-time check's distance and scale (summed in float64 from one difference) are
    the figures of float64 copies, to 1e-6; with a NaN both leave it out alike."""
    torch.manual_seed(0)
    eager = (torch.randn(64, 999) * 3).to(dtype)
    candidate = (eager.float() * (1 + 1e-3 * torch.randn(64, 999))).to(dtype)
    for cand in (candidate, candidate.index_fill(1, torch.tensor([5]), float("nan"))):
        got = accuracy.near_eager(0, eager, cand, 1e-3)
        e, c = eager.double(), cand.double()
        keep = torch.isfinite(c)
        distance = float((e[keep] - c[keep]).square().mean().sqrt())
        scale = float(e[keep].square().mean().sqrt())
        assert got.error == pytest.approx(distance, rel=1e-6)
        assert got.eager_error == pytest.approx(1e-3 * scale, rel=1e-6)
