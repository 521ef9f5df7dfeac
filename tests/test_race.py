"""The run-time race's decisions (chain.judge.race) on synthetic paired times: promotion,
retirement, hysteresis, noisy evidence kept provisional, the cost bound, no flapping."""

from __future__ import annotations

import random
from typing import Any

import pytest

from chain.judge import race
from chain.judge.race import Pair, Race, RaceStats, judge


def _pairs(ratio: float, n: int, busy: bool = False, seed: int = 0, jitter: float = 0.05):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        server = 1e-3 * rng.lognormvariate(0, jitter)
        out.append(Pair(server, server * ratio * rng.lognormvariate(0, jitter), busy))
    return out


def _serve(r: Race, ratios: dict[str, float], calls: int, busy=lambda n: False, seed: int = 0):
    """Drive `r` for `calls` calls: each due pair gets times with the challenger at
    `ratios[challenger] / ratios[server]` of the server; returns the events."""
    rng = random.Random(seed)
    events = []
    for n in range(1, calls + 1):
        challenger = r.due()
        if challenger is None:
            continue
        server_s = 1e-3 * ratios[r.stats.server] * rng.lognormvariate(0, 0.05)
        challenger_s = 1e-3 * ratios[challenger] * rng.lognormvariate(0, 0.05)
        event = r.pair(n, challenger, Pair(server_s, challenger_s, busy(n)), challenger_s)
        if event is not None:
            events.append(event)
    return events


def test_too_few_pairs_decide_nothing() -> None:
    assert judge(_pairs(0.5, race.MIN_PAIRS - 1)) is None


@pytest.mark.parametrize(("ratio", "kind"), [(0.8, race.FASTER), (1.0, race.NOT_FASTER),
                                             (1.3, race.NOT_FASTER)])  # fmt: skip
def test_a_clear_window_is_decided(ratio: float, kind: str) -> None:
    verdict = judge(_pairs(ratio, race.RETIRE_WINDOW))
    assert verdict is not None and verdict.kind == kind and not verdict.noisy
    assert verdict.ratio == pytest.approx(ratio, rel=0.1)


def test_a_faster_challenger_is_promoted_after_hysteresis() -> None:
    r = Race("eager", ["onnxruntime"])
    events = _serve(r, {"eager": 1.0, "onnxruntime": 0.7}, 5000)
    promoted = [e for e in events if e.what == "promoted"]
    assert [e.backend for e in promoted] == ["onnxruntime"], events
    assert r.stats.server == "onnxruntime" and r.stats.challengers == ["eager"]
    assert "faster" in promoted[0].why and "quiet evidence" in promoted[0].why
    # then eager is raced against it, found not faster, and the race ends
    assert r.stats.state == "decided" and r.over
    assert [e.what for e in events] == ["promoted", "retired"]


def test_an_equal_challenger_is_never_promoted() -> None:
    """A twin of the server (same speed, 5% noise) over many seeds: retired, never promoted."""
    for seed in range(40):
        r = Race("inductor", ["onnxruntime"])
        events = _serve(r, {"inductor": 1.0, "onnxruntime": 1.0}, 3000, seed=seed)
        assert not [e for e in events if e.what == "promoted"], (seed, events)


def test_a_slower_server_is_demoted_to_eager() -> None:
    """Eager as a challenger: a server 2x slower than eager loses the graph to it."""
    r = Race("onnxruntime", ["eager"])
    events = _serve(r, {"onnxruntime": 2.0, "eager": 1.0}, 3000)
    assert events[0].what == "promoted" and events[0].backend == "eager"


def test_a_verdict_under_load_is_provisional_and_revisited_when_quiet() -> None:
    """Under load onnxruntime looks faster (the noise favours it); it is promoted
    provisionally; once the machine is quiet, the truth (inductor faster) takes over."""
    r = Race("inductor", ["onnxruntime"])
    under_load = {"inductor": 1.0, "onnxruntime": 0.6}
    events = _serve(r, under_load, 3000, busy=lambda n: True)
    assert events and events[0].what == "promoted" and "noisy evidence" in events[0].why
    assert r.stats.state == "provisional" and not r.over
    quiet = {"inductor": 0.8, "onnxruntime": 1.0}
    more = _serve(r, quiet, 100_000)  # the pairs' call numbers restart: only order matters
    assert r.stats.server == "inductor", more
    assert r.over and r.stats.state == "decided"


def test_the_race_costs_at_most_its_share_of_serving_time() -> None:
    r = Race("eager", ["a", "b"])
    ratios = {"eager": 1.0, "a": 1.0, "b": 1.02}  # nothing to win: the race runs long
    _serve(r, ratios, 20_000)
    stats = r.stats
    assert stats.pairs > 20 and r.server_s is not None
    two_pairs = 2.4e-3  # the bound holds before each pair; the last one may overshoot it
    assert stats.race_s <= race.RATE * stats.served_s + two_pairs, stats
    assert stats.served_s == pytest.approx(r._counted * 1e-3, rel=0.1)


def test_flapping_ends_the_race() -> None:
    """Regimes that flip every few hundred calls: at most MAX_SWITCHES promotions, then the
    race ends where it stands."""
    r = Race("a", ["b"])
    events = []
    for block in range(40):
        fast, slow = ("a", "b") if block % 2 else ("b", "a")
        events += _serve(r, {fast: 0.5, slow: 1.0}, 400, seed=block)
    promoted = [e for e in events if e.what == "promoted"]
    assert len(promoted) <= race.MAX_SWITCHES
    assert r.stats.state in ("ended", "decided")


def test_a_dropped_challenger_leaves_the_race() -> None:
    r = Race("eager", ["onnxruntime"])
    event = r.drop(7, "onnxruntime", "answered wrong at run time")
    assert event.what == "dropped" and r.stats.challengers == [] and r.over
    assert r.due() is None


def test_race_stats_round_trip() -> None:
    r = Race("eager", ["onnxruntime"])
    _serve(r, {"eager": 1.0, "onnxruntime": 0.7}, 3000)
    back = RaceStats.from_dict(r.stats.to_dict())
    assert back == r.stats
    assert "onnxruntime serves" in str(back) and "promoted" in str(back)
    with pytest.raises(TypeError, match="race should be an object"):
        RaceStats.from_dict([1])


def test_a_challenger_cold_from_the_calls_it_did_not_serve_is_timed_warm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cache model: a contender whose own last run is more than two runs back pays 2 ms
    on top of its time (its weights and code out of the caches). The server runs every call,
    the challenger only in pairs; the challenger is 2x faster warm. Timed as served, it is
    promoted, not retired for the caches the server keeps warm (chain.run.race)."""
    import torch

    from tests.clock import VirtualClock

    clock = VirtualClock(tick_s=0.0).install(monkeypatch, "chain.run.race")
    monkeypatch.setattr("chain.run.race.busy_now", lambda: False)
    monkeypatch.setattr("chain.run.race.compiles_running", lambda: ())
    runs: list[str] = []

    def contender(name: str, warm_s: float) -> object:
        def run(x: torch.Tensor) -> torch.Tensor:
            cold = name not in runs[-2:]
            runs.append(name)
            clock.sleep(warm_s + (2e-3 if cold else 0.0))
            return x * 2

        return run

    fns = {"server": contender("server", 1e-3), "challenger": contender("challenger", 0.5e-3)}
    events = _serve_racing(fns, 60_000)
    assert [(e.what, e.backend) for e in events] == [
        ("promoted", "challenger"),
        ("retired", "server"),
    ], events
    assert "faster: 2.00x the server" in events[0].why
    assert "not faster: 0.50x the server" in events[1].why


def test_a_challenger_whose_threads_sleep_between_its_runs_is_timed_as_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread model: the challenger (an AOTInductor package's OpenMP threads) pays 1 ms
    unless its own run was the one just before; the server (ONNX Runtime, no spinning)
    does not. The challenger is 2x faster served alone. Timed right after the other's run
    it reads 0.67x and retires; each timed run right after its own untimed one, it is
    promoted (chain.run.race: at 2 torch threads a T5 encoder's race stayed undecided)."""
    import torch

    from tests.clock import VirtualClock

    clock = VirtualClock(tick_s=0.0).install(monkeypatch, "chain.run.race")
    monkeypatch.setattr("chain.run.race.busy_now", lambda: False)
    monkeypatch.setattr("chain.run.race.compiles_running", lambda: ())
    runs: list[str] = []

    def contender(name: str, warm_s: float, wake_s: float) -> object:
        def run(x: torch.Tensor) -> torch.Tensor:
            asleep = runs[-1:] != [name]
            runs.append(name)
            clock.sleep(warm_s + (wake_s if asleep else 0.0))
            return x * 2

        return run

    fns = {
        "server": contender("server", 1e-3, 0.0),
        "challenger": contender("challenger", 0.5e-3, 1e-3),
    }
    events = _serve_racing(fns, 20_000)
    assert [(e.what, e.backend) for e in events][:1] == [("promoted", "challenger")], events
    assert "faster: 2.00x the server" in events[0].why


def test_a_challenger_that_froze_the_weights_refreshes_before_its_pair_untimed() -> None:
    """Its `chain_refresh` runs before each pair with `trace` as the process allows: true
    while one thread calls; once another has, false, and a refresh that must trace raises:
    the challenger leaves the race with that reason (chain.run.callers)."""
    import threading

    import torch

    from chain.run import callers
    from chain.run.race import NOT_RACED, Racer

    seen: list[bool] = []

    class Frozen:
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        def chain_refresh(self, args: object, force: bool = False, trace: bool = True) -> None:
            seen.append(trace)
            if not trace:
                raise RuntimeError("a re-export would trace the graph")

    r = Race("server", ["frozen"])
    events: list[race.RaceEvent] = []
    racer = Racer(r, {"frozen": Frozen()}, (), lambda e, fn: events.append(e))
    x = torch.ones(3)
    callers.reset()
    callers.CALLERS.another(threading.get_ident())  # this thread calls alone
    assert racer.run_server(lambda t: t * 2, "frozen", (x,)) is not NOT_RACED
    callers.CALLERS.another(threading.get_ident() + 1)  # a second thread has called
    assert racer.run_server(lambda t: t * 2, "frozen", (x,)) is NOT_RACED
    assert seen == [True, False]
    assert [e.what for e in events] == ["dropped"]
    assert "refreshing its frozen weights" in events[0].why


def _serve_racing(fns: dict[str, Any], calls: int) -> list[race.RaceEvent]:
    """Serve `calls` calls as the guard does, the server racing "challenger" on the calls
    the race samples, until the race is over; its events."""
    import torch

    from chain.run.race import Racer

    r = Race("server", ["challenger"])
    events: list[race.RaceEvent] = []
    racer = Racer(r, fns, (0,), lambda e, fn: events.append(e))
    x = torch.ones(3)
    for _ in range(calls):
        if r.over:
            break
        serving = fns[r.stats.server]
        if (name := r.due()) is not None:
            racer.run_server(serving, name, (x,))
        else:
            serving(x)
    return events


@pytest.mark.parametrize(("once", "server_runs"), [(False, 4), (True, 2)])
def test_a_graph_with_in_place_writes_runs_its_server_once_a_pair(
    once: bool, server_runs: int
) -> None:
    """Each timed run follows its own untimed run, except the server's where the graph has
    in-place writes (raced because they changed nothing at selection): there it runs once
    a pair, so a write that accumulates is never applied twice."""
    import torch

    from chain.run.race import UNTIMED, Racer

    calls = {"server": 0, "challenger": 0}

    def contender(name: str) -> Any:
        def run(x: torch.Tensor) -> torch.Tensor:
            calls[name] += 1
            return x * 2

        return run

    fns = {name: contender(name) for name in calls}
    racer = Racer(Race("server", ["challenger"]), fns, (0,), lambda e, fn: None, once=once)
    x = torch.ones(3)
    for _ in range(2):
        assert racer.run_server(fns["server"], "challenger", (x,)) is not None
    assert calls == {"server": server_runs, "challenger": 2 * (UNTIMED + 1)}, calls
