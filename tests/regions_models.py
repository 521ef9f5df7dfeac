"""Models for the region tests (chain.select.regions): a BERT with repeated layers and a
two-tower model, from configs with random weights; and the graph dynamo hands a backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import fx, nn


def bert(layers: int = 4) -> nn.Module:
    """A transformers BertModel from a tiny config with `layers` identical layers."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return BertModel(config).eval()


def dual(layers: int = 4) -> nn.Module:
    """A CLIP-like dual encoder (transformers' VisionTextDualEncoderModel) from tiny configs:
    a ConvNeXt vision tower and a BERT text tower of `layers` identical layers."""
    from transformers import (
        BertConfig,
        ConvNextConfig,
        VisionTextDualEncoderConfig,
        VisionTextDualEncoderModel,
    )

    vision = ConvNextConfig(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=16)
    vision.hidden_size = vision.hidden_sizes[-1]  # the dual encoder reads the pooled width here
    text = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    config = VisionTextDualEncoderConfig.from_vision_text_configs(vision, text, projection_dim=16)
    return VisionTextDualEncoderModel(config=config).eval()


def captured(model: nn.Module, *args: Any, dynamic: bool | None = None
             ) -> tuple[fx.GraphModule, list[Any]]:  # fmt: skip
    """The one graph dynamo hands a backend for `model(*args)`, and its example inputs."""
    seen: list[tuple[fx.GraphModule, list[Any]]] = []

    def capture(gm: fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        seen.append((gm, list(inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=capture, dynamic=dynamic)(*args)
    if len(seen) != 1:
        raise RuntimeError(f"dynamo handed over {len(seen)} graphs, not one")
    return seen[0]


def set_plan(monkeypatch: pytest.MonkeyPatch, backend_of: Callable[[int], str]) -> None:
    """The regions' plan set by a test (region i under `backend_of(i)`, the planned figures
    the search's own) and the stitched graph kept as faster: a test of what serves a mixed
    graph, not of the measurement that chooses one (tests/test_regions_mix.py)."""
    import chain.select.regions.mix as mix
    from chain.judge.assign import Assignment
    from chain.report.records import Attempt, Status

    planned = mix.cheapest

    def plan(costs: Any, crossings: Any) -> Assignment:
        best = planned(costs, crossings)
        return Assignment(tuple(map(backend_of, range(len(costs)))), best.total, best.crossings)

    def faster(selection: Any, gm: Any, reference: Any, winner: Any, fns: Any, stitched: Any,
               details: dict[str, Any]) -> tuple[Attempt, Any]:  # fmt: skip
        return Attempt(mix.REGIONS, Status.WON, "faster (set by the test)", details=details,
                       latency_ms=0.1), stitched  # fmt: skip

    monkeypatch.setattr(mix, "cheapest", plan)
    monkeypatch.setattr(mix, "_timed", faster)
