"""Which calls are re-verified (chain.watch.schedule): calls 2, 4, 8, ... early on, and over
any long run no more than `rate` of the winner's time, the early ones included."""

from __future__ import annotations

import itertools
import math

import pytest

from chain.watch.schedule import Schedule


def _run(schedule: Schedule, calls: int, cost_s: float, call_s: float) -> list[int]:
    """The calls re-verified in `calls` calls, each re-verification costing `cost_s`."""
    picked = []
    for n in range(1, calls + 1):
        if n >= schedule.due:
            picked.append(n)
            schedule.done(n, cost_s, call_s)
    return picked


@pytest.mark.parametrize("cost_calls", [1.0, 2.5, 10.0])
@pytest.mark.parametrize("rate", [0.01, 0.005])
def test_the_share_stays_within_the_rate_early_checks_included(
    rate: float, cost_calls: float
) -> None:
    """A re-verification costing `cost_calls` calls: from the point where the budget has
    paid for the early checks on, each one waits until `rate` of the run time has paid
    for all those before it."""
    call_s = 1e-3
    schedule = Schedule(rate)
    picked = _run(schedule, 200_000, cost_calls * call_s, call_s)
    assert picked[:4] == [2, 4, 8, 16]  # early, whatever the budget
    paid = 0  # the call from which the share stays within the rate
    for k, n in enumerate(picked):
        spent = k * cost_calls * call_s  # by the k re-verifications before call n
        if spent > rate * n * call_s:
            paid = n
    # the early checks are repaid: k of them cost k budgets' worth, doubling meanwhile
    assert paid <= 2 * math.log2(200_000) * cost_calls / rate
    # in the long run, the rate itself: not less than 90% of what it pays for
    assert len(picked) * cost_calls * call_s >= 0.9 * rate * 200_000 * call_s


def test_early_checks_double_until_the_budget_has_paid_for_them() -> None:
    """Costing 2 calls each at 1%: 2, 4, ... 1024 (10 checks: 20 calls' worth, which 1%
    pays for by call 2,000), then 2000, then every 200 calls (2 calls' worth each)."""
    schedule = Schedule(0.01)
    picked = _run(schedule, 3000, 2e-3, 1e-3)
    assert picked[:12] == [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2000, 2200]
    assert all(b - a == 200 for a, b in itertools.pairwise(picked[10:]))


@pytest.mark.parametrize("rate, expected", [(1.0, list(range(2, 11))), (0.0, [])])
def test_every_call_or_none(rate: float, expected: list[int]) -> None:
    schedule = Schedule(rate)
    assert _run(schedule, 10, 5e-3, 1e-3) == expected


def test_a_suspect_call_reverified_with_the_schedule_off_leaves_it_off() -> None:
    schedule = Schedule(0.0)
    schedule.done(3, 1e-3, 1e-3)
    assert schedule.due == math.inf
