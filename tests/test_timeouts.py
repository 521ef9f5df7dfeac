"""compile_timeout_s: what the chain abandons cannot crash the process or change its state,
and the timeout covers a candidate's compile, first run and timing."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx

from backends.common.onnx_export import export_onnx
from chain import chain
from chain.report.records import Status
from tests.models import build, build_extra

ROOT = Path(__file__).resolve().parents[1]
HANG_S = 30.0  # a hung call gives up after this (on code without the timeout: a bounded test)

# The repro: ONNX Runtime under a 0.5 s timeout on a BertModel whose export takes
# longer, called at three lengths, then more dynamo compiles while the abandoned exports run.
REPRO = textwrap.dedent(
    """
    import sys, time
    import torch
    from chain import chain
    from tests.models import build_extra

    torch._dynamo.config.recompile_limit = 10**6  # the loop below keeps dynamo compiling
    model, (ids,) = build_extra("bert")
    backend = chain("onnxruntime", "eager", compile_timeout_s=0.5)
    fast = torch.compile(model, backend=backend)
    with torch.no_grad():
        for n in (8, 11, 13):
            x = ids[:, :1].repeat(1, n)
            got, want = fast(x).last_hidden_state, model(x).last_hidden_state
            assert torch.allclose(got, want, atol=1e-5), n
        end = time.perf_counter() + 2.0
        k = 0
        while time.perf_counter() < end:  # other models compiled meanwhile
            k += 1
            torch.compile(torch.nn.Linear(4, k), backend="eager")(torch.randn(2, 4))
    statuses = sorted({a.status.value for g in backend.report.graphs for a in g.attempts})
    print("statuses", statuses, file=sys.__stdout__)
    print("redirected", sys.stdout is not sys.__stdout__ or sys.stderr is not sys.__stderr__,
          file=sys.__stdout__)
    """
)


@pytest.mark.slow
def test_abandoned_exports_never_crash_or_redirect_the_process() -> None:
    """Fails on the code before, in 4 runs of 4: rc 134 (FX "symbolically trace a
    dynamo-optimized function"), a KeyError from FX metadata, or sys.stdout left
    redirected. Three processes at once (each spends most of its time in dynamo)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REPRO],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outcomes = []
    for proc in procs:
        out, err = proc.communicate(timeout=400)
        outcomes.append((proc.returncode, out, err[-2000:]))
    failed = [o for o in outcomes if o[0] != 0 or "redirected False" not in o[1]]
    assert not failed, failed
    for _, out, _ in outcomes:
        assert "'won'" in out and "'compile_error'" in out, out


class Hangs:
    """A backend whose compiled callable is right except on the calls in `hang_on`, where it
    waits (until released, or HANG_S) and then raises."""

    def __init__(self, hang_on: Callable[[int], bool]) -> None:
        self.hang_on = hang_on
        self.calls = 0
        self.release = threading.Event()
        self.__name__ = "hangs"

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            self.calls += 1
            if self.hang_on(self.calls):
                self.release.wait(HANG_S)
                raise RuntimeError("hung, then gave up")
            return gm(*args)

        return run


@pytest.fixture
def released() -> Iterator[list[Hangs]]:
    """Backends to release at teardown: abandoned threads end with the test."""
    made: list[Hangs] = []
    yield made
    for backend in made:
        backend.release.set()


def _run_twice(backend: Any) -> list[tuple[Any, Any]]:
    """A small transformers model at two lengths through `backend`: (got, want) pairs."""
    model, (ids,) = build_extra("bert")
    fast = torch.compile(model, backend=backend)
    pairs = []
    with torch.no_grad():
        for n in (8, 12):
            x = ids[:, :1].repeat(1, n)
            pairs.append((fast(x).last_hidden_state, model(x).last_hidden_state))
    return pairs


def test_hang_in_first_run_is_abandoned(released: list[Hangs]) -> None:
    """Before: the model call waited out the hang (HANG_S per graph) and recorded
    a RuntimeError, not a timeout."""
    hangs = Hangs(lambda call: True)
    released.append(hangs)
    backend = chain(hangs, "eager", compile_timeout_s=0.5)
    for got, want in _run_twice(backend):
        torch.testing.assert_close(got, want)
    assert backend.report.graphs
    for graph in backend.report.graphs:
        first = graph.attempts[0]
        assert (first.status, first.error_type) == (Status.RUNTIME_ERROR, "RunTimeout")
        assert "no result after 0.5s in its first run (compile_timeout_s)" in first.reason
        assert "abandoned" in first.reason
        assert graph.winner == "eager"


def test_hang_while_timed_is_abandoned(released: list[Hangs]) -> None:
    """Right on its first run (verified), hangs on its second call (timing): before, timing
    waited HANG_S and recorded a RuntimeError."""
    hangs = Hangs(lambda call: call == 2)
    released.append(hangs)
    backend = chain(hangs, "eager", compile_timeout_s=0.5)
    model, args = build("mlp")
    with torch.no_grad():
        got = torch.compile(model, backend=backend)(*args)
        torch.testing.assert_close(got, model(*args))
    first = backend.report.graphs[0].attempts[0]
    assert (first.status, first.error_type) == (Status.RUNTIME_ERROR, "RunTimeout")
    assert first.reason.startswith("while timed: RunTimeout: no result after 0.5s")
    assert backend.report.graphs[0].winner == "eager"


def test_abandoned_compile_stops_at_its_checkpoint_and_tracing_ends_first() -> None:
    """A compile abandoned inside a process-wide section (as torch.export is): the chain
    returns only after that section ends, and the worker starts nothing after it."""
    from backends import cancel  # imported here: the tests above run without it

    went_on = threading.Event()

    def traces_slowly(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        with cancel.process_wide():  # stands for torch.export patching torch meanwhile
            threading.Event().wait(1.5)
        cancel.checkpoint()  # abandoned by now: raises Cancelled
        went_on.set()
        return gm.forward

    traces_slowly.__name__ = "traces_slowly"
    backend = chain(traces_slowly, "eager", compile_timeout_s=0.5)
    model, args = build("mlp")
    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
    assert cancel.settle(0.0)  # no section in flight once the model call returned
    first = backend.report.graphs[0].attempts[0]
    assert first.error_type == "CompileTimeout"
    assert "waited" in first.reason and "torch.export trace" in first.reason
    threading.Event().wait(0.5)
    assert not went_on.is_set()


def test_cancelled_work_enters_no_process_wide_section() -> None:
    from backends import cancel

    token = cancel.Token()
    token.cancel("abandoned by test")
    with (
        cancel.holding(token),
        pytest.raises(cancel.Cancelled, match="abandoned by test"),
        cancel.process_wide(),
    ):
        pytest.fail("entered")
    with cancel.holding(None), cancel.process_wide():
        pass  # work nobody abandoned enters


def test_quiet_export_leaves_process_state_alone() -> None:
    """Before: sys.stdout/sys.stderr were redirected and warnings state swapped for every
    thread while another thread exported."""
    model, args = build("transformer")
    gm = fx.symbolic_trace(model)
    streams = (sys.stdout, sys.stderr)
    seen: set[tuple[Any, ...]] = set()
    logger = logging.getLogger("torch.onnx")
    done = threading.Event()
    errors: list[BaseException] = []

    def export() -> None:
        try:
            export_onnx(gm, list(args))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=export)
    thread.start()
    while not done.wait(0.001):
        seen.add((sys.stdout, sys.stderr, warnings.showwarning, logger.level))
    thread.join()
    assert not errors, errors
    assert seen <= {(*streams, warnings.showwarning, logger.level)}
    assert (sys.stdout, sys.stderr) == streams


INTERRUPTED = textwrap.dedent(
    """
    import os, signal, threading
    import torch
    from chain import chain
    from tests.models import build

    release = threading.Event()
    def hangs(gm, example_inputs):
        def run(*args):
            release.wait(60)
            return gm(*args)
        return run

    model, args = build("mlp")
    backend = chain(hangs, "eager", compile_timeout_s=30)
    # Python's own handler, whatever the parent left: a shell starting a job in the
    # background ignores SIGINT, and Python then raises no KeyboardInterrupt for it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        with torch.no_grad():
            torch.compile(model, backend=backend)(*args)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    """
)


def test_keyboard_interrupt_while_waiting_propagates() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "interrupted" in proc.stdout, proc.stdout + proc.stderr[-2000:]


STALL_S = 0.15  # every call of the graph below takes at least this long in eager


@torch.library.custom_op("chain_test::stall", mutates_args=())
def stall(x: torch.Tensor) -> torch.Tensor:
    """x, after a pause: stands for an eager run slowed by a loaded machine (another
    process on the cores, or an abandoned export's thread holding the GIL)."""
    threading.Event().wait(STALL_S)
    return x.clone()


@stall.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class SlowBert(torch.nn.Module):
    """A BertModel whose every eager call takes over STALL_S."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = build_extra("bert")[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return stall(self.bert(ids).last_hidden_state)


def test_eager_slower_than_the_timeout_still_answers() -> None:
    """Eager is the floor: its own calls (its first run, the timed reference) have no
    deadline. Before: eager's first run, or one timed call of the eager reference, that
    overran compile_timeout_s failed the graph: AllCandidatesFailed or RunTimeout out of the
    backend, BackendCompilerFailed from dynamo (the 1-in-12 crash of the test above, on a
    loaded machine where eager's 1 ms call of the tiny BertModel took up to 0.6 s)."""
    from tests import faults

    model = SlowBert().eval()
    ids = build_extra("bert")[1][0]
    backend = chain(faults.raises_at_compile, "eager", compile_timeout_s=STALL_S / 3)
    fast = torch.compile(model, backend=backend)
    with torch.no_grad():
        for n in (8, 12):
            x = ids[:, :1].repeat(1, n)
            torch.testing.assert_close(fast(x), model(x))
    assert len(backend.report.graphs) == 2
    for graph in backend.report.graphs:
        assert graph.winner == "eager", graph.attempts
        eager = graph.winning_attempt
        assert eager.latency_ms is not None and eager.latency_ms >= STALL_S * 1000 * 0.9


def test_a_stage_leaves_the_callers_shape_env_to_the_caller() -> None:
    """A stage runs under the caller's TracingContext. Before: leaving it on the worker ran
    torch's `tracing()` exit, `shape_env.cleanup()`, on the caller's live ShapeEnv (from an
    abandoned worker: whenever it ended, while the caller's compile went on with it)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from chain.select.worker import CompileTimeout, within

    shape_env = ShapeEnv()
    fake = FakeTensorMode(shape_env=shape_env)
    sym = shape_env.create_unbacked_symint()
    assert sym.node.expr in shape_env.var_to_stack
    context = TracingContext(fake)
    seen: list[TracingContext | None] = []
    with tracing(context):
        got = within(
            lambda: seen.append(TracingContext.try_get()) or 7, 5.0, CompileTimeout, "in a test"
        )
        assert got == 7 and seen == [context]
        assert TracingContext.try_get() is context
        assert shape_env.var_to_stack[sym.node.expr].tb is not None  # still the caller's
