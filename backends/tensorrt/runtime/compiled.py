"""The compiled graph handed back to dynamo: engines and PyTorch parts stitched in one module.

Weights were frozen into the engines; if the user changes a parameter in place afterwards
(its `_version` moves on), running stale engines would be silently wrong, so the call
raises instead (the chain's runtime guard then falls back and records why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx


class CompiledGraph:
    """Calls the partitioned graph module with dynamo's inputs; carries `chain_details`."""

    def __init__(
        self,
        gm: fx.GraphModule,
        frozen: Sequence[int],
        example_inputs: Sequence[Any],
        details: dict[str, Any],
        payload: bytes | None = None,
    ) -> None:
        self.gm = gm
        self.frozen = tuple(frozen)
        self._versions = {i: _version(example_inputs[i]) for i in self.frozen}
        self._frozen_ids = {i: id(example_inputs[i]) for i in self.frozen}
        self.chain_details = details
        if payload is not None:
            self.chain_payload = payload

    def __call__(self, *args: Any) -> Any:
        for i in self.frozen:
            if id(args[i]) != self._frozen_ids[i] or _version(args[i]) != self._versions[i]:
                raise RuntimeError(
                    f"weight input {i} changed after TensorRT froze it into an engine; "
                    "recompile (torch._dynamo.reset()) to rebuild"
                )
        return self.gm(*args)


def _version(value: Any) -> int:
    return int(value._version) if isinstance(value, torch.Tensor) else -1
