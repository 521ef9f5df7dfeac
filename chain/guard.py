"""The callable handed back to dynamo: the winner behind a try, falling back on a raise."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import fx

if TYPE_CHECKING:
    from collections.abc import Callable

    from chain.core import Chain


class GuardedGraph:
    """Calls the winning backend; if it raises, the chain records it and moves to the next.

    The happy path is one Python call and a `try`: nothing is checked per call.
    """

    __slots__ = ("backend_index", "chain", "chain_details", "fn", "gm", "graph_id")

    def __init__(
        self,
        chain: Chain,
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

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as exc:
            self.chain.fall_back(self, exc, args)
            return self.fn(*args)
