"""The guard: calls the winner, and on a raise lets the chain switch it to the next one."""

from __future__ import annotations

from typing import Any

from chain.run.guard import GuardedGraph


class _Chain:
    """A stand-in for the chain: what `chain.run.guard.FallBack` asks of it, nothing more."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def backend_name(self, index: int) -> str:
        return ["first", "second"][index]

    def fall_back(self, guard: GuardedGraph, exc: Exception, args: tuple[Any, ...]) -> None:
        self.failures.append(f"{guard.chain_details['winner']}: {exc} on {args}")
        guard.switch(lambda x: x + 2, 1, "second")


def _broken(x: int) -> int:
    raise RuntimeError("boom")


def test_a_raise_switches_to_the_next_backend_once() -> None:
    chain = _Chain()
    guard = GuardedGraph(chain, 0, None, _broken, 0)  # type: ignore[arg-type]
    assert guard.chain_details == {"graph": 0, "winner": "first"}
    assert guard(1) == 3
    assert guard(5) == 7  # the switch holds: no second fall-back
    assert chain.failures == ["first: boom on (1,)"]
    assert (guard.backend_index, guard.chain_details["winner"]) == (1, "second")
