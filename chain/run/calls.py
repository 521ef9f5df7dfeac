"""One watched call of a winner: checked, re-verified when the schedule says so (the
guard's general path, chain.run.guard)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chain.run.watch import Watch
from chain.run.watch.fast import NOT_RUN, Slow


def checked(
    fn: Callable[..., Any],
    watch: Watch,
    n: int,
    args: tuple[Any, ...],
    kept: dict[int, Any] | None,
    scan: bool | None = None,
) -> tuple[Any, str | None]:
    """Call `n` of `fn` under `watch`: re-verified when the schedule says so or the cheap
    checks find it suspect, else checked (and timed, when the schedule asks, to book what
    a re-verification slowed); (output, why it is wrong)."""
    schedule = watch.schedule
    if n < schedule.mark:
        out = fn(*args)
    elif n >= schedule.due:
        return watch.reverify(n, args, kept, lambda: fn(*args))
    else:  # a call around a re-verification
        start = time.perf_counter()
        out = fn(*args)
        watch.timed(n, time.perf_counter() - start)
    return judged(watch, n, args, kept, out, scan)


def judged(
    watch: Watch,
    n: int,
    args: tuple[Any, ...],
    kept: dict[int, Any] | None,
    out: Any,
    scan: bool | None,
) -> tuple[Any, str | None]:
    """The checks of call `n` after the winner returned `out`; a suspect call (NaN/inf
    found) is re-verified at once."""
    reason, suspect = watch.check(n, args, out, scan)
    if reason is None and suspect and watch.can_reverify_after(kept):
        return watch.reverify(n, args, kept, lambda: out, timed=False)
    return out, reason


def unkept(
    fn: Callable[..., Any], watch: Watch, args: tuple[Any, ...]
) -> tuple[Any, int, str | None, list[int] | None]:
    """A call of `fn` under `watch` for a graph that writes none of its inputs (a bucket's):
    by the watch's fast path where bound (`watch.fast`), else, and for the calls it hands
    back, the general route; (output, call number, why it is wrong, the activations'
    versions before it: None where the fast path found them unmoved)."""
    fast = watch.fast
    if fast is None:
        n, scan = watch.call_number(), None
    else:
        slow = fast(*args)
        if type(slow) is not Slow:
            return slow, 0, None, None
        n, scan = slow.n, slow.scan
        if slow.out is not NOT_RUN:
            out, reason = judged(watch, n, args, None, slow.out, bool(scan))
            return out, n, reason, slow.versions
    versions = watch.versions(args)
    out, reason = checked(fn, watch, n, args, None, scan)
    return out, n, reason, versions
