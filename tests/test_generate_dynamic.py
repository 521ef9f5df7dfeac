"""generate() of small GPT-2 and Llama models compiled with dynamic=True (issue 47): the
decode graphs (one token against a growing KV cache) are served by ONNX Runtime, not eager,
and the tokens are eager's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import chain
from chain.bench import causal_lm
from chain.report.records import GraphRecord, Status
from tests.test_dynamic_real import CALL_TIMEOUT_S, MODES, within

needs_transformers = pytest.mark.skipif(
    causal_lm.available() is not None, reason=str(causal_lm.available())
)
NEW_TOKENS = 8


def decodes(record: GraphRecord) -> bool:
    """A decode graph: it reads the KV cache (4-d tensors: batch, heads, positions, dim)."""
    return any(len(spec.get("shape", ())) == 4 for spec in record.inputs)


def generated(model: torch.nn.Module, ids: torch.Tensor, mode: str) -> torch.Tensor:
    with MODES[mode]():
        return model.generate(ids, **causal_lm.greedy(NEW_TOKENS))


@needs_transformers
@pytest.mark.parametrize(
    ("name", "batch", "mode"),
    [
        ("gpt2", 1, "inference_mode"),
        ("gpt2", 2, "no_grad"),
        ("llama", 2, "inference_mode"),
        ("llama", 1, "no_grad"),
    ],
)
def test_generate_under_dynamic_keeps_onnxruntime(name: str, batch: int, mode: str) -> None:
    """Each decode graph used to be `unsupported` ("dynamic int input 1 is not the size of
    any tensor input": transformers' `logits_to_keep`), so eager served the whole loop."""
    model = causal_lm.build(name)
    ids = causal_lm.prompt(batch)
    expected = generated(model, ids, mode)
    backend = chain.chain("onnxruntime", "eager", measure=False)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend=backend, dynamic=True)
    got: Callable[[], Any] = lambda: generated(model, ids, mode)  # noqa: E731
    tokens = within(CALL_TIMEOUT_S, got)
    assert torch.equal(tokens, expected)
    assert tokens.shape == (batch, ids.shape[1] + NEW_TOKENS)
    graphs = backend.report.graphs
    decode = [g for g in graphs if decodes(g)]
    assert decode, [g.inputs for g in graphs]
    for record in graphs:
        (ort,) = [a for a in record.attempts if a.backend == "onnxruntime"]
        assert ort.status is Status.WON, (ort.status, ort.reason)
    # one decode graph for every cache length: dynamic=True did its job
    assert len(decode) == 1
