"""The chain's exports on a worker thread leave the user's other threads alone: a compiled
model called meanwhile neither raises nor sees `torch.compiler.is_exporting()`."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from backends import cancel
from chain import chain
from chain.bench import zoo

pytest.importorskip("transformers")


def _calls_while(work: Any, model: torch.nn.Module, x: torch.Tensor) -> tuple[int, list[str]]:
    """Call `model` compiled (backend eager) on a second thread, under inference_mode, for as
    long as `work()` runs here; the number of calls whose output matched eager, and the errors."""
    compiled = torch.compile(model, backend="eager")
    with torch.inference_mode():
        expected = model(x)
        compiled(x)
    stop, matched, errors = threading.Event(), [0], []

    def caller() -> None:
        with torch.inference_mode():
            while not stop.is_set():
                try:
                    out = compiled(x)
                except Exception as e:  # the failure under test: recorded, then asserted
                    errors.append(f"{type(e).__name__}: {e}")
                    continue
                matched[0] += int(torch.equal(out, expected))

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        work()
    finally:
        stop.set()
        thread.join()
    return matched[0], errors


def test_a_compiled_model_called_during_an_export_on_another_thread_does_not_raise() -> None:
    """Decompositions re-bind FX's process-wide node metadata; dynamo's wrapper of each
    compiled graph edited it whenever torch's process-wide "exporting" flag was up
    (`KeyError: 'custom'` in the user's call: dozens per export before the fix)."""
    model, x = zoo.build("bert"), zoo.inputs("bert", 1)[0]
    export_errors: list[str] = []
    program_model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(20)]).eval()

    def exporting_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        """Exports on a worker thread while dynamo's compile lock is held, as the chain's
        candidates do."""

        def export() -> None:
            try:
                for _ in range(3):
                    with cancel.process_wide():
                        program = torch.export.export(
                            program_model, (torch.randn(2, 16),), strict=False
                        )
                        program.run_decompositions()
            except Exception as e:  # the exporter's side of the race: asserted below
                export_errors.append(f"{type(e).__name__}: {e}")

        worker = threading.Thread(target=export)
        worker.start()
        worker.join()
        return gm.forward

    def compile_one() -> None:
        torch.compile(lambda t: t * 2, backend=exporting_backend)(torch.randn(3))

    matched, errors = _calls_while(compile_one, model, x)
    assert errors == []
    assert export_errors == []
    assert matched > 0


def test_is_exporting_is_true_only_on_the_exporting_thread() -> None:
    seen: dict[str, bool] = {}
    inside, release = threading.Event(), threading.Event()

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen["exporter"] = torch.compiler.is_exporting()
            inside.set()
            release.wait(30)
            return x + 1

    def export() -> None:
        with cancel.process_wide():
            torch.export.export(Probe(), (torch.randn(2),), strict=False)

    thread = threading.Thread(target=export)
    thread.start()
    assert inside.wait(30)
    seen["other"] = torch.compiler.is_exporting()
    release.set()
    thread.join()
    assert seen == {"exporter": True, "other": False}
    assert torch.compiler.is_exporting() is False


def test_threads_calling_a_chain_compiled_model_while_it_selects() -> None:
    """Four threads call one model compiled through ONNX Runtime and eager, at three shapes,
    under inference_mode: every call answers eager's values, none raises. (dynamic=None:
    the default, where a thread's call raised `KeyError: 'custom'` while another's graph
    exported; dynamic=True ran clean before the fix too.)"""
    model = zoo.build("gpt2")
    compiled = torch.compile(model, backend=chain("onnxruntime", "eager", memory=False))
    results: list[bool] = []
    errors: list[str] = []

    def work() -> None:
        for shape in (0, 1, 2, 1):
            (x,) = zoo.inputs("gpt2", shape)
            try:
                with torch.inference_mode():
                    out, expected = compiled(x), model(x)
            except Exception as e:  # the failure under test: recorded, then asserted
                errors.append(f"{type(e).__name__}: {e}")
                continue
            results.append(torch.allclose(out, expected, rtol=1e-4, atol=1e-4))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [True] * 16


def test_dynamo_folds_is_exporting_to_a_constant_in_one_graph() -> None:
    """Model code that asks `is_exporting()` (transformers does) compiles to one graph taking
    the not-exporting branch: before, during (on another thread) and after a chain export."""
    from torch._dynamo.testing import CompileCounter

    def forward(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if torch.compiler.is_exporting() else x - 1

    def compiles_to_one_graph() -> None:
        torch._dynamo.reset()
        counter = CompileCounter()
        x = torch.randn(3)
        assert torch.equal(torch.compile(forward, backend=counter)(x), x - 1)
        assert (counter.frame_count, counter.op_count) == (1, 1)

    inside, release = threading.Event(), threading.Event()

    class Held(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            inside.set()
            release.wait(30)
            return x * 2

    def export() -> None:
        with cancel.process_wide():
            torch.export.export(Held(), (torch.randn(2),), strict=False)

    compiles_to_one_graph()
    thread = threading.Thread(target=export)
    thread.start()
    try:
        assert inside.wait(30)
        compiles_to_one_graph()
    finally:
        release.set()
        thread.join()
    compiles_to_one_graph()
