"""dynamic=True on real transformers models under inference_mode and no_grad (issue 31):
no hang (strict torch.export re-entering dynamo under its compile lock), no raise (inference
tensors keep no version counter), a compiled backend serves, and an abandoned compile
leaves dynamo's caches alone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import chain
from chain.bench import zoo
from chain.report.records import Status

pytestmark = pytest.mark.slow  # real transformers models, compiled by several backends
needs_transformers = pytest.mark.skipif(zoo.available() is not None, reason=str(zoo.available()))
CALL_TIMEOUT_S = 120  # a hang fails the test instead of stalling the suite

MODES: dict[str, Callable[[], Any]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
}


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()` on a daemon thread; fails the test if it has not returned in `seconds`."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised on the test's thread below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"no answer within {seconds} s: a hang")
    if "error" in box:
        raise box["error"]
    return box["value"]


def three_shapes(name: str, backend: Any, mode: str, **kw: Any) -> None:
    """The model compiled with dynamic=True, called at its three shapes in `mode` (each
    call on the test's thread's mode, as a server's), every output as eager's. Timing is
    not the question here: the chains run without the eager floor."""
    model = zoo.build(name)
    compiled = torch.compile(model, backend=backend, dynamic=True, **kw)

    def calls() -> None:
        with MODES[mode]():
            for shape in range(3):
                args = zoo.inputs(name, shape)
                torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)

    within(CALL_TIMEOUT_S, calls)


def served_by(c: chain.Chain) -> list[str | None]:
    return [g.winner for g in c.report.graphs]


def attempts(c: chain.Chain) -> list[tuple[str, str, str]]:
    return [(a.backend, a.status.value, a.reason) for g in c.report.graphs for a in g.attempts]


# pairwise, not the product (each case is a compile of a real model): every model meets
# both modes across the two tests below, and each test runs both modes.
@needs_transformers
@pytest.mark.parametrize(("name", "mode"), [("falcon", "inference_mode"), ("bloom", "no_grad")])
def test_the_default_chain_serves_dynamic_falcon_and_bloom(name: str, mode: str) -> None:
    """backend="chain" used to hang here: the ONNX exporter's strict fallback waited for
    dynamo's compile lock, held by the thread waiting for it."""
    three_shapes(name, "chain", mode, options={"eager_floor": False})
    last = chain.last_chain()
    assert last is not None
    assert "onnxruntime" in served_by(last), attempts(last)


@needs_transformers
@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("falcon", "no_grad"),
        ("bloom", "inference_mode"),
        ("phi", "inference_mode"),
        ("vit", "no_grad"),
    ],
)
def test_onnxruntime_serves_dynamic_graphs_and_is_never_demoted(name: str, mode: str) -> None:
    c = chain.chain("onnxruntime", "eager", eager_floor=False)
    three_shapes(name, c, mode)
    assert served_by(c) and set(served_by(c)) == {"onnxruntime"}, attempts(c)
    demoted = [a for g in c.report.graphs for a in g.attempts if a.status is Status.MISMATCH]
    assert demoted == [], demoted


@needs_transformers
def test_an_abandoned_export_leaves_dynamos_caches_alone() -> None:
    """compile_timeout_s abandons ONNX Runtime's export; once the export ends it must not
    wipe dynamo's caches (strict export's reset did): no graph compiles again, neither
    this model's nor an unrelated function's."""
    compiled_graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled_graphs.append(1)
        return gm.forward

    other = torch.compile(lambda x: torch.sin(x) + 1, backend=counting)
    x = torch.randn(4)
    other(x)
    c = chain.chain("onnxruntime", "eager", compile_timeout_s=0.5)
    model = zoo.build("falcon")
    compiled = torch.compile(model, backend=c, dynamic=True)
    args = zoo.inputs("falcon", 1)

    def call() -> Any:  # on the watchdog's thread: the mode is per thread
        with torch.inference_mode():
            return compiled(*args)

    for _ in range(3):
        within(CALL_TIMEOUT_S, call)
    graphs = len(c.report.graphs)
    first = c.report.graphs[0].attempts[0]
    assert first.status is Status.COMPILE_ERROR and "0.5" in first.reason, first
    with torch.inference_mode():
        want = model(*args)
    for _ in range(3):
        torch.testing.assert_close(within(CALL_TIMEOUT_S, call), want)
    other(x)
    assert len(c.report.graphs) == graphs  # no recompile of the model
    assert len(compiled_graphs) == 1  # nor of the unrelated function


class _RootScaled(torch.nn.Module):
    """Attention's scale by the square root of a dim: `math.sqrt` of a symbolic size, which
    dynamo records as `torch._sym_sqrt` under dynamic=True."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import math

        return x / math.sqrt(x.shape[-1])


def test_a_square_root_of_a_symbolic_size_is_exported() -> None:
    """The exporter has no `_sym_sqrt`: it went `unsupported` (Phi); now `size ** 0.5`."""
    c = chain.chain("onnxruntime", "eager", eager_floor=False)
    compiled = torch.compile(_RootScaled(), backend=c, dynamic=True)
    with torch.inference_mode():
        for n in (8, 12, 16):
            x = torch.randn(2, n)
            torch.testing.assert_close(compiled(x), _RootScaled()(x))
    assert served_by(c) == ["onnxruntime"], attempts(c)
