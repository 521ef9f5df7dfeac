"""The loaded program's per-call path: the op's kernel is dispatched without Python
wrappers, and a loaded program is right from several threads at once."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

import chain
from chain.deploy import LeanModule, ops
from tests.models import build_extra

OP = torch.ops.backend_chain.run_payload.default


def _loaded(tmp_path: Path, ids: torch.Tensor) -> tuple[torch.nn.Module, Any, Any]:
    """A tiny transformers BERT exported at `ids`' shape, saved, loaded with chain.load."""
    model, _ = build_extra("bert")
    backend = chain.chain("onnxruntime", "eager", measure=False)
    result = chain.export(model, (ids,), backend=backend)
    path = tmp_path / f"bert_{'x'.join(map(str, ids.shape))}.pt2"
    torch.export.save(result.program, path)
    program = chain.load(path)
    assert sum(n.target is OP for n in program.graph.nodes) == 1  # one whole-model ORT part
    return model, program, program.module()


def _stack_files(frame: Any) -> list[str]:
    files = []
    while frame is not None:
        files.append(frame.f_code.co_filename)
        frame = frame.f_back
    return files


def test_op_kernel_is_called_without_python_wrappers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.library.custom_op wraps each call in its autograd function and an aliasing
    # check (Python, 13 us of the op's 18 us dispatch: benchmarks/export_overhead.py);
    # the deploy path's op is dispatched straight to its kernel (the graph path: a program
    # that is one payload call skips the op for plain inputs, `test_deploy_direct.py`)
    ids = torch.randint(0, 100, (2, 8))
    _, program, _ = _loaded(tmp_path, ids)
    module = LeanModule(program, direct=False)
    stacks: list[list[str]] = []
    real = ops.runner_for

    def spy(*args: Any, **kwargs: Any) -> Any:
        stacks.append(_stack_files(sys._getframe(1)))
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "runner_for", spy)
    with torch.no_grad():
        module(ids)
    module(ids)  # grad mode too
    assert len(stacks) == 2
    for stack in stacks:
        wrappers = [f for f in stack if f"torch{'/'}_library" in f.replace("\\", "/")]
        assert wrappers == [], wrappers


def test_loaded_program_is_right_from_threads_at_two_shapes(tmp_path: Path) -> None:
    for shape in ((2, 8), (3, 5)):
        ids = torch.randint(0, 100, shape)
        model, _, module = _loaded(tmp_path, ids)
        inputs = [torch.randint(0, 100, shape) for _ in range(4)]
        with torch.no_grad():
            expected = [pytree.tree_leaves(model(x)) for x in inputs]

            def call(k: int, module: Any = module, inputs: Any = inputs) -> list[Any]:
                return pytree.tree_leaves(module(inputs[k % 4]))

            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(call, range(16)))
        for k, leaves in enumerate(got):
            assert len(leaves) == len(expected[k % 4])
            for a, e in zip(leaves, expected[k % 4], strict=True):
                assert a.shape == e.shape and a.dtype == e.dtype
                assert torch.allclose(a, e, rtol=1e-4, atol=1e-5), (shape, k)


def test_outputs_do_not_alias_inputs_or_each_other(tmp_path: Path) -> None:
    ids = torch.randint(0, 100, (2, 8))
    _, _, module = _loaded(tmp_path, ids)
    with torch.no_grad():
        first = pytree.tree_leaves(module(ids))
        second = pytree.tree_leaves(module(ids))
    pointers = [t.untyped_storage().data_ptr() for t in first + second]
    assert ids.untyped_storage().data_ptr() not in pointers
    assert len(set(pointers)) == len(pointers)  # each call's outputs are its own memory


def test_input_that_requires_grad_runs_and_backward_is_refused(tmp_path: Path) -> None:
    # an activation from a trainable model upstream: inference still runs, with eager's values
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model.eval()
    backend = chain.chain("onnxruntime", "eager", measure=False)
    for shape in ((2, 8), (5, 8)):
        x = torch.randn(shape)
        result = chain.export(model, (x,), backend=backend)
        path = tmp_path / f"mlp_{shape[0]}.pt2"
        torch.export.save(result.program, path)
        module = chain.load(path).module()
        leaf = x.clone().requires_grad_()
        out = module(leaf)
        assert torch.allclose(out.detach(), model(x).detach(), rtol=1e-4, atol=1e-5)
        assert out.requires_grad  # and backward says plainly that there is no gradient
        with pytest.raises(RuntimeError, match="run_payload has no gradient"):
            out.sum().backward()
