"""Compare a candidate's outputs with eager's under dtype-aware tolerances, pytree by pytree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

# (rtol, atol) per dtype: fp32 tight, reduced precision looser.
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


def _as_tuple(out: Any) -> Any:
    return tuple(out) if isinstance(out, list) else out


def compare(
    expected: Any, actual: Any, tolerances: dict[torch.dtype, tuple[float, float]] | None = None
) -> Verdict:
    """Match structure, shapes, dtypes and values; NaN where eager has none is a mismatch."""
    tol = TOLERANCES | (tolerances or {})
    exp_leaves, exp_spec = pytree.tree_flatten(_as_tuple(expected))
    act_leaves, act_spec = pytree.tree_flatten(_as_tuple(actual))
    if exp_spec != act_spec:
        return Verdict(
            f"output structure differs: expected {len(exp_leaves)} output(s) "
            f"({exp_spec}), got {len(act_leaves)} ({act_spec})",
            None,
        )
    worst = 0.0
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
        exp_c, act_c = exp.detach().cpu(), act.detach().cpu()
        if not (exp_c.is_floating_point() or exp_c.is_complex()):
            if not torch.equal(exp_c, act_c):
                wrong = int((exp_c != act_c).sum())
                return Verdict(f"output {i}: {wrong} of {exp_c.numel()} values differ", None)
            continue
        new_nan = torch.isnan(act_c) & ~torch.isnan(exp_c)
        if new_nan.any():
            return Verdict(
                f"output {i}: {int(new_nan.sum())} NaN value(s) where eager has none", None
            )
        both = torch.isfinite(exp_c) & torch.isfinite(act_c)
        err = (
            float((exp_c[both].double() - act_c[both].double()).abs().max()) if both.any() else 0.0
        )
        worst = max(worst, err)
        rtol, atol = tol.get(exp.dtype, (0.0, 0.0))
        close = torch.isclose(act_c, exp_c, rtol=rtol, atol=atol, equal_nan=True)
        if not close.all():
            wrong = int((~close).sum())
            return Verdict(
                f"output {i}: {wrong} of {close.numel()} values not close, max abs err "
                f"{err:.3g} (rtol={rtol:g}, atol={atol:g})",
                worst,
            )
    return Verdict(None, worst)
