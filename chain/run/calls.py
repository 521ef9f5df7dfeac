"""One watched call of a winner: checked, re-verified when the schedule says so (the
guard's general path, chain.run.guard)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chain.run.watch import Watch


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
