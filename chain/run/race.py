"""A graph's race at run time (the decisions: chain.judge.race): on the calls the race
samples, the server and one challenger run the same inputs, each timed alone; the
challenger on copies of the activations (its writes never reach the caller), made outside
its timed part. The server's answer is the call's answer once the challenger's matches it;
a challenger that raises or answers differently leaves the race with the reason, and the
guard's usual path (its checks, its recovery) answers the call anew. A promotion switches
the guard to the challenger (`on_event`). Graphs that write their inputs are not raced (the
server's writes would need undoing before the challenger runs).

Each contender is timed as it runs when it serves alone: the server first, within the
stream of its served calls (an untimed run, then the timed one), then the challenger, right
after `UNTIMED` runs of its own (its weights and code in the caches, its threads awake).
Timed the other way, the server, which ran every call, read warm and the challenger, which
ran 50 calls ago, cold: on a small T5 encoder (1 torch thread) an AOTInductor package faster
than ONNX Runtime read as "0.58x the server", and it retired. Orders that alternated left
the server timed, every other pair, right after the challenger: at 2 torch threads ONNX
Runtime (serving) then read 0.130 ms where it reads 0.175 ms in its stream, the package
0.14 ms either way, the pairs split by order and the race stayed undecided after 233 pairs.
The extra untimed runs count in the race's cost.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from backends.errors import BackendExit, one_line
from chain.judge.compiles import compiles_running
from chain.judge.race import PROMOTED, Pair, Race, RaceEvent, busy_now
from chain.judge.verify import compare
from chain.run.callers import may_trace

if TYPE_CHECKING:
    from chain.run.guard import Active

NOT_RACED = object()  # the server failed on the raced call: the guard's usual path answers
# the challenger's untimed runs before its timed one. Right after the server's runs a
# challenger reads slower than it serves: a T5 encoder's ONNX Runtime and inductor, 1 and 2
# torch threads, read 8-28% over their own stream after 1 untimed run, 4-8% after 2, 4-7%
# after 3 (a gap between the two contenders made it worse: threads asleep). One run left
# every challenger handicapped by more than the race's 3% margin.
UNTIMED = 2


class Raced(NamedTuple):
    """A raced call's answer, when the caller must tell it from a callable to call (a shape's
    bucket race, chain.run.buckets.racing): both ran; the server's, matched by the other."""

    out: Any


# a dropped challenger's reason when it answered (as opposed to "raised ...")
DIFFERED = "answered differently from the server"


class Racer:
    """The race of one graph and the compiled callables of its contenders."""

    __slots__ = ("copied", "fns", "on_event", "once", "race", "sync", "tolerances")

    def __init__(
        self,
        race: Race,
        fns: dict[str, Callable[..., Any]],
        copied: Sequence[int],
        on_event: Callable[[RaceEvent, Callable[..., Any] | None], None],
        tolerances: dict[torch.dtype, tuple[float, float]] | None = None,
        cuda: bool = False,
        once: bool = False,
    ) -> None:
        self.race = race
        # the server runs once a pair, timed without its untimed run first: a graph with
        # in-place writes raced because they changed nothing at selection, in case a later
        # call's write accumulates (run twice, it would be applied twice)
        self.once = once
        self.fns = fns
        self.copied = tuple(copied)  # the activations: a challenger runs on copies of them
        self.on_event = on_event  # the chain records each event; a promotion switches
        self.tolerances = tolerances
        self.sync: Callable[[], None] = torch.cuda.synchronize if cuda else _nothing

    def run(self, active: Active, challenger: str, args: tuple[Any, ...]) -> Any:
        """Call `args` on the server (`active`) and on `challenger`, timed; the server's
        output, or NOT_RACED when either failed (the usual path then answers)."""
        return self.run_server(active.fn, challenger, args)

    def run_server(self, server: Callable[..., Any], challenger: str, args: tuple[Any, ...]) -> Any:
        """`run` with the server's callable given (a shape's bucket or the general path:
        chain.run.buckets.racing)."""
        start = time.perf_counter()
        busy = busy_now() or bool(compiles_running())  # a compile beside it: noisy
        fn = self.fns.get(challenger)
        if fn is None:
            return NOT_RACED
        inputs = list(args)
        for i in self.copied:
            inputs[i] = inputs[i].detach().clone()
        # untimed, never raises: frozen weights the user changed
        failed = _refreshed(fn, inputs)
        if failed is None:  # else dropped below; the usual path answers
            try:  # each timed as it serves: the server in its stream, then the challenger
                if not self.once:
                    server(*args)
                out, server_s = self._timed(server, args)
            except Exception:  # the server's failure: the usual path calls it and recovers
                return NOT_RACED
            got, challenger_s, failed = self._warm_challenge(fn, inputs)
        n = self.race.calls
        if failed is None:
            failed = compare(out, got, self.tolerances, layout=False).reason
            failed = f"{DIFFERED}: {failed}" if failed else None
        if failed is not None:  # the usual path answers: checked, re-verified as it would be
            self.on_event(self.race.drop(n, challenger, f"at run time: {failed}"), None)
            return NOT_RACED
        cost_s = time.perf_counter() - start - server_s
        event = self.race.pair(n, challenger, Pair(server_s, challenger_s, busy), cost_s)
        if event is not None:
            self.on_event(event, fn if event.what == PROMOTED else None)
        return out

    def _timed(self, fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, float]:
        self.sync()
        start = time.perf_counter()
        out = fn(*args)
        self.sync()
        return out, time.perf_counter() - start

    def _warm_challenge(
        self, fn: Callable[..., Any], inputs: list[Any]
    ) -> tuple[Any, float, str | None]:
        """The challenger run UNTIMED times, then timed: `_challenge`'s answer."""
        for _ in range(UNTIMED):
            if (failed := self._challenge(fn, inputs)[2]) is not None:
                return None, 0.0, failed
        return self._challenge(fn, inputs)

    def _challenge(
        self, fn: Callable[..., Any], inputs: list[Any]
    ) -> tuple[Any, float, str | None]:
        """The challenger's output and time, or why it failed (it never raises)."""
        try:
            out, took = self._timed(fn, inputs)
        except Exception as exc:
            return None, 0.0, f"raised {one_line(exc)}"
        except SystemExit as exc:
            return None, 0.0, f"raised {one_line(BackendExit(exc))}"
        return out, took, None


def _refreshed(fn: Callable[..., Any], inputs: Sequence[Any]) -> str | None:
    """A challenger that froze the weights takes the user's new ones before its pair, as the
    server does before its call (chain.run.watch.updates): outside the timed part, and with
    no trace beside other threads (`trace=False`: it raises instead). Why it failed, or None."""
    refresh = getattr(fn, "chain_refresh", None)
    if refresh is None:
        return None
    try:
        refresh(inputs, trace=may_trace())
    except Exception as exc:
        return f"raised {one_line(exc)} (refreshing its frozen weights)"
    return None


def _nothing() -> None:
    """No device to wait for."""
