"""The callable handed back to dynamo: the winner, watched, falling back on a raise or a
wrong answer, one fallback at a time."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from threading import get_ident
from typing import TYPE_CHECKING, Any, Protocol

from torch import fx

from backends.errors import BackendExit, one_line
from chain.run.callers import CALLERS
from chain.run.calls import checked as _checked
from chain.run.calls import judged as _judged
from chain.run.calls import unkept
from chain.run.precompilable import Precompilable
from chain.run.race import NOT_RACED, Raced, Racer
from chain.run.watch import Demoted, InputsWritten, Watch
from chain.run.watch.fast import NOT_RUN, Slow, fast_path
from chain.run.watch.updates import Updates
from chain.select.isolation import WeightsDamaged

log = logging.getLogger("chain")

if TYPE_CHECKING:
    from chain.run.buckets import Buckets

# One fallback at a time, process-wide: fallbacks are rare and slow (they compile), and one
# lock also keeps two graphs from rewriting the report at once. Re-entrant: a nested
# chain's guard may fall back while the outer chain tries candidates.
_FALLBACK = threading.RLock()


class FallBack(Protocol):
    """What the guard needs from the chain that built it (the chain itself, in practice)."""

    def backend_name(self, index: int) -> str:
        """The name of the backend at `index` in the chain."""
        ...

    def fall_back(self, guard: GuardedGraph, exc: Exception, args: tuple[Any, ...]) -> None:
        """Record that the winner raised (or was `Demoted`); `guard.switch` to the next
        backend that passes."""
        ...


@dataclass(frozen=True)
class Active:
    """The winner now in use: replaced whole by `switch`, so a call reads it in one go."""

    fn: Callable[..., Any]
    backend_index: int
    watch: Watch | None  # None: no checks and nothing written to keep (the plain path)
    fast: Callable[..., Any] | None = None  # the usual call as one closure (chain.run.watch.fast)


def _active(fn: Callable[..., Any], backend_index: int, watch: Watch | None) -> Active:
    """The winner `fn` with its watch, and the fast path where the graph allows one."""
    return Active(fn, backend_index, watch, fast_path(watch, fn) if watch is not None else None)


class GuardedGraph(Precompilable):
    """Calls the winning backend; if it raises or is caught wrong, the chain records it and
    moves to the next, and this call returns the next backend's answer.

    Every call reads `active` once and takes no lock. With a `Watch`, each call is checked
    (`chain.run.watch`), some are re-verified against eager, and the inputs the graph writes
    are kept before the call and restored before the next backend runs. A fallback holds
    `_FALLBACK`; calls made meanwhile run the current winner, and one that fails waits for
    the fallback and then runs the new winner: no call raises because another falls back.
    """

    __slots__ = (
        "active",
        "buckets",
        "chain",
        "chain_details",
        "damaged",
        "gm",
        "graph_id",
        "later",
        "racer",
        "updates",
        "watch_for",
    )

    def __init__(
        self,
        chain: FallBack,
        graph_id: int,
        gm: fx.GraphModule,
        fn: Callable[..., Any],
        backend_index: int,
        watch_for: Callable[[str], Watch | None] | None = None,
        buckets: Buckets | None = None,
        updates: Updates | None = None,
    ) -> None:
        self.chain = chain
        self.updates = updates  # the weights between calls (chain.run.watch.updates)
        self.buckets = buckets  # per-shape buckets (chain.run.buckets); None: the winner only
        self.graph_id = graph_id
        self.gm = gm
        self.watch_for = watch_for
        winner = chain.backend_name(backend_index)
        self.chain_details = {"graph": graph_id, "winner": winner}
        self.active = self._active(fn, backend_index, watch_for(winner) if watch_for else None)
        self.damaged: WeightsDamaged | None = None  # set: every call raises until reloaded
        self.racer: Racer | None = None  # selection going on at run time (chain.run.race)
        self.later: Callable[[], None] | None = None  # run once, at the next call (challengers)

    @property
    def fn(self) -> Callable[..., Any]:
        """The callable of the winner now in use."""
        return self.active.fn

    @property
    def backend_index(self) -> int:
        """The winner's position in the chain (past the end: the eager floor)."""
        return self.active.backend_index

    @property
    def winner(self) -> str:
        """The name of the winner now in use (the general path, for the buckets)."""
        return str(self.chain_details["winner"])

    def switch(self, fn: Callable[..., Any], backend_index: int, winner: str) -> None:
        """Run `fn` from now on: the callable of `winner`, at `backend_index` in the chain."""
        watch = self.watch_for(winner) if self.watch_for else None
        self.chain_details["winner"] = winner
        self.active = self._active(fn, backend_index, watch)
        if self.buckets is not None:  # buckets timed against the callable before: re-decided
            self.buckets.general_switched(winner)

    def _active(self, fn: Callable[..., Any], backend_index: int, watch: Watch | None) -> Active:
        """The winner with its watch, told how to report an update it sees by value."""
        if watch is not None and self.updates is not None:
            watch.on_update = self._quiet_update
        return _active(fn, backend_index, watch)

    def bucket_watch(self, winner: str, fn: Callable[..., Any]) -> Watch | None:
        """The run-time checks for a bucket `winner` serves with `fn` (chain.run.buckets): the
        graph's own, its calls counted on the bucket rather than on the graph's record, with
        the fast path a general winner has."""
        watch = self.watch_for(winner) if self.watch_for else None
        if watch is not None:
            watch.counts_calls = False
            watch.fast = fast_path(watch, fn)
        return watch

    def __call__(self, *args: Any) -> Any:
        if get_ident() != CALLERS.first:  # a second thread: no tracing at run time from now
            CALLERS.another(get_ident())
        if self.damaged is not None:
            self._still_damaged()
        updates = self.updates
        if updates is not None:
            updates.call = next(updates.calls)
            if not updates.weights.same(args):  # the user's update: refreshed before the call
                self._updated(args)
        if self.later is not None:
            self._run_later()
        racer = self.racer
        if racer is not None and (challenger := racer.race.due()) is not None:
            out = racer.run(self.active, challenger, args)  # a sampled call: paired, timed
            if out is not NOT_RACED:
                return out
        if self.buckets is not None and (served := self.buckets.pick(args, self)) is not None:
            if type(served) is Raced:  # a raced shape's sampled call (chain.run.buckets.racing)
                return served.out
            try:  # a hot shape's bucket, watched as a winner is
                out, n, reason = self._bucket_call(*served, args)
                if reason is None:
                    return out
                failure: Exception = Demoted(n, reason)
            except InputsWritten:
                raise  # the inputs are no longer the caller's: no path can run
            except WeightsDamaged as exc:
                self._damage(exc)
                raise
            except Exception as exc:
                failure = exc
            except SystemExit as exc:
                failure = BackendExit(exc)
            self.buckets.demote(args, failure)  # recorded; the general path runs this call
        active = self.active
        watch = active.watch
        if watch is None:
            try:
                return active.fn(*args)
            except Exception as exc:
                return self._recover(active, exc, args, None)
            except SystemExit as exc:  # a backend's exit is its failure (KeyboardInterrupt passes)
                return self._recover(active, BackendExit(exc), args, None)
        fast = active.fast
        if fast is None:
            return self._watched(active, watch, args, watch.call_number())
        try:
            out = fast(*args)
        except Exception as exc:
            return self._recover(active, exc, args, None)
        except SystemExit as exc:
            return self._recover(active, BackendExit(exc), args, None)
        if type(out) is not Slow:
            if updates is not None and not updates.weights.same(args):
                return self._moved(active, watch.stats.calls, args, out, None)
            return out
        return self._watched(active, watch, args, out.n, out.scan, out.out, out.versions)

    def _watched(
        self,
        active: Active,
        watch: Watch,
        args: tuple[Any, ...],
        n: int,
        scan: bool | None = None,
        ran: Any = NOT_RUN,
        versions: list[int] | None = None,
    ) -> Any:
        """Call `n` by the general path: kept, checked, re-verified as the schedule says,
        written inputs looked for; `ran`: the winner's output when the fast path has already
        called it (`versions`: the activations' versions it read before)."""
        kept = None
        if ran is NOT_RUN:
            kept = watch.writes.keep(args) if watch.writes is not None else None
            versions = watch.versions(args)
        try:
            if ran is NOT_RUN:
                out, reason = _checked(active.fn, watch, n, args, kept, scan)
            else:
                out, reason = _judged(watch, n, args, kept, ran, bool(scan))
        except Exception as exc:
            return self._recover(active, exc, args, kept)
        except SystemExit as exc:
            return self._recover(active, BackendExit(exc), args, kept)
        if versions and (moved := watch.wrote(args, versions)):
            self._written(active, n, moved, args)
        if reason is not None:
            return self._recover(active, Demoted(n, reason), args, kept)
        if self.updates is not None and not self.updates.weights.same(args):
            return self._moved(active, n, args, out, kept)
        return out

    def _moved(
        self, active: Active, n: int, args: tuple[Any, ...], out: Any, kept: dict[int, Any] | None
    ) -> Any:
        """A weight's counter moved during the winner's call `n`: damage (WeightsDamaged when
        its values changed, a demotion when they did not); else `out` (another thread's
        update came in meanwhile: the next call sees it)."""
        assert self.updates is not None
        name = self.chain.backend_name(active.backend_index)
        weights = self.updates.weights
        try:
            with weights.lock:
                if weights.same(args):
                    return out
                token = (-1, None, False, weights.epoch)
                reason = weights.across(args, token, f"{name}, the winner (call {n})")
        except WeightsDamaged as exc:
            return self._recover(active, exc, args, kept)
        if reason is None:
            return out
        return self._recover(active, Demoted(n, reason), args, kept)

    def _updated(self, args: tuple[Any, ...]) -> None:
        """The weights changed between calls: the winner refreshes the ones it froze (timed),
        or reads them live; too frequent for refreshing, it steps down. Recorded."""
        updates = self.updates
        assert updates is not None
        with updates.weights.lock:
            changed = updates.weights.changed(args)
            if not changed:
                return  # another thread's call handled it
            self._refresh(args, len(changed), False)

    def _quiet_update(self, args: Any) -> None:
        """A re-verification found weights changed by value with no counter moved (a write
        through `.data`): an update too, refreshed before the winner's call."""
        self._refresh(tuple(args), 0, True)

    def _refresh(self, args: tuple[Any, ...], changed: int, force: bool) -> None:
        """The winner's answer to an update (chain.run.watch.updates); a failed refresh, or
        one not worth it, moves the graph to the next backend."""
        assert self.updates is not None
        active = self.active
        winner = str(self.chain_details["winner"])
        failure = self.updates.apply(active.fn, winner, active.watch, args, changed, force)
        if failure is not None:
            self._fall_back(active, failure, args)

    def _bucket_call(
        self, fn: Callable[..., Any], watch: Watch | None, args: tuple[Any, ...]
    ) -> tuple[Any, int, str | None]:
        """A bucket's call with the general winner's checks: (output, the call's number for
        its shape, why it is wrong). A bucket's graph writes none of its inputs
        (chain.run.buckets), so nothing is kept before the call."""
        if watch is None:
            return fn(*args), 0, None
        out, n, reason, versions = unkept(fn, watch, args)
        if versions and (moved := watch.wrote(args, versions)):
            assert self.buckets is not None
            self.buckets.demote(args, Demoted(n, f"wrote input(s) {moved}"))
            raise InputsWritten(
                f"a bucket of graph {self.graph_id} wrote input(s) {moved} where eager does "
                f"not (call {n} of its shape): those inputs hold what it wrote and could not "
                "be restored; the general path serves that shape from now on. Re-create them "
                "and call again."
            )
        return out, n, reason

    def _written(self, active: Active, n: int, moved: list[int], args: tuple[Any, ...]) -> None:
        """The winner wrote inputs eager leaves alone: demote it, and fail this call with what
        state the inputs are in, since no copy of them was kept to undo it (running the next
        backend on them would give a silently wrong answer)."""
        name = self.chain.backend_name(active.backend_index)
        reason = f"wrote input(s) {moved} where eager does not"
        if active.watch is not None:
            active.watch.stats.failures.append(f"{name} at call {n}: {reason}")
        self._fall_back(active, Demoted(n, reason), args)
        raise InputsWritten(
            f"{name} {reason} (graph {self.graph_id}, call {n}): those inputs (weights or "
            "buffers among them) hold what it wrote and could not be restored; the chain has "
            f"moved on to {self.chain.backend_name(self.backend_index)}. Re-create them "
            "(reload the model's weights) and call again."
        )

    def _run_later(self) -> None:
        """The work the chain left for the graph's second call (compiling challengers), once;
        other threads' calls meanwhile wait for it."""
        with _FALLBACK:
            later, self.later = self.later, None
            if later is not None:
                later()

    def _recover(
        self, active: Active, exc: Exception, args: tuple[Any, ...], kept: dict[int, Any] | None
    ) -> Any:
        """Undo the failed call's writes, fall back (once, whoever comes first), run anew."""
        watch = active.watch
        name = self.chain.backend_name(active.backend_index)
        if isinstance(exc, WeightsDamaged):  # no backend can run on them: say so, loudly
            self._damage(exc)
            try:
                self._fall_back(active, exc, args)
            except Exception as also:  # re-selected on damaged weights (that other threads'
                # calls may still be damaging): the weights stay the error to report
                log.warning(
                    "graph %d: no backend re-selected after %s: %s",
                    self.graph_id,
                    type(exc).__name__,
                    one_line(also),
                )
            raise exc
        if isinstance(exc, Demoted) and watch is not None:
            watch.stats.failures.append(f"{name} {exc}")
        try:
            if watch is not None and watch.writes is not None and kept is not None:
                watch.writes.restore(args, kept, name)
        except InputsWritten as written:
            self._fall_back(active, exc, args)
            raise written from exc
        self._fall_back(active, exc, args)
        return self(*args)

    def _damage(self, exc: WeightsDamaged) -> None:
        """From now on every call raises `exc` until the weights are whole again."""
        if exc.intact is not None:
            self.damaged = exc

    def _still_damaged(self) -> None:
        """Raise WeightsDamaged unless the weights hold their values again (then serve)."""
        damaged = self.damaged
        if damaged is None or damaged.intact is None or damaged.intact():
            self.damaged = None
            return
        raise WeightsDamaged(
            f"graph {self.graph_id}: {damaged} (every call raises this until they are)",
            intact=damaged.intact,
        )

    def _fall_back(self, active: Active, exc: Exception, args: tuple[Any, ...]) -> None:
        """Let the chain switch away from `active`, unless another call already has."""
        with _FALLBACK:
            if self.active is active:
                self.chain.fall_back(self, exc, args)
