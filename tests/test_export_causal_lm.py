"""`chain.export` of GPT-2 and Llama causal LM heads with `use_cache=False` as a keyword
(issue 47): the ONNX Runtime winner is exported (its input list held the unread keyword,
which read as a derived size), the program loads in a fresh process and answers as eager;
a winner not exported says why in the note."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import chain
from chain.bench import causal_lm
from chain.deploy.capture import CaptureError
from tests.helpers import fresh_process
from tests.models import build_extra

needs_transformers = pytest.mark.skipif(
    causal_lm.available() is not None, reason=str(causal_lm.available())
)

FRESH = """
import json, sys
import torch
import chain

folder, facts = sys.argv[1], {}
for name in sys.argv[2:]:
    ids = torch.load(f"{folder}/{name}.in", weights_only=True)
    program = chain.load(f"{folder}/{name}.pt2")
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    with torch.no_grad():
        out = program.module()(ids, use_cache=False)
    torch.save(out.logits, f"{folder}/{name}.out")
    facts[name] = {"payload_calls": sum("run_payload" in t for t in targets)}
print(json.dumps(facts))
"""


@needs_transformers
def test_keyword_export_loads_elsewhere_with_an_onnxruntime_part(tmp_path: Path) -> None:
    expected, notes, parts = {}, {}, {}
    for name in causal_lm.MODELS:
        model = causal_lm.build(name)
        ids = causal_lm.prompt(2, 8, seed=1)
        backend = chain.chain("onnxruntime", "eager", measure=False)
        result = chain.export(model, (ids,), {"use_cache": False}, backend=backend)
        notes[name], parts[name] = result.notes, result.parts
        torch.export.save(result.program, tmp_path / f"{name}.pt2")
        torch.save(ids, tmp_path / f"{name}.in")
        with torch.no_grad():
            expected[name] = model(ids, use_cache=False).logits
    facts = fresh_process(FRESH, str(tmp_path), *causal_lm.MODELS)
    for name in causal_lm.MODELS:
        assert "export: the whole graph as one ONNX Runtime model" in notes[name], notes[name]
        assert [p["backend"] for p in parts[name]] == ["onnxruntime"]
        assert facts[name]["payload_calls"] == 1
        got = torch.load(tmp_path / f"{name}.out", weights_only=True)
        torch.testing.assert_close(got, expected[name], rtol=1e-4, atol=1e-4)


def test_a_declined_winner_says_why_per_part() -> None:
    """ONNX Runtime declines the graph (an op with no translation), eager wins: the parts
    it can take are exported, and the note says why the rest stays in PyTorch."""
    model, args = build_extra("kthvalue")
    result = chain.export(model, args, backend=chain.chain("onnxruntime", "eager", measure=False))
    note = next(n for n in result.notes if n.startswith("export:"))
    assert "onnxruntime declined it" in note, note
    assert "aten.kthvalue" in note and "no ONNX translation" in note, note


def test_args_must_be_a_tuple_as_torch_export_says() -> None:
    """A lone tensor used to be iterated row by row ("too many positional arguments")."""
    model, (x,) = build_extra("kthvalue")
    with pytest.raises(TypeError, match=r"tuple of example positional inputs.*\(x,\)"):
        chain.export(model, x, backend=chain.chain("eager"))  # type: ignore[arg-type]


@needs_transformers
def test_a_cache_in_the_output_suggests_use_cache_false() -> None:
    model = causal_lm.build("llama")
    with pytest.raises(CaptureError, match=r"use_cache=False"):
        chain.export(model, (causal_lm.prompt(1),), backend=chain.chain("eager"))
