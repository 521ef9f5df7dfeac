"""The compiled graph handed back to dynamo: engines and PyTorch parts stitched in one module.

Weights were frozen into the engines; if the user changes a parameter in place afterwards
(its `_version` moves on), running stale engines would be silently wrong, so the call
raises instead (the chain's runtime guard then falls back and records why). A chain that
sees the change between calls calls `chain_refresh` first: the graph is built again on
the new weights (the engine cache keys on the weights' values, so no stale engine is
reused). Not a refit: after the lowering's constant folding the engines' weights are
no longer the graph's inputs by name, so `tensorrt.Refitter` has nothing to map them to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        rebuild: Callable[[list[Any]], CompiledGraph] | None = None,
    ) -> None:
        self.gm = gm
        self.frozen = tuple(frozen)
        self._versions = {i: _version(example_inputs[i]) for i in self.frozen}
        self._frozen_ids = {i: id(example_inputs[i]) for i in self.frozen}
        self.chain_details = details
        self.rebuild = rebuild  # the backend again, on other inputs' weights
        if payload is not None:
            self.chain_payload = payload

    def chain_refresh(
        self, args: Sequence[Any], force: bool = False, trace: bool = True
    ) -> str | None:
        """The weights in `args` into the engines before the next answer: the graph built
        again on them; None when no frozen weight changed (`force`: changed by value).
        `trace` False (other threads call): a rebuild traces the graph, so it raises."""
        stale = force or any(
            id(args[i]) != self._frozen_ids[i] or _version(args[i]) != self._versions[i]
            for i in self.frozen
        )
        if not stale:
            return None
        if self.rebuild is None:
            raise RuntimeError("weights changed and this TensorRT graph cannot be rebuilt")
        if not trace:
            raise RuntimeError(
                "weights changed; rebuilding traces the graph while other threads call "
                "compiled models (it changes torch for all of them): not done"
            )
        new = self.rebuild(list(args))
        self.gm, self.frozen = new.gm, new.frozen
        self._versions, self._frozen_ids = new._versions, new._frozen_ids
        rebuilds = self.chain_details.get("rebuilds", 0) + 1
        self.chain_details = {**new.chain_details, "rebuilds": rebuilds}
        return "rebuilt its engines on the new weights"

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
