"""Per-shape buckets (chain.run.buckets): hot shapes of a graph with symbolic sizes served by a
fixed-shape backend compiled for them, cold ones by the general (symbolic) winner.

The backends registered here are real compilers (static inductor, eager with a delay, eager
that fails on demand), each declared with the registry's `dynamic` flag. Their delays are on
a virtual clock (tests/clock.py) that the timing rounds read: a bucket's decision against the
general path comes out the same on a loaded machine as on a quiet one.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx, nn

import chain
from backends.errors import InvalidOption
from backends.registry import registry
from chain.report.bucket_stats import DEMOTED, EVICTED, LOST, SERVING, BucketStats
from chain.report.report import Report
from tests.clock import ROUNDS, VirtualClock
from tests.models import build_extra

Fn = Callable[..., Any]


@pytest.fixture
def bert() -> nn.Module:
    model, _ = build_extra("bert")
    return model


@pytest.fixture
def backends(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Test backends, registered for the test only; `served[name]` counts calls per length
    (the size of the last dim of the token ids, the graph's first tensor input of rank 2).
    Their delays pass on the virtual clock the timing rounds read."""
    clock = VirtualClock().install(monkeypatch, ROUNDS)
    # a quiet machine on the timing's evidence: a noisy bucket timing is raced at run time
    # (tests/test_bucket_race.py); these tests are about the decisions a timing takes
    import chain.judge.rounds as rounds

    monkeypatch.setattr(rounds, "running_threads", lambda: None)
    monkeypatch.setattr(rounds, "load_average", lambda: 0.0)
    served: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    state: dict[str, Any] = {"served": served, "fail": False, "wrong": False, "compile_wait": None}

    def counted(name: str, fn: Fn, sleep_s: float = 0.0) -> Fn:
        def run(*args: Any) -> Any:
            lengths = [a.shape[1] for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
            served[name][lengths[0] if lengths else -1] += 1
            if name == "flaky_fixed" and state["fail"]:
                raise RuntimeError("device lost")
            if sleep_s:
                clock.sleep(sleep_s)
            out = fn(*args)
            if name == "flaky_fixed" and state["wrong"]:  # right shape, wrong values
                return [o + 1.0 if o.is_floating_point() else o for o in out]
            return out

        return run

    with registry.snapshot():

        @registry.register("static_inductor", dynamic=False)
        def static_inductor(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Inductor on a graph of fixed shapes."""
            inductor = registry.lookup("inductor").compiler
            return counted("static_inductor", inductor(gm, example_inputs))

        @registry.register("sleepy_fixed", dynamic=False)
        def sleepy_fixed(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Eager plus 5 ms a call: a fixed-shape backend that always loses."""
            return counted("sleepy_fixed", gm.forward, sleep_s=0.005)

        @registry.register("sleepy_general")
        def sleepy_general(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Eager plus 3 ms a call: a slow general path any fixed-shape eager beats."""
            return counted("sleepy_general", gm.forward, sleep_s=0.003)

        @registry.register("flaky_fixed", dynamic=False)
        def flaky_fixed(gm: fx.GraphModule, example_inputs: list[Any]) -> Fn:
            """Eager, raising once `fail` is set; its compile waits on `compile_wait`."""
            if (wait := state["compile_wait"]) is not None:
                wait()
            return counted("flaky_fixed", gm.forward)

        yield state


def run(model: nn.Module, compiled: Fn, length: int) -> None:
    """One call at `length`, checked against eager."""
    torch.manual_seed(length)
    x = torch.randint(0, 100, (2, length))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).last_hidden_state, model(x).last_hidden_state)


def stats(c: chain.Chain) -> BucketStats:
    (graph,) = [g for g in c.report.graphs if g.buckets is not None]
    assert graph.buckets is not None
    return graph.buckets


def by_shape(c: chain.Chain) -> dict[int, tuple[str, str | None, int]]:
    """{length: (state, winner, calls served)}, read from the bucket's shape text."""
    out = {}
    for b in stats(c).buckets:
        length = int(b.shape.split("=")[1].split(",")[0])
        out[length] = (b.state, b.winner, b.calls)
    return out


def test_hot_lengths_are_served_by_static_inductor_cold_ones_by_the_general_path(
    bert: nn.Module, backends: dict[str, Any]
) -> None:
    """3 hot lengths (6 calls each), 5 cold ones (2 calls each, below bucket_after=3): the
    hot ones get a static inductor bucket after their 3rd call, the cold ones run the
    general winner (static_inductor declines the symbolic graph). The general path is eager
    slowed by 3 ms a call, so that static inductor's win does not hang on a close timing."""
    c = chain.chain(
        "static_inductor", "sleepy_general", bucket_after=3, eager_floor=False,
        measure_budget_s=0.1,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    hot, cold = (16, 24, 32), (9, 11, 13, 19, 27)
    run(bert, compiled, 8)  # graph 0: static, length 8 (static_inductor wins it)
    for round_ in range(6):
        for length in hot + (cold if round_ < 2 else ()):
            run(bert, compiled, length)
    assert [g.winner for g in c.report.graphs] == ["static_inductor", "sleepy_general"]
    assert stats(c).candidates == ["static_inductor", "sleepy_general"]
    tried = [f"{b.shape}: {b.reason}: {[str(a) for a in b.attempts]}" for b in stats(c).buckets]
    assert by_shape(c) == {n: (SERVING, "static_inductor", 3) for n in hot}, tried
    served = backends["served"]["static_inductor"]
    for length in cold:
        assert served[length] == 0
        assert backends["served"]["sleepy_general"][length] == 2  # the general path ran them
    for length in hot:  # 3 served calls each, plus its verification and timing runs
        assert served[length] > 3
    for bucket in stats(c).buckets:
        assert bucket.speedup is not None and bucket.general == "sleepy_general"
        names = [a.backend for a in bucket.attempts]
        assert names == ["static_inductor", "sleepy_general", "general:sleepy_general"]
    table = c.report.render(width=200)
    assert "buckets" in table and "static_inductor" in table


def test_a_bucket_that_would_lose_is_not_used(bert: nn.Module, backends: dict[str, Any]) -> None:
    c = chain.chain("sleepy_fixed", "eager", bucket_after=2, measure_budget_s=0.05)
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16):
        run(bert, compiled, length)
    before = backends["served"]["sleepy_fixed"][16]
    for _ in range(5):
        run(bert, compiled, 16)
    ((state, winner, calls),) = by_shape(c).values()
    assert (state, winner, calls) == (LOST, None, 0)
    (bucket,) = stats(c).buckets
    assert bucket.reason.startswith("no fixed-shape candidate beat the general path by 1% (")
    assert bucket.attempts[0].status is chain.Status.SLOWER
    assert "vs the general path's" in bucket.attempts[0].reason
    assert backends["served"]["sleepy_fixed"][16] == before  # never ran once lost


def test_eviction_holds_the_bound_and_evicts_the_least_used(
    bert: nn.Module, backends: dict[str, Any]
) -> None:
    """max_buckets=2: A is used most, B less; C, once called more often than B (2 calls
    before its bucket, 3 served), replaces B; a new bucket is not evicted at once."""
    c = chain.chain(
        "flaky_fixed", "sleepy_general", bucket_after=2, max_buckets=2, eager_floor=False,
        measure_budget_s=0.05,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    a, b, cc = 10, 12, 14
    for length in [8, a, *[a] * 6, *[b] * 5, cc, cc]:
        run(bert, compiled, length)
    assert by_shape(c) == {a: (SERVING, "flaky_fixed", 5), b: (SERVING, "flaky_fixed", 3)}
    for _ in range(2):  # C's 4th call: fewer than B's 5 uses
        run(bert, compiled, cc)
    assert cc not in by_shape(c)
    for _ in range(2):  # C's 6th call: more
        run(bert, compiled, cc)
    states = by_shape(c)
    assert states[b][0] == EVICTED and states[cc] == (SERVING, "flaky_fixed", 0)
    assert len(stats(c).serving()) == 2
    evicted = next(x for x in stats(c).buckets if x.state == EVICTED)
    assert evicted.reason == "least used of 2 (max_buckets)"
    general = backends["served"]["sleepy_general"]
    run(bert, compiled, b)  # evicted: the general path again
    assert general[b] >= 1 and backends["served"]["sleepy_general"][b] == general[b]


def test_a_bucket_that_raises_at_run_time_is_demoted(
    bert: nn.Module, backends: dict[str, Any], tmp_path: Any
) -> None:
    path = tmp_path / "run.json"
    c = chain.chain(
        "flaky_fixed", "sleepy_general", bucket_after=2, eager_floor=False,
        measure_budget_s=0.05, report_path=path,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16, 16):
        run(bert, compiled, length)
    tried = [str(a) for a in stats(c).buckets[0].attempts]
    assert by_shape(c)[16] == (SERVING, "flaky_fixed", 1), tried
    backends["fail"] = True
    run(bert, compiled, 16)  # the bucket raises; the general path answers this call
    run(bert, compiled, 16)
    (bucket,) = stats(c).buckets
    assert (bucket.state, bucket.reason) == (DEMOTED, "at run time: RuntimeError: device lost")
    assert backends["served"]["flaky_fixed"][16] > 0
    saved = Report.load(path).graphs[1].buckets
    assert saved is not None and saved.buckets[0].state == DEMOTED
    assert saved.to_dict() == stats(c).to_dict()


def test_a_bucket_caught_wrong_at_run_time_is_demoted_and_the_call_is_right(
    bert: nn.Module, backends: dict[str, Any]
) -> None:
    """A bucket's calls are watched as a winner's: re-verified against eager (every call at
    reverify_rate=1), a wrong one is demoted and the general path answers that call."""
    c = chain.chain(
        "flaky_fixed", "sleepy_general", bucket_after=2, eager_floor=False,
        measure_budget_s=0.05, reverify_rate=1.0,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16, 16):
        run(bert, compiled, length)
    assert by_shape(c)[16] == (SERVING, "flaky_fixed", 1)
    backends["wrong"] = True
    general = backends["served"]["sleepy_general"][16]
    run(bert, compiled, 16)  # checked against eager inside `run`: the answer is right
    (bucket,) = stats(c).buckets
    assert bucket.state == DEMOTED
    assert bucket.reason.startswith("at run time: Demoted: at call 2: output 0: RMSE vs float64")
    assert backends["served"]["sleepy_general"][16] == general + 1
    run(bert, compiled, 16)  # the general path from now on
    assert backends["served"]["sleepy_general"][16] == general + 2


def test_once_threads_call_the_model_hot_shapes_are_not_built_and_the_general_path_serves(
    bert: nn.Module, backends: dict[str, Any]
) -> None:
    """Building a bucket traces the graph, which makes other threads' calls of a compiled
    model raise or recompile (chain.run.callers): once a second thread has called, a hot
    shape is not built, says why, and every call is right; one thread alone builds."""
    c = chain.chain(
        "flaky_fixed", "sleepy_general", bucket_after=3, eager_floor=False,
        measure_budget_s=0.05,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    for length in (8, 12, 16, 16, 16):  # one thread: 16 turns hot and is built
        run(bert, compiled, length)
    assert by_shape(c)[16][:2] == (SERVING, "flaky_fixed")
    errors: list[BaseException] = []

    def call(length: int, times: int) -> None:
        try:
            for _ in range(times):
                run(bert, compiled, length)
        except BaseException as exc:
            errors.append(exc)

    others = [threading.Thread(target=call, args=(n, 4)) for n in (12, 12, 20, 20)]
    for t in others:
        t.start()
    for t in others:
        t.join(120)
    assert not errors
    shapes = by_shape(c)
    assert shapes[16][:2] == (SERVING, "flaky_fixed")  # built before: still serves
    for length in (12, 20):  # hot now, from several threads: not built
        assert shapes[length][:2] == (LOST, None)
    reasons = {b.reason for b in stats(c).buckets if b.state == LOST}
    assert all(r.startswith("not built: ") and "threads call" in r for r in reasons), reasons
    assert backends["served"]["flaky_fixed"][12] == 0  # never compiled for them
    assert backends["served"]["sleepy_general"][12] >= 1 + 8  # the general path ran them


def test_buckets_off_and_bad_options() -> None:
    assert chain.chain("eager").bucket_after is None  # off unless asked for
    c = chain.chain("eager", bucket_after=None)
    assert c.bucket_after is None
    with pytest.raises(InvalidOption, match="max_buckets"):
        chain.chain("eager", max_buckets=0)
    with pytest.raises(InvalidOption, match="bucket_after"):
        chain.chain("eager", bucket_after=1.5)


# -- buckets in the remembered-decision store (chain.memory) ----------------------------

_PROCESS = """
import json, sys
import pytest, torch
import chain, chain.judge.rounds as rounds, chain.select.candidates as candidates
from backends.registry import registry
from tests.clock import ROUNDS, VirtualClock
from tests.models import build_extra

# delays on the virtual clock, and a quiet machine on the timing's evidence: a noisy timing
# is not remembered (tests/test_decisions.py), and this test is about what is remembered
clock = VirtualClock().install(pytest.MonkeyPatch(), ROUNDS)
rounds.running_threads, rounds.load_average = (lambda: None), (lambda: 0.0)

compiled = []
real = candidates.try_backend
def counting(backend, *args, **kwargs):
    compiled.append(backend.name)
    return real(backend, *args, **kwargs)
candidates.try_backend = counting

@registry.register("static_inductor", dynamic=False)
def static_inductor(gm, example_inputs):
    return registry.lookup("inductor").compiler(gm, example_inputs)

@registry.register("sleepy_general")
def sleepy_general(gm, example_inputs):
    def run(*args):
        clock.sleep(0.003)
        return gm.forward(*args)
    return run

model, _ = build_extra("bert")
c = chain.chain("static_inductor", "sleepy_general", bucket_after=2, eager_floor=False,
                measure_budget_s=0.05, memory=True, store=sys.argv[2])
fast = torch.compile(model, backend=c)
with torch.no_grad():
    for length in [8] + [16, 24, 32] * 3:
        torch.manual_seed(length)
        x = torch.randint(0, 100, (2, length))
        torch.testing.assert_close(fast(x).last_hidden_state, model(x).last_hidden_state)
c.report.save(sys.argv[1])  # the calls served since the last build
print(json.dumps(compiled))
"""


@pytest.mark.slow
def test_a_second_process_builds_the_remembered_buckets_on_first_sight(tmp_path: Any) -> None:
    """Process 1 counts each length to bucket_after=2 and tries both candidates per shape;
    process 2, on the same store, compiles the remembered winner (static inductor) alone at
    each length's first call and keeps the decision's figures: 3 compiles instead of 6."""
    from tests.helpers import fresh_process

    def process(name: str) -> tuple[Report, list[str]]:
        compiled = fresh_process(_PROCESS, str(tmp_path / name), str(tmp_path / "store"))
        return Report.load(tmp_path / name), compiled

    def shapes(report: Report) -> dict[str, Any]:
        (graph,) = [g for g in report.graphs if g.buckets is not None]
        assert graph.buckets is not None
        return {b.shape.split(",")[0].split("=")[1]: b for b in graph.buckets.buckets}

    cold, cold_compiled = process("cold.json")
    cold_buckets = shapes(cold)
    assert sorted(cold_buckets) == ["16", "24", "32"], list(cold_buckets)
    for b in cold_buckets.values():
        assert (b.state, b.winner, b.calls, b.remembered) == (SERVING, "static_inductor", 1, None)
    assert cold.graphs[1].buckets.compiles() == 6  # type: ignore[union-attr]
    assert cold_compiled.count("static_inductor") == 2 + 3  # graph 0, graph 1 (declined), 3 buckets

    warm, warm_compiled = process("warm.json")
    assert warm_compiled == ["static_inductor", "sleepy_general", *["static_inductor"] * 3]
    warm_buckets = shapes(warm)
    assert sorted(warm_buckets) == sorted(cold_buckets)
    for shape, b in warm_buckets.items():
        before = cold_buckets[shape]
        assert (b.state, b.winner, b.calls) == (SERVING, "static_inductor", 2)  # from call 2
        assert b.remembered is not None and b.remembered["decided_at"]
        assert (b.speedup, b.latency_ms) == (before.speedup, before.latency_ms)
        (attempt,) = b.attempts  # compiled and verified now, not timed
        assert attempt.status is chain.Status.WON and attempt.max_abs_err is not None
        assert attempt.details["remembered"]["compiled"] is True
    graph = warm.graphs[1]
    assert graph.buckets is not None and graph.buckets.compiles() == 3
    assert "memory: 3 remembered bucket(s), built on first sight" in graph.notes
    table = warm.render(width=240)
    assert "remembered" in table


def _bucketed_report() -> Report:
    """A report with one graph and two buckets: one decided here, one remembered."""
    from chain.report.bucket_stats import Bucket
    from chain.report.records import Attempt, GraphRecord

    won = Attempt("static_inductor", chain.Status.WON, "", latency_ms=0.5)
    here = Bucket("s0=16, l_x_ (2, 16)", SERVING, "static_inductor", "inductor", calls=7,
                  latency_ms=0.5, general_ms=1.0, speedup=2.0, attempts=[won])  # fmt: skip
    old = Bucket("s0=24, l_x_ (2, 24)", SERVING, "static_inductor", "inductor", calls=3,
                 speedup=1.25, remembered={"decided_at": "2025-01-02T03:04:05+00:00",
                 "host": "h", "pid": 1})  # fmt: skip
    lost = Bucket("s0=32, l_x_ (2, 32)", LOST, None, "inductor", reason="<b>no</b> win")
    stats = BucketStats(2, 8, ["static_inductor"], [here, old, lost])
    graph = GraphRecord(0, "f", "model.forward", 10, {}, [], (won,), "inductor", buckets=stats)
    report = Report()
    report.graphs.append(graph)
    return report


def test_the_report_shows_each_bucket_in_the_table_markdown_json_and_html(tmp_path: Any) -> None:
    report = _bucketed_report()
    rows = report.bucket_rows()
    assert rows == [
        ["0", "s0=16, l_x_ (2, 16)", "serving", "static_inductor", "7", "2.00x", "here", "-",
         ""],
        ["0", "s0=24, l_x_ (2, 24)", "serving", "static_inductor", "3", "1.25x",
         "remembered 2025-01-02T03:04:05+00:00", "-", ""],
        ["0", "s0=32, l_x_ (2, 32)", "lost", "general:inductor", "0", "-", "here", "-",
         "<b>no</b> win"],
    ]  # fmt: skip
    table = report.render(width=240)
    assert "remembered 2025-01-02T03:04:05+00:00" in table and "2.00x" in table
    md = report.to_markdown()
    assert "| 0 | s0=16, l_x_ (2, 16) | serving | static_inductor | 7 | 2.00x | here | - |  |" in md
    loaded = Report.load(report.save(tmp_path / "r.json"))
    stats = loaded.graphs[0].buckets
    assert stats is not None and stats.to_dict() == report.graphs[0].buckets.to_dict()  # type: ignore[union-attr]
    assert stats.buckets[1].remembered == {
        "decided_at": "2025-01-02T03:04:05+00:00", "host": "h", "pid": 1,
    }  # fmt: skip
    page = report.save_html(tmp_path / "r.html").read_text()
    assert 'id="buckets-0"' in page
    assert "<td>s0=24, l_x_ (2, 24)</td>" in page and "remembered 2025-01-02T03:04:05" in page
    assert "&lt;b&gt;no&lt;/b&gt; win" in page and "<b>no</b> win" not in page


def test_max_bucket_mb_evicts_to_stay_under_the_bound(
    bert: nn.Module, backends: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bucket's artefact measured at 3 MiB (the measure is CUDA's allocator; on CPU it
    is set here): max_bucket_mb=7 holds two, a third evicts the least used, and a bucket
    larger than the bound alone is not served."""
    import chain.run.buckets.footprint as footprint

    sizes = {"mb": 3.0}
    monkeypatch.setattr(footprint, "measured", lambda inputs, build: (build(), sizes["mb"]))
    c = chain.chain(
        "flaky_fixed", "sleepy_general", bucket_after=2, eager_floor=False,
        measure_budget_s=0.05, max_bucket_mb=7,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    for length in [8, *[10] * 5, *[12] * 3, *[14] * 4]:
        run(bert, compiled, length)
    states = by_shape(c)
    assert states[10][0] == SERVING and states[14][0] == SERVING and states[12][0] == EVICTED
    evicted = next(b for b in stats(c).buckets if b.state == EVICTED)
    assert evicted.reason == "least used; 9.0 MiB over max_bucket_mb 7"
    assert [b.mb for b in stats(c).buckets] == [3.0, 3.0, 3.0]
    sizes["mb"] = 8.0
    for _ in range(6):  # built at its 6th call: more than the 4 uses of the least used
        run(bert, compiled, 16)
    big = by_shape(c)[16]
    assert big[:2] == (LOST, None)
    (bucket,) = [b for b in stats(c).buckets if b.shape.split(",")[0].endswith("=16")]
    assert bucket.reason == "its artefact, 8.0 MiB, exceeds max_bucket_mb 7"
    with pytest.raises(InvalidOption, match="max_bucket_mb"):
        chain.chain("eager", max_bucket_mb=-1)


@pytest.mark.cuda
def test_a_cuda_graphs_bucket_measures_its_pool() -> None:
    """A CUDA graph capture allocates its pool: the measure around the build sees it."""
    from chain.run.buckets.footprint import measured

    x = torch.randn(256, 1024, device="cuda")

    def build() -> Any:
        graph, static = torch.cuda.CUDAGraph(), x.clone()
        side = torch.cuda.Stream()  # warm up off the capture (cuBLAS makes its handle here)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static @ static.T
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = static @ static.T
        return graph, out

    (_, out), mb = measured([x], build)
    assert mb is not None and mb >= out.numel() * 4 / 2**20


def test_the_benchmark_on_cuda_fails_clearly_without_a_gpu() -> None:
    """`shape_buckets.py --device cuda` on a machine with no GPU: one line, exit status 1,
    before any model is built."""
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the GPU benchmark would run")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "shape_buckets.py"
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cuda"], capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "shape_buckets: --device cuda needs a CUDA device, and there is none here "
        "(torch.cuda.is_available() is False); run without --device on CPU"
    )
    assert done.stdout == ""


def test_the_benchmark_counts_hot_calls_only_at_the_lengths_built_in_the_warm_up() -> None:
    """`shape_buckets.py`'s share of hot calls bucketed (recorded counts, no model): a bucket
    built during the timed passes serves calls at a length outside the denominator, so it
    must not count (it did: 'hot calls bucketed' could exceed the hot calls); and the share is
    split by what the build timing said (a speedup under 1: the bucket measured slower)."""
    from benchmarks.shape_buckets import hot_calls

    before = {"s0=13, x (2, 13)": (2, 1.2), "s0=16, x (2, 16)": (0, 0.5)}
    built_later = {"s0=9, x (2, 9)": (40, 2.0)}  # hot in the timed passes only
    after = {"s0=13, x (2, 13)": (8, 1.2), "s0=16, x (2, 16)": (0, 0.5), **built_later}
    lengths = [13, 13, 13, 16, 16, 9, 9, 9, 9, 30]  # one pass
    assert hot_calls(before, after, lengths, rounds=2) == (6, 10)
    assert hot_calls(before, after, lengths, rounds=2, faster=True) == (6, 6)
    assert hot_calls(before, after, lengths, rounds=2, faster=False) == (0, 4)


def test_buckets_timed_against_a_general_path_that_switched_are_decided_again(
    bert: nn.Module, backends: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The general path switches (here as inductor's package handover, a promotion or a
    fallback do): a bucket that beat the callable before is retired at its shape's next
    call, and the shape decided again once hot, against the callable serving now. The new
    general path has no delay: static inductor no longer beats it, and the shape stays on
    it; answers right throughout."""
    import chain.select.serving as serving

    guards: list[Any] = []
    built = serving.GuardedGraph

    def kept(*args: Any, **kwargs: Any) -> Any:
        guards.append(built(*args, **kwargs))
        return guards[-1]

    monkeypatch.setattr(serving, "GuardedGraph", kept)
    c = chain.chain(
        "static_inductor", "sleepy_general", bucket_after=3, eager_floor=False,
        measure_budget_s=0.1,
    )  # fmt: skip
    compiled = torch.compile(bert, backend=c)
    for length in (8, 16, 16, 16, 16):  # graph 0 static at 8; 16 bucketed at its 3rd call
        run(bert, compiled, length)
    assert by_shape(c) == {16: (SERVING, "static_inductor", 1)}
    (general,) = [g for g in guards if g.buckets is not None]
    served = backends["served"]["static_inductor"][16]

    general.switch(general.gm.forward, general.active.backend_index, "sleepy_general")
    run(bert, compiled, 16)  # retired: the general path answers
    assert backends["served"]["static_inductor"][16] == served
    (old,) = stats(c).buckets
    assert old.state == EVICTED and "switched to sleepy_general" in (old.reason or ""), old
    for _ in range(2):  # hot again: decided at the 3rd call since, against the new callable
        run(bert, compiled, 16)
    old, new = stats(c).buckets
    assert new.state == LOST and new.reason.startswith("no fixed-shape candidate beat"), new
    assert new.general_ms is not None and old.general_ms is not None
    assert new.general_ms < old.general_ms / 2  # timed against the callable without delay
    after = backends["served"]["static_inductor"][16]
    for _ in range(3):
        run(bert, compiled, 16)
    assert backends["served"]["static_inductor"][16] == after  # lost: never runs again


@pytest.mark.parametrize("package", [False, True], ids=["jit-now", "package-now"])
def test_a_remembered_bucket_is_built_only_against_the_general_paths_form_it_was_timed_on(
    package: bool,
) -> None:
    """inductor's package and its JIT compile are 2-3x apart on a small BERT: a bucket
    timed against one is not served where the general path runs the other (decided again);
    an entry stored before the field existed was timed against the JIT compile."""
    import types

    from chain.run.buckets import remembered

    shapes: Any = types.SimpleNamespace(decode=tuple)
    base = {"shape": "s0=16", "state": SERVING, "winner": "inductor", "general": "inductor"}
    data = [
        {**base, "key": [16], "general_package": False},
        {**base, "key": [24], "general_package": True},
        {**base, "key": [32]},  # stored before `general_package`: the JIT compile's
    ]
    kept, notes = remembered.load(data, shapes, "inductor", package)
    assert sorted(kept) == ([(24,)] if package else [(16,), (32,)])
    assert len(notes) == (2 if package else 1), notes
    form = "its package" if package else "its JIT compile"
    assert all(f"which runs {form} now" in n for n in notes), notes
    assert remembered.from_package(types.SimpleNamespace(chain_details={"from_package": True}))
    assert not remembered.from_package(lambda: None)
