"""The `origin` of a graph points at the user's code, not inside torch or a model library."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from chain import chain
from chain.report.graphinfo import origin

TORCH_CONV = os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "conv.py")
HERE = os.path.basename(__file__)


def _origin_of(model: nn.Module, *args: torch.Tensor) -> str:
    backend = chain("eager", measure=False)
    with torch.no_grad():
        torch.compile(model, backend=backend)(*args)
    return backend.report.graphs[0].origin


def test_frames_inside_torch_are_skipped_for_the_users_line() -> None:
    gm = torch.fx.symbolic_trace(nn.Linear(2, 2))
    node = next(n for n in gm.graph.nodes if n.op.startswith("call"))
    node.meta["stack_trace"] = (
        '  File "/home/me/model.py", line 12, in forward\n    return self.conv(x)\n'
        f'  File "{TORCH_CONV}", line 565, in forward\n    return self._conv_forward(x)\n'
    )
    assert origin(gm) == "forward (model.py:12)"


class Wrapper(nn.Module):
    """User code around a transformers model: the origin is this forward, not modeling_bert."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(
            vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=8,
        )  # fmt: skip
        self.bert = BertModel(config).eval()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert(ids).last_hidden_state.sum(-1)


def test_a_transformers_model_called_from_user_code_points_at_the_user() -> None:
    pytest.importorskip("transformers")
    where = _origin_of(Wrapper(), torch.randint(0, 50, (2, 8)))
    assert where.startswith("forward (test_origin.py:"), where
    line = int(where.split(":")[1].split(")")[0])
    with open(__file__) as f:
        assert "self.bert(ids)" in f.read().splitlines()[line - 1]


def test_a_graph_without_stack_traces_names_its_module_not_unknown() -> None:
    where = _origin_of(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4))
    line = nn.Sequential.forward.__code__.co_firstlineno
    assert where == f"Sequential.forward (container.py:{line})"
