"""The callable handed back to dynamo: the winner behind a try, falling back on a raise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import fx


class FallBack(Protocol):
    """What the guard needs from the chain that built it (the chain itself, in practice)."""

    def backend_name(self, index: int) -> str:
        """The name of the backend at `index` in the chain."""
        ...

    def fall_back(self, guard: GuardedGraph, exc: Exception, args: tuple[Any, ...]) -> None:
        """Record that the winner raised; `guard.switch` to the next backend that passes."""
        ...


class GuardedGraph:
    """Calls the winning backend; if it raises, the chain records it and moves to the next.

    The happy path is one Python call and a `try`: nothing is checked per call. The chain
    changes the backend only through `switch`.
    """

    __slots__ = ("backend_index", "chain", "chain_details", "fn", "gm", "graph_id")

    def __init__(
        self,
        chain: FallBack,
        graph_id: int,
        gm: fx.GraphModule,
        fn: Callable[..., Any],
        backend_index: int,
    ) -> None:
        self.chain = chain
        self.graph_id = graph_id
        self.gm = gm
        self.fn = fn
        self.backend_index = backend_index
        self.chain_details = {"graph": graph_id, "winner": chain.backend_name(backend_index)}

    def switch(self, fn: Callable[..., Any], backend_index: int, winner: str) -> None:
        """Run `fn` from now on: the callable of `winner`, at `backend_index` in the chain."""
        self.fn = fn
        self.backend_index = backend_index
        self.chain_details["winner"] = winner

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as exc:
            self.chain.fall_back(self, exc, args)
            return self.fn(*args)
