"""Export judges its compiled parts by selection's accuracy rule (issue 31): error against
float64 within a multiple of eager's own, not a fixed tolerance that rejected a part the
chain's verification had passed ("1 of 262144 values not close")."""

from __future__ import annotations

import torch
from torch import fx, nn

from backends.onnxruntime.deploy import onnx_header
from backends.onnxruntime.partition import export_part
from chain.deploy import ops
from chain.deploy.exporter import verify
from chain.judge.verify import compare


class LongSums(nn.Module):
    """Long reductions: float32 error of a few 1e-3 whatever sums them (eager included)."""

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.cumsum(x, dim=-1) @ w,)


def _part() -> object:
    torch.manual_seed(0)
    block = fx.symbolic_trace(LongSums())
    x, w = torch.randn(64, 4096), torch.randn(4096, 64)
    return export_part("part", block, (x, w), block(x, w), onnx_header)


def test_a_part_as_accurate_as_eager_passes_where_fixed_tolerances_fail() -> None:
    part = _part()
    runner = ops.preload(part.header, part.body, torch.device("cpu"))
    fixed = compare(tuple(part.expected), tuple(runner(part.inputs)), layout=False)
    assert fixed.reason is not None and "not close" in fixed.reason  # the old check
    assert verify(part) is None


def test_a_part_off_by_more_than_eagers_error_fails_the_rule(monkeypatch: object) -> None:
    part = _part()
    real = ops.preload

    def off(*args: object) -> object:  # the payload's runner, its answers moved by 0.05
        runner = real(*args)
        return lambda inputs: [o + 0.05 for o in runner(inputs)]

    monkeypatch.setattr(ops, "preload", off)  # type: ignore[attr-defined]
    reason = verify(part)
    assert reason is not None and "output 0" in reason, reason
