"""The error rule: a candidate passes when it is about as close to the float64 result as
eager is.

Fixed tolerances cannot tell rounding from a wrong answer in low precision: eager bf16 is
itself ~1e-2 away from the exact result, so a correct compiler fails `rtol=1.6e-2` on an
unlucky value while a wrong one may pass in fp32-sized tolerances. Instead, per floating
output, with the float64 run of the graph as the reference (`chain.judge.fp64`):

    error(candidate) <= MULTIPLE * error(eager) + FLOOR_ULPS * eps(dtype) * rms(reference)

where error is the RMSE against the reference over the values all three have finite. This
is dynamo's accuracy check (`same(ref, res, fp64_ref)`: RMSE, multiplier 2 in fp32 and 3 in
fp16/bf16, floor `tol / 10`), with a floor relative to the output's scale instead of an
absolute 1e-5, which for outputs of size ~1e-3 would let anything pass.

How MULTIPLE and FLOOR_ULPS were chosen (`python benchmarks/error_ratios.py --dtypes
fp32,bf16,fp16 --threads 1`, CPU, the tests' dropout/residual model, a transformers
BertModel, a transformer block and the suite's bert, gpt, vit, resnet and mlp, tiny sizes):
correct compilers sit at error/eager-error ratios of 0.57-1.47 in fp32 (inductor and
onnxruntime), 0.62-1.0 in bf16 (inductor; onnxruntime's CPU provider has no bf16 kernels
and declines) and 0.49-1.17 in fp16 (both). The fault backends of tests/faults.py sit at
2.2e4x or more in fp32, 7.8x or more in bf16 (`perturbed` at 8 ulp on the vit; dropped
residual and stale outputs 34x or more) and 14x or more in fp16. 3x (dynamo's
low-precision multiplier, here for every dtype) leaves 2x room above the worst correct
result and 2.6x below the mildest wrong one. The floor is one unit in the last place of
the output's dtype at the output's RMS scale, about 3.5x the error of merely rounding the
exact result to that dtype: outputs eager computes exactly (copies, lookups) still admit
a candidate that rounds once differently, and it is far below every fault measured.

Outputs that reduce over many values (`x.sum()` over a million) get a floor that grows with
the reduction length n: FLOOR_ULPS * eps * rms(reference) * sqrt(n). A sum of n terms of
random sign has |sum| ~ sqrt(n) * |term|, and a summation order other than eager's (ONNX
Runtime's blocked sum against ATen's vectorized pairwise one) has rounding error up to
~ eps * n * |term| = eps * sqrt(n) * |sum|; eager's own error there can be near zero by
luck, so the multiple of it alone rejects a correct compiler (measured: ONNX Runtime on
the sum of 1e6 float32 randn values, seeds 0-2, errors 5x-60x eager's, 0.01-0.1 of the
scaled floor; leaving out 1000 of the values is 200x the floor). n comes from the graph
(`reduction_lengths`): an output produced by a reduction op (sum, mean, ..., through views,
dtype casts and arithmetic no larger than the reduction: `arange(n).sum() + x.sum()`, where
ONNX Runtime on 30 values failed 3 seeds in 40 at 5.5x-37x eager's error before) reduces
over its input's numel / its own; any other output has n = 1, so the floor of everything
else is unchanged. Matmuls are not counted: their reductions are
short next to a sum over a whole tensor and eager's error on them is of the same kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from backends.common.fx_utils import bare_op_name

MULTIPLE = 3.0
FLOOR_ULPS = 1.0


@dataclass(frozen=True)
class OutputError:
    """One floating output: the candidate's and eager's RMSE against float64, and the limit."""

    index: int
    error: float
    eager_error: float
    allowed: float
    against: str = "float64"  # "eager": a remembered winner's quick check (`near_eager`)

    @property
    def passed(self) -> bool:
        return self.error <= self.allowed

    @property
    def ratio(self) -> float | None:
        """Candidate's error over eager's (None when eager is exact)."""
        return self.error / self.eager_error if self.eager_error > 0 else None

    @property
    def severity(self) -> float:
        """How much of its allowance the candidate used (> 1: fails)."""
        return self.error / self.allowed if self.allowed > 0 else float(self.error > 0) * 1e30

    def reason(self) -> str:
        if self.against == "eager":
            return (
                f"output {self.index}: RMSE vs eager {self.error:.3g} above the bound from "
                f"eager's recorded error {self.eager_error:.3g} (allowed {self.allowed:.3g})"
            )
        ratio = f"{self.ratio:.3g}x" if self.ratio is not None else "above"
        return (
            f"output {self.index}: RMSE vs float64 {self.error:.3g} is {ratio} eager's "
            f"{self.eager_error:.3g} (allowed {MULTIPLE:g}x eager + floor = {self.allowed:.3g})"
        )


def _rmse(ref: torch.Tensor, x: torch.Tensor) -> float:
    return float((ref - x).square().mean().sqrt()) if ref.numel() else 0.0


def output_error(
    index: int,
    reference: torch.Tensor,
    eager: torch.Tensor,
    candidate: torch.Tensor,
    multiple: float = MULTIPLE,
    floor_ulps: float = FLOOR_ULPS,
    reduced: int = 1,
) -> OutputError:
    """Errors of `eager` and `candidate` (same dtype) against the float64 `reference`;
    `reduced`: how many values each output value sums over (the floor grows as its sqrt)."""
    ref = reference.detach().cpu().to(torch.float64)
    eag = eager.detach().cpu().to(torch.float64)
    cand = candidate.detach().cpu().to(torch.float64)
    finite = torch.isfinite(ref) & torch.isfinite(eag) & torch.isfinite(cand)
    if not bool(finite.all()):  # indexing copies: only when something is to be left out
        ref, eag, cand = ref[finite], eag[finite], cand[finite]
    info = torch.finfo(eager.dtype)
    scale = float(ref.square().mean().sqrt()) if ref.numel() else 0.0
    eager_error = _rmse(ref, eag)
    floor = floor_ulps * info.eps * scale * math.sqrt(max(1, reduced))
    allowed = multiple * eager_error + floor + info.tiny
    return OutputError(index, _rmse(ref, cand), eager_error, allowed)


def relative_error(reference: torch.Tensor, eager: torch.Tensor) -> float | None:
    """Eager's RMSE against the float64 `reference`, over the reference's RMS: what a
    decision records per output (None when it cannot be told: no finite value, zero scale)."""
    ref = reference.detach().cpu().to(torch.float64)
    eag = eager.detach().cpu().to(torch.float64)
    finite = torch.isfinite(ref) & torch.isfinite(eag)
    if not bool(finite.all()):
        ref, eag = ref[finite], eag[finite]
    scale = float(ref.square().mean().sqrt()) if ref.numel() else 0.0
    error = _rmse(ref, eag) / scale if scale > 0 else None
    return error if error is not None and math.isfinite(error) else None


def relative_errors(fp64: Any, eager: Any) -> list[float | None]:
    """Per flattened output: eager's relative error against float64 (None: not floating)."""
    wrap = lambda out: tuple(out) if isinstance(out, list) else out  # noqa: E731
    refs, eagers = pytree.tree_leaves(wrap(fp64)), pytree.tree_leaves(wrap(eager))
    return [
        relative_error(r, e)
        if isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) and e.is_floating_point()
        else None
        for r, e in zip(refs, eagers, strict=True)
    ]


def near_eager(
    index: int,
    eager: torch.Tensor,
    candidate: torch.Tensor,
    eager_relative: float,
    multiple: float = MULTIPLE,
    floor_ulps: float = FLOOR_ULPS,
    reduced: int = 1,
) -> OutputError:
    """A remembered winner's check without a float64 run: its distance from eager against
    (multiple - 1) x eager's error, estimated from the `eager_relative` error the decision
    recorded, + the floor. By the triangle inequality, error(candidate) <= distance +
    error(eager), so within this bound the float64 rule holds whenever eager's error now is
    at least what was recorded; see README "Remembered decisions" for the margin."""
    norms = _norms(eager, candidate)
    if norms is None:  # a value not finite: left out, in float64 on the CPU
        eag = eager.detach().cpu().to(torch.float64)
        cand = candidate.detach().cpu().to(torch.float64)
        finite = torch.isfinite(eag) & torch.isfinite(cand)
        eag, cand = eag[finite], cand[finite]
        norms = _rmse(eag, cand), float(eag.square().mean().sqrt()) if eag.numel() else 0.0
    distance, scale = norms
    info = torch.finfo(eager.dtype)
    eager_error = eager_relative * scale
    floor = floor_ulps * info.eps * scale * math.sqrt(max(1, reduced))
    allowed = (multiple - 1) * eager_error + floor + info.tiny
    return OutputError(index, distance, eager_error, allowed, against="eager")


def _norms(eager: torch.Tensor, candidate: torch.Tensor) -> tuple[float, float] | None:
    """The RMS of `candidate - eager` and of `eager`, summed in float64 on their device from
    one difference in float32 (exact where they are close); None where a value is not
    finite. The run-time check of a GPT-2's logits (64 x 50257, 1 thread): 148 ms in
    float64 copies on the CPU, against about 20 here."""
    eag, cand = eager.detach(), candidate.detach().to(eager.device)
    if eag.dtype != torch.float64:
        eag, cand = eag.float(), cand.float()
    if not eag.numel():
        return 0.0, 0.0
    root = math.sqrt(eag.numel())
    distance = float(torch.linalg.vector_norm(cand - eag, dtype=torch.float64)) / root
    scale = float(torch.linalg.vector_norm(eag, dtype=torch.float64)) / root
    return (distance, scale) if math.isfinite(distance) and math.isfinite(scale) else None


# ops whose output value sums (or averages, or accumulates) many input values
REDUCTIONS = frozenset(
    {"sum", "mean", "nansum", "nanmean", "cumsum", "logsumexp", "norm", "linalg_vector_norm",
     "var", "std", "var_mean", "std_mean", "prod", "cumprod", "trace"}
)  # fmt: skip
# ops that keep values as they are (views, copies, casts): looked through to a reduction
_PASSING = frozenset(
    {"view", "reshape", "squeeze", "unsqueeze", "flatten", "contiguous", "clone", "to",
     "float", "double", "half", "bfloat16", "type_as", "expand", "permute", "transpose",
     "detach", "alias", "_to_copy"}
)  # fmt: skip
# elementwise arithmetic: looked through where an operand is as large as the result
_ARITHMETIC = frozenset(
    {"add", "sub", "mul", "div", "truediv", "neg", "rsub", "radd", "rmul", "iadd", "isub",
     "imul", "itruediv"}
)  # fmt: skip


def _numel(node: object) -> int | None:
    """The number of elements of a node's traced value, with symbolic sizes at their hints."""
    value = (
        node.meta.get("example_value", node.meta.get("val")) if isinstance(node, fx.Node) else None
    )
    if not isinstance(value, torch.Tensor):
        return None
    n = value.numel()
    if isinstance(n, torch.SymInt):
        return int(n.node.hint) if n.node.has_hint() else None
    return int(n)


def reduction_length(node: object, depth: int = 0) -> int:
    """How many input values each value of `node`'s output sums over (1: not a reduction).
    Views and casts are looked through; so is arithmetic whose result is no larger than
    the reduction it takes (`x.sum() * 2 + y.sum()`: the sums' rounding is the output's),
    never a reduction broadcast over a larger tensor (`x - x.mean(-1, keepdim=True)`: its
    rounding is small next to the output's scale, and the floor stays an ulp)."""
    if not (isinstance(node, fx.Node) and node.op in ("call_function", "call_method")):
        return 1
    if depth >= 8:
        return 1
    name = bare_op_name(node).removesuffix("_")
    sources = [a for a in node.args if isinstance(a, fx.Node)]
    if name in REDUCTIONS and sources:
        n_in, n_out = _numel(sources[0]), _numel(node)
        return max(1, n_in // max(1, n_out)) if n_in is not None and n_out is not None else 1
    if name in _PASSING and sources:
        return reduction_length(sources[0], depth + 1)
    if name in _ARITHMETIC:
        size = _numel(node)
        return max(
            (
                reduction_length(a, depth + 1)
                for a in sources
                if size is not None and _numel(a) == size
            ),
            default=1,
        )
    return 1


def reduction_lengths(gm: fx.GraphModule) -> tuple[int, ...]:
    """Per output of the graph (flattened as the chain compares them): its reduction length."""
    outputs = gm.graph.find_nodes(op="output")
    if not outputs:
        return ()
    return tuple(reduction_length(leaf) for leaf in pytree.tree_leaves(outputs[0].args[0]))
