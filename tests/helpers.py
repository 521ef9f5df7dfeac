"""One helper to run a model through a backend and check it against eager."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree


def compile_and_check(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    backend: Any,
    *,
    calls: int = 2,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> Any:
    """torch.compile `model` with `backend`, call it `calls` times, assert it matches eager."""
    with torch.no_grad():
        expected = model(*args)
        compiled = torch.compile(model, backend=backend)
        for _ in range(calls):
            actual = compiled(*args)
            for e, a in zip(pytree.tree_leaves(expected), pytree.tree_leaves(actual), strict=True):
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol)
    return actual
