"""Compare a candidate's outputs with eager's, pytree by pytree: structure, shapes, dtypes,
exact integers, no new NaN/inf; floating values by the error rule against the float64
reference (`chain.judge.accuracy`), or under dtype tolerances when there is none; and the inputs
a graph writes to, after the call, against eager's."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from chain.judge.accuracy import OutputError, near_eager, output_error

# (rtol, atol) per dtype, used only without a float64 reference: fp32 tight, low precision looser.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


@dataclass(frozen=True)
class Verdict:
    """The comparison's result: `reason` is None when the outputs match."""

    reason: str | None
    max_abs_err: float | None
    worst: OutputError | None = None  # the output that used most of its allowance (fp64 rule)
    basis: str | None = None  # how a remembered winner was verified (chain.select.attempt.QUICK...)


def channels_last(t: torch.Tensor) -> bool:
    """A 4-d tensor laid out channels_last (and not also plain contiguous, as 1x1 maps are):
    a winner must keep eager's layout, as the ops after it may depend on it for speed."""
    return (
        t.dim() == 4
        and not t.is_contiguous()
        and t.is_contiguous(memory_format=torch.channels_last)
    )


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN/inf in `t`: then the masks of what is finite select everything, and are skipped."""
    return bool(torch.isfinite(t).all())


def _as_tuple(out: Any) -> Any:
    return tuple(out) if isinstance(out, list) else out


def compare(
    expected: Any,
    actual: Any,
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
    fp64: Any = None,
    reductions: Sequence[int] = (),
    recorded: Sequence[float | None] | None = None,
    layout: bool = True,
) -> Verdict:
    """Match structure, shapes, dtypes and values; NaN/inf where eager has none is a mismatch.

    With `fp64` (the graph's float64 outputs, same structure as `expected`), floating values
    pass by the error rule; without it, under `tolerances` (default: TOLERANCES).
    `reductions`: per output, how many values it sums over (`chain.judge.accuracy`; default 1).
    `recorded` (without `fp64`): per output, eager's relative error against float64 as a
    decision recorded it; floating outputs that have one pass by `near_eager` instead.
    `layout`: a channels_last output of eager's must be channels_last in `actual` too.
    """
    tol = TOLERANCES | (tolerances or {})
    exp_leaves, exp_spec = pytree.tree_flatten(_as_tuple(expected))
    act_leaves, act_spec = pytree.tree_flatten(_as_tuple(actual))
    if exp_spec != act_spec:
        return Verdict(
            f"output structure differs: expected {len(exp_leaves)} output(s) "
            f"({exp_spec}), got {len(act_leaves)} ({act_spec})",
            None,
        )
    ref_leaves = pytree.tree_leaves(_as_tuple(fp64)) if fp64 is not None else None
    if ref_leaves is not None and len(ref_leaves) != len(exp_leaves):
        raise ValueError(f"{len(ref_leaves)} float64 outputs for {len(exp_leaves)} outputs")
    biggest = 0.0
    worst: OutputError | None = None
    for i, (exp, act) in enumerate(zip(exp_leaves, act_leaves, strict=True)):
        if not isinstance(exp, torch.Tensor):
            if exp != act:
                return Verdict(f"output {i}: expected {exp!r}, got {act!r}", None)
            continue
        if not isinstance(act, torch.Tensor):
            return Verdict(f"output {i}: expected a tensor, got {type(act).__name__}", None)
        if exp.shape != act.shape:
            return Verdict(f"output {i}: shape {tuple(act.shape)} != {tuple(exp.shape)}", None)
        if exp.dtype != act.dtype:
            return Verdict(f"output {i}: dtype {act.dtype} != {exp.dtype}", None)
        nhwc = torch.channels_last
        if layout and channels_last(exp) and not act.is_contiguous(memory_format=nhwc):
            return Verdict(f"output {i} is not channels_last as eager's is", None)
        exp_c, act_c = exp.detach(), act.detach()
        if exp_c.device != act_c.device:
            exp_c, act_c = exp_c.cpu(), act_c.cpu()
        # else on their device: a GPT-2's logits copied to the CPU and compared there took
        # 22-84 ms of a race pair on an H200 (the call: 2 ms), and starved the race of pairs
        if not (exp_c.is_floating_point() or exp_c.is_complex()):
            if not torch.equal(exp_c, act_c):
                wrong = int((exp_c != act_c).sum())
                return Verdict(f"output {i}: {wrong} of {exp_c.numel()} values differ", None)
            continue
        difference = _difference(exp_c, act_c)
        if difference is not None:  # the usual case: one difference, no masks to build
            diff, err = difference
        elif _all_finite(exp_c) and _all_finite(act_c):
            err = float((exp_c.double() - act_c.double()).abs().max()) if exp_c.numel() else 0.0
        else:
            new_nan = torch.isnan(act_c) & ~torch.isnan(exp_c)
            new_inf = torch.isinf(act_c) & torch.isfinite(exp_c)
            for what, new in (("NaN", new_nan), ("inf", new_inf)):
                if new.any():
                    wrong = int(new.sum())
                    return Verdict(
                        f"output {i}: {wrong} {what} value(s) where eager has none", biggest
                    )
            both = torch.isfinite(exp_c) & torch.isfinite(act_c)
            err = (
                float((exp_c[both].double() - act_c[both].double()).abs().max())
                if both.any()
                else 0.0
            )
        biggest = max(biggest, err)
        ref = ref_leaves[i] if ref_leaves is not None else None
        if isinstance(ref, torch.Tensor) and exp_c.is_floating_point():
            reduced = reductions[i] if i < len(reductions) else 1
            worst = _worse(worst, result := output_error(i, ref, exp_c, act_c, reduced=reduced))
            if not result.passed:
                return Verdict(result.reason(), biggest, result)
            continue
        known = recorded[i] if recorded is not None and i < len(recorded) else None
        if ref is None and recorded is not None and known is None:
            return Verdict(f"output {i}: no recorded error to bound it by", biggest, worst)
        if ref is None and known is not None and exp_c.is_floating_point():
            reduced = reductions[i] if i < len(reductions) else 1
            worst = _worse(worst, result := near_eager(i, exp_c, act_c, known, reduced=reduced))
            if not result.passed:
                return Verdict(result.reason(), biggest, result)
            continue
        rtol, atol = tol.get(exp.dtype, (0.0, 0.0))
        if difference is not None:  # isclose's rule, |act - exp| <= atol + rtol * |exp|
            wrong = 0 if err <= atol else int((diff > atol + rtol * exp_c.abs()).sum())
        else:
            wrong = int((~torch.isclose(act_c, exp_c, rtol=rtol, atol=atol, equal_nan=True)).sum())
        if wrong:
            return Verdict(_not_close(i, wrong, exp_c.numel(), err, rtol, atol), biggest, worst)
    return Verdict(None, biggest, worst)


# dtypes whose difference is exact enough in their own precision for `_difference`
_QUICK = (torch.float32, torch.float64)


def _difference(exp: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, float] | None:
    """|act - exp| and its max, in their precision; None for other dtypes or where a value
    is not finite (NaN propagates through max, inf makes it inf). A GPT-2's logits (64 x
    50257, 1 thread) under tolerances: 7 ms against 129 for the finite checks, a float64
    difference and isclose."""
    if exp.dtype not in _QUICK:
        return None
    diff = (act - exp).abs()
    err = float(diff.max()) if diff.numel() else 0.0
    return (diff, err) if math.isfinite(err) else None


def _not_close(i: int, wrong: int, n: int, err: float, rtol: float, atol: float) -> str:
    return (
        f"output {i}: {wrong} of {n} values not close, max abs err {err:.3g} "
        f"(rtol={rtol:g}, atol={atol:g})"
    )


def _worse(worst: OutputError | None, result: OutputError) -> OutputError:
    """The more severe of the worst output so far and `result`."""
    return result if worst is None or result.severity > worst.severity else worst


def compare_writes(
    expected: dict[int, torch.Tensor],
    actual: Sequence[Any],
    before: Sequence[Any],
    wrote: Collection[int],
    names: dict[int, str],
    tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
) -> Verdict | None:
    """A candidate's inputs after its call against eager's, by position, for every input
    the chain copied (not only in graphs that declare writes): None when each matches.

    `expected`: eager's inputs after its call; `before`: the inputs as the caller passed
    them; `wrote`: the positions eager changed. An input eager left alone must be left
    exactly as it was ("written where eager does not"); one eager wrote must match eager's
    under the usual comparison ("not updated as eager does"). `names`: how to name each.
    """
    for i, after in expected.items():
        got, name = actual[i], names.get(i, f"input {i}")
        if i not in wrote:
            if not unchanged(got, before[i]):
                return Verdict(
                    f"{name} written where eager does not ({_what_changed(got, before[i])})", None
                )
            continue
        if unchanged(got, before[i]):
            return Verdict(f"{name} not updated as eager does: left unchanged", None)
        verdict = compare(after, got, tolerances)
        if verdict.reason is not None:
            detail = verdict.reason.removeprefix("output 0: ")
            return Verdict(f"{name} not updated as eager does: {detail}", verdict.max_abs_err)
    return None


def unchanged(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` holds exactly `b`'s shape, dtype and values (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach(), b.detach().to(a.device)
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return torch.equal(a, b)


def _what_changed(a: torch.Tensor, b: torch.Tensor) -> str:
    """`3 of 8 values changed`, or the shape/dtype that changed."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"now {a.dtype} {tuple(a.shape)}, was {b.dtype} {tuple(b.shape)}"
    b = b.detach().to(a.device)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    return f"{int((~same).sum())} of {a.numel()} values changed"
