"""Shape buckets decided by the run-time race (chain.run.buckets.racing): a bucket whose
timing against the general path did not decide (noisy: a busy machine; or undecided) is not
refused but raced against the general path on sampled calls of its shape, by
chain.judge.race's sign test, hysteresis and cost bound.

Decisions first on synthetic timings (the pairs' clock is virtual: tests/clock.py), then with
real compiled graphs of a small BERT whose bucketed path is slower or faster by design (a
delay on the virtual clock), answers compared with eager's, under no_grad and
inference_mode, `dynamic=True` and default, and from threads. The machine's load decides
nothing here: the timing's evidence is set busy or quiet, and the pairs' `busy` flag too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx, nn

import chain
import chain.judge.rounds as rounds
import chain.run.race as run_race
from backends.common.fx_utils import SYMBOLIC
from backends.errors import Unsupported
from backends.registry import registry
from chain.judge import race
from chain.judge.race import RaceEvent
from chain.report.bucket_stats import CHALLENGING, DEMOTED, LOST, SERVING, Bucket, BucketStats
from chain.report.report import Report
from chain.run.buckets.racing import ShapeRace
from chain.run.race import Raced
from tests.clock import ROUNDS, VirtualClock
from tests.models import build_extra

Fn = Callable[..., Any]
GENERAL_S = 3e-3  # the general path's delay a call (virtual)
FAST_S, SLOW_S = 1.5e-3, 6e-3  # a bucket twice as fast, or twice as slow


# -- the decisions, on synthetic timings -------------------------------------------------


class Synthetic:
    """A bucket and a general path whose calls take set (virtual) seconds, and whether the
    machine is busy when a pair is taken."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = VirtualClock(tick_s=1e-6).install(monkeypatch, "chain.run.race")
        self.seconds = {"bucket": FAST_S, "general": GENERAL_S}
        self.busy = False
        monkeypatch.setattr(run_race, "busy_now", lambda: self.busy)
        self.out = torch.ones(3)

    def fn(self, who: str) -> Fn:
        def run(*args: Any) -> Any:
            self.clock.sleep(self.seconds[who])
            return (self.out * args[0],)

        return run

    def race(self, lead: bool) -> tuple[ShapeRace, list[RaceEvent]]:
        bucket = Bucket("s0=16", SERVING, "static_inductor", "inductor")
        events: list[RaceEvent] = []
        shape = ShapeRace(
            bucket, self.fn("bucket"), lambda: self.fn("general"), lead, None, [],
            lambda r, e: events.append(e),
        )  # fmt: skip
        return shape, events

    def serve(self, shape: ShapeRace, calls: int) -> dict[str, int]:
        """`calls` calls of the shape; who answered them (a raced call: its server)."""
        general = self.fn("general")
        seen = {"bucket": 0, "general": 0, "raced": 0}
        for _ in range(calls):
            served = shape.pick((2.0,), general)
            if isinstance(served, Raced):
                seen["raced"] += 1
                out = served.out
            elif served is None:
                seen["general"] += 1
                out = general(2.0)
            else:
                seen["bucket"] += 1
                out = served[0](2.0)
            assert torch.equal(out[0], self.out * 2.0)
        return seen


@pytest.fixture
def synthetic(monkeypatch: pytest.MonkeyPatch) -> Synthetic:
    return Synthetic(monkeypatch)


def test_a_provisional_bucket_faster_than_the_general_path_is_kept(synthetic: Synthetic) -> None:
    """It serves from the start (it led at the median); the general path, raced on sampled
    calls, retires on quiet evidence: decided, the race over, the bucket alone serves."""
    shape, events = synthetic.race(lead=True)
    seen = synthetic.serve(shape, 20_000)
    assert [(e.what, e.backend) for e in events] == [("retired", "general:inductor")]
    assert shape.race.over and shape.race.stats.state == "decided"
    assert shape.bucket.state == SERVING and shape.serving
    assert "kept by the run-time race" in shape.bucket.reason
    assert seen["general"] == 0 and seen["bucket"] > 0.9 * 20_000
    stats = shape.race.stats  # the cost bound: at most RATE of the serving time, plus a pair
    assert stats.race_s <= race.RATE * stats.served_s + 2 * SLOW_S


def test_a_provisional_bucket_slower_than_the_general_path_is_dropped(
    synthetic: Synthetic,
) -> None:
    """It led the noisy build timing, but it is twice as slow: the general path is promoted
    (quiet evidence), then the bucket, now challenging, retires: lost, decided."""
    synthetic.seconds["bucket"] = SLOW_S
    shape, events = synthetic.race(lead=True)
    synthetic.serve(shape, 20_000)
    assert [(e.what, e.backend) for e in events] == [
        ("promoted", "general:inductor"),
        ("retired", "static_inductor"),
    ], events
    assert "quiet evidence" in events[0].why
    assert shape.race.stats.state == "decided"
    assert (shape.bucket.state, shape.bucket.winner, shape.serving) == (LOST, None, False)
    assert shape.bucket.reason.startswith("lost the run-time race against the general path")


def test_a_challenging_bucket_that_is_faster_is_promoted(synthetic: Synthetic) -> None:
    """The general path led the build timing: it serves, the bucket challenges it, wins,
    serves, and the general path then retires."""
    shape, events = synthetic.race(lead=False)
    assert shape.bucket.state == CHALLENGING
    seen = synthetic.serve(shape, 20_000)
    assert [(e.what, e.backend) for e in events] == [
        ("promoted", "static_inductor"),
        ("retired", "general:inductor"),
    ], events
    assert shape.bucket.state == SERVING and shape.race.stats.state == "decided"
    assert seen["general"] > 0 and seen["bucket"] > seen["general"]


def test_a_bucket_promoted_under_load_is_provisional_and_decided_when_quiet(
    synthetic: Synthetic,
) -> None:
    """Under load the bucket looks faster (the noise favours it) and is promoted on noisy
    evidence: provisional, the race goes on at its lower rate. Once quiet, the truth (the
    general path faster) takes the shape back, and the race ends decided."""
    synthetic.busy = True
    shape, events = synthetic.race(lead=False)
    synthetic.serve(shape, 20_000)
    assert events and events[0].what == "promoted" and "noisy evidence" in events[0].why
    assert shape.bucket.state == SERVING and shape.race.stats.state == "provisional"
    assert not shape.race.over
    synthetic.busy = False
    synthetic.seconds["bucket"] = SLOW_S
    synthetic.serve(shape, 200_000)
    assert shape.race.over and shape.race.stats.state == "decided", shape.race.stats
    assert shape.bucket.state == LOST and not shape.serving


def test_a_bucket_that_answers_differently_is_demoted(synthetic: Synthetic) -> None:
    """The general path (challenging) and the bucket disagree: the bucket is demoted, the
    general path serves the shape (it is the graph's verified, watched winner)."""
    shape, events = synthetic.race(lead=True)
    bad = synthetic.fn("bucket")
    shape.racer.fns["static_inductor"] = shape.fn = lambda *a: (bad(*a)[0] + 1.0,)
    for _ in range(race.FIRST_PAIR + 1):
        shape.pick((2.0,), synthetic.fn("general"))
    assert [e.what for e in events] == ["dropped"], events
    assert shape.bucket.state == DEMOTED and not shape.serving
    assert "answered differently" in shape.bucket.reason
    assert shape.pick((2.0,), synthetic.fn("general")) is None  # the general path now


# -- real graphs, bucketed path slow or fast by design ------------------------------------


@pytest.fixture
def bert() -> nn.Module:
    model, _ = build_extra("bert")
    return model


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """`switch_fixed` (fixed shapes) and `sleepy_general`: eager, with delays on one virtual
    clock that both the build's timing rounds and the run-time pairs read; `state["fixed_s"]`
    sets the bucket's delay at any time. The build's timing is seen as taken on a busy
    machine (noisy: the race decides); the pairs as taken on a quiet one."""
    # each clock read costs 1 ms: eager's own calls too, so a timing round calls it once
    clock = VirtualClock().install(monkeypatch, ROUNDS, "chain.run.race")
    monkeypatch.setattr(rounds, "running_threads", lambda: None)
    monkeypatch.setattr(rounds, "load_average", lambda: 8.0 * 64)
    monkeypatch.setattr(run_race, "busy_now", lambda: False)
    monkeypatch.setattr(race, "RATE", 0.5)  # many pairs in few calls: the wiring is under
    monkeypatch.setattr(race, "PROVISIONAL_RATE", 0.5)  # test (the 2% bound: test_race.py)
    state: dict[str, Any] = {"fixed_s": FAST_S, "fixed_calls": 0}

    with registry.snapshot():

        @registry.register("switch_fixed", dynamic=False)
        def switch_fixed(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Eager plus `state["fixed_s"]` a call, for fixed shapes."""

            def run(*args: Any) -> Any:
                state["fixed_calls"] += 1
                clock.sleep(state["fixed_s"])
                return gm.forward(*args)

            return run

        @registry.register("sleepy_general")
        def sleepy_general(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Eager plus 3 ms a call: the general path, for symbolic sizes only (so that the
            bucket's one candidate is `switch_fixed`)."""
            sizes = [s for x in example_inputs if isinstance(x, torch.Tensor) for s in x.shape]
            symbolic = [x for x in [*example_inputs, *sizes] if isinstance(x, SYMBOLIC)]
            if not symbolic:
                raise Unsupported("fixed sizes: this test's general path takes symbolic ones")

            def run(*args: Any) -> Any:
                clock.sleep(GENERAL_S)
                return gm.forward(*args)

            return run

        yield state


def _chain() -> chain.Chain:
    return chain.chain(
        "switch_fixed", "sleepy_general", bucket_after=2, eager_floor=False,
        measure_budget_s=0.05, challengers=(),
    )  # fmt: skip


def _call(model: nn.Module, compiled: Fn, length: int, mode: str) -> None:
    """One call at `length`, checked against eager."""
    torch.manual_seed(length)
    x = torch.randint(0, 100, (2, length))
    context = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with context():
        want = model(x).last_hidden_state
        torch.testing.assert_close(compiled(x).last_hidden_state, want)


def _bucket(c: chain.Chain, length: int) -> Bucket:
    (stats,) = [g.buckets for g in c.report.graphs if g.buckets is not None]
    assert isinstance(stats, BucketStats)
    (bucket,) = [b for b in stats.buckets if f"(2, {length})" in b.shape]
    return bucket


def _serve_until(
    model: nn.Module, compiled: Fn, c: chain.Chain, mode: str, done: Callable[[Bucket], bool]
) -> Bucket:
    for _ in range(600):
        _call(model, compiled, 16, mode)
        bucket = _bucket(c, 16)
        if done(bucket):
            return bucket
    raise AssertionError(f"not decided in 600 calls: {bucket}")


# grad modes x dynamic pairwise, not the product: each of the two tests below runs both
# modes and both dynamic settings, and the two together run all four combinations.
@pytest.mark.parametrize(
    ("mode", "dynamic"),
    [("no_grad", None), ("inference_mode", True)],
    ids=["no_grad-default", "inference_mode-dynamic"],
)
def test_a_noisy_bucket_that_is_really_slower_is_dropped_at_run_time(
    bert: nn.Module, backends: dict[str, Any], mode: str, dynamic: bool | None
) -> None:
    """Timed on a busy machine (noisy), the bucket was twice as fast: it serves provisionally
    instead of being refused. Then it becomes twice as slow as the general path: the race
    promotes the general path and drops the bucket; every answer stays eager's."""
    c = _chain()
    compiled = torch.compile(bert, backend=c, dynamic=dynamic)
    for length in (8, 12, 16, 16):
        _call(bert, compiled, length, mode)
    bucket = _bucket(c, 16)
    assert bucket.state == SERVING and bucket.race is not None, bucket
    assert bucket.reason.startswith("provisional, its timing did not decide (")
    assert bucket.race.state == "provisional" and bucket.race.server == "switch_fixed"
    backends["fixed_s"] = SLOW_S
    bucket = _serve_until(bert, compiled, c, mode, lambda b: b.state == LOST)
    assert bucket.race is not None and bucket.race.state == "decided"
    whats = [(e.what, e.backend) for e in bucket.race.events]
    assert whats == [("promoted", "general:sleepy_general"), ("retired", "switch_fixed")]
    before = backends["fixed_calls"]
    for _ in range(5):
        _call(bert, compiled, 16, mode)
    assert backends["fixed_calls"] == before  # the general path serves the shape alone
    rows = c.report.bucket_rows()
    assert any("decided: general:sleepy_general serves" in " ".join(r) for r in rows), rows


@pytest.mark.parametrize(
    ("mode", "dynamic"),
    [("no_grad", True), ("inference_mode", None)],
    ids=["no_grad-dynamic", "inference_mode-default"],
)
def test_a_noisy_bucket_that_is_really_faster_is_promoted_and_kept(
    bert: nn.Module, backends: dict[str, Any], mode: str, dynamic: bool | None, tmp_path: Any
) -> None:
    """Timed on a busy machine, the bucket was twice as slow: the general path serves and
    the bucket challenges it. It becomes twice as fast: promoted, the general path retires
    on quiet evidence, and the bucket serves its shape, decided; the report file says so."""
    backends["fixed_s"] = SLOW_S
    c = chain.chain(
        "switch_fixed", "sleepy_general", bucket_after=2, eager_floor=False,
        measure_budget_s=0.05, challengers=(), report_path=tmp_path / "run.json",
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c, dynamic=dynamic)
    for length in (8, 12, 16, 16):
        _call(bert, compiled, length, mode)
    bucket = _bucket(c, 16)
    assert bucket.state == CHALLENGING and bucket.race is not None, bucket
    assert bucket.race.server == "general:sleepy_general"
    backends["fixed_s"] = FAST_S
    bucket = _serve_until(
        bert, compiled, c, mode, lambda b: b.race is not None and b.race.state == "decided"
    )
    assert (bucket.state, bucket.winner) == (SERVING, "switch_fixed"), bucket.race
    assert [e.what for e in bucket.race.events] == ["promoted", "retired"]  # type: ignore[union-attr]
    before, calls = backends["fixed_calls"], bucket.calls
    for _ in range(5):
        _call(bert, compiled, 16, mode)
    assert backends["fixed_calls"] == before + 5 and bucket.calls == calls + 5
    saved = [g.buckets for g in Report.load(tmp_path / "run.json").graphs if g.buckets]
    (shown,) = [b for b in saved[0].buckets if b.shape == bucket.shape]  # type: ignore[union-attr]
    assert shown.race is not None and shown.race.state == "decided"
    assert "kept by the run-time race" in shown.reason
    assert "decided: switch_fixed serves" in c.report.render(width=300)


@pytest.mark.parametrize(
    ("mode", "dynamic"),
    [("no_grad", True), ("inference_mode", None)],
    ids=["no_grad-dynamic", "inference_mode-default"],
)
def test_a_challenging_bucket_is_as_used_as_its_shape(
    bert: nn.Module, backends: dict[str, Any], mode: str, dynamic: bool | None
) -> None:
    """max_buckets=1. The bucket of length 16 was timed slower (noisy: raced), so the general
    path serves the shape while the two race, and the bucket itself serves no call. Its
    shape is still the hot one: length 12, called less often, must not evict it (a
    challenging bucket evicted by a colder shape is rebuilt later: a compile on the
    caller's thread each time, and its race never decides)."""
    backends["fixed_s"] = SLOW_S
    c = chain.chain(
        "switch_fixed", "sleepy_general", bucket_after=2, max_buckets=1, eager_floor=False,
        measure_budget_s=0.05, challengers=(),
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c, dynamic=dynamic)
    # 8 first: with the default `dynamic`, the second length is the symbolic graph's first
    for length in [8] + [16] * 12 + [12] * 6:  # under race.FIRST_PAIR calls of 16: no pair
        _call(bert, compiled, length, mode)
    bucket = _bucket(c, 16)
    assert (bucket.state, bucket.calls) == (CHALLENGING, 0), bucket
    (stats,) = [g.buckets for g in c.report.graphs if g.buckets is not None]
    assert [b.shape for b in stats.buckets] == [bucket.shape]  # 12 got none: 16 is hotter


def test_a_timing_on_a_quiet_machine_decides_as_before(
    bert: nn.Module, backends: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quiet evidence and a decided verdict: no race (a slower bucket is refused, as before)."""
    monkeypatch.setattr(rounds, "load_average", lambda: 0.0)
    backends["fixed_s"] = SLOW_S
    c = _chain()
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16, 16):
        _call(bert, compiled, length, "no_grad")
    bucket = _bucket(c, 16)
    assert (bucket.state, bucket.race) == (LOST, None), bucket


def test_a_raced_bucket_served_from_four_threads(bert: nn.Module, backends: dict[str, Any]) -> None:
    """Four threads call the raced shape (and a cold one) while its race runs and decides:
    every answer is eager's, none raises, and the race took pairs."""
    c = _chain()
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16):
        _call(bert, compiled, length, "no_grad")
    assert _bucket(c, 16).race is not None
    backends["fixed_s"] = SLOW_S
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for n in range(60):
                _call(bert, compiled, 12 if (n + seed) % 5 == 0 else 16, "no_grad")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    race_stats = _bucket(c, 16).race
    assert race_stats is not None and race_stats.pairs > 0
