"""Which calls are re-verified (chain.run.watch.schedule): calls 2, 4, 8, ... early on, and over
any long run no more than `rate` of the winner's time, the early ones included."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from chain.run.watch.schedule import AFTER, SETTLED, Schedule


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


# -- the slowdown a re-verification leaves behind is booked to it ----------------------

# the excess over the usual call of the re-verified call itself ([0]) and of the calls
# right after it, in calls: the worst seen on bert-tiny on the 2-core CI machine (between
# a benchmark's arms: 0.57, 0.36, 0.24 ms on calls of 1.35 ms), where a re-verification in
# a plain loop slows the calls after it by 0.1 to 0.4 ms in all
SLOWED = (0.45, 0.42, 0.27, 0.18)


def _simulate(
    schedule: Schedule, calls: int, cost_calls: float, noise: float = 0.0, seed: int = 0
) -> tuple[list[int], float, int]:
    """`calls` calls of 1 ms each, following the schedule as the guard does: re-verified
    from `due`, timed from `mark`. Returns the calls re-verified, what they really cost
    (their own time and the slowdown they left, in ms) and how many calls were timed."""
    rng = random.Random(seed)
    picked: list[int] = []
    spent, timed = 0.0, 0
    for n in range(1, calls + 1):
        jitter = 1 + rng.uniform(-noise, noise)
        if n >= schedule.due:
            picked.append(n)
            spent += cost_calls + SLOWED[0]
            schedule.done(n, cost_calls * 1e-3, (1 + SLOWED[0]) * jitter * 1e-3)
            continue
        after = n - picked[-1] if picked else len(SLOWED)
        extra = SLOWED[after] if after < len(SLOWED) else 0.0
        spent += extra
        if n >= schedule.mark:
            timed += 1
            schedule.timed(n, (1 + extra) * jitter * 1e-3)
    return picked, spent, timed


@pytest.mark.parametrize("noise", [0.0, 0.1])
@pytest.mark.parametrize("rate", [0.01, 0.005])
def test_the_share_counts_what_a_reverification_slows_after_it(rate: float, noise: float) -> None:
    """A re-verification booking 2 calls' worth and slowing the calls around it by 1.3
    calls' more: the rate holds for what they cost in all (booking only their own time,
    and the slowed call as the usual one, the share was 2.4 times the rate), with every call's
    time jittered by up to 10%."""
    calls = 200_000
    picked, spent, timed = _simulate(Schedule(rate), calls, 2.0, noise)
    share = spent / calls
    assert 0.9 * rate <= share <= 1.1 * rate, (share, len(picked))
    # timed: the calls charged after each re-verification and one settled call before it
    assert timed <= (AFTER + 1) * len(picked)


def test_settled_calls_are_far_from_a_reverification_and_slowdowns_are_booked() -> None:
    """Once a settled call is known, the calls right after a re-verification book their
    excess over it; a settled call is never one of those, and `mark` never passes `due`."""
    schedule = Schedule(0.01)
    _simulate(schedule, 5_000, 2.0)
    assert schedule.clean_s == pytest.approx(1e-3)  # the settled calls: the usual call only
    last, due = schedule.last, schedule.due
    assert schedule.mark <= due
    before = schedule.spent_s
    assert schedule.timed(last + 1, 1.5e-3) == pytest.approx(0.5e-3)
    assert schedule.spent_s == pytest.approx(before + 0.5e-3)
    assert schedule.timed(last + SETTLED, 3e-3) == 0.0  # settled: kept, not booked
    assert schedule.clean_s > 1e-3


def test_timed_calls_arriving_out_of_order_leave_the_schedule_moving() -> None:
    """Under threads, timed calls finish out of order: none of them stops `mark` short of
    the next re-verification, so the guard's usual call goes back to being untimed."""
    schedule = Schedule(0.01)
    _simulate(schedule, 3_000, 2.0)
    last = schedule.last
    for call in (last + 3, last + 1, last + 2, last - 1, last + 4):
        schedule.timed(call, 1e-3)
    assert schedule.mark == schedule.due - 1  # the settled call before the next one
    schedule.timed(int(schedule.due - 1), 1e-3)
    assert schedule.mark == schedule.due
