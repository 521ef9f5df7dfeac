"""The summary leads with what holds: the end-to-end figure weighs graphs by their eager
time and leaves noisy graphs out (shown apart, marked); the HTML page draws noisy bars
apart and stays small (no charting library inlined)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chain import Attempt, GraphRecord, Report, Status, chain
from chain.report.attempts import TimingEvidence
from tests import faults
from tests.clock import ROUNDS, VirtualClock
from tests.helpers import compile_and_check
from tests.models import build

CLEAN = TimingEvidence(rounds=24, seconds=0.2, load=0.5, cpus=2)
BUSY = TimingEvidence(rounds=12, seconds=0.2, load=3.0, cpus=2, noisy=("the machine was busy",))


def _graph(
    gid: int, nodes: int, eager_ms: float, winner: str, ms: float, ev: TimingEvidence
) -> GraphRecord:
    won = Attempt(winner, Status.WON, "", latency_ms=ms, speedup=eager_ms / ms, evidence=ev)
    return GraphRecord(
        id=gid, fingerprint=f"f{gid}", origin=f"forward (model.py:{gid})", num_nodes=nodes,
        ops={}, inputs=[], attempts=(won,), winner=winner, eager_ms=eager_ms,
    )  # fmt: skip


def synthetic() -> Report:
    """The demo's case: eager wins the big main graph; a noisy 6-node head at 1017x."""
    return Report(
        [
            _graph(0, 126, 5.0, "eager", 5.0, CLEAN),
            _graph(1, 20, 1.0, "onnxruntime", 0.5, CLEAN),
            _graph(2, 6, 5.70, "onnxruntime", 5.70 / 1017, BUSY),
        ]
    )


def test_headline_weighs_by_eager_time_and_leaves_noisy_graphs_out() -> None:
    report = synthetic()
    s = report.summary()
    assert s["speedup"] == round((5.0 + 1.0) / (5.0 + 0.5), 4)  # 1.09x, not 2x or 5x
    assert s["noisy_graphs"] == [2]
    assert s["noisy_speedup"] == round(1017.0, 4)
    line = report.summary_line()
    assert line.startswith("1.09x end to end over 2 graph(s) whose timing holds")
    assert "left out: 1 noisy graph(s), their figures may not hold (graph(s) 2)" in line
    assert line.index("1.09x") < line.index("1017")


def test_all_noisy_gives_no_headline() -> None:
    report = Report([_graph(0, 6, 1.0, "onnxruntime", 0.1, BUSY)])
    assert report.summary()["speedup"] is None
    assert report.summary_line().startswith("no end-to-end figure: every timed graph was noisy")


def test_html_draws_noisy_bars_apart_and_stays_small(tmp_path: Path) -> None:
    page = synthetic().save_html(tmp_path / "r.html")
    text = page.read_text()
    assert text.count('class="bar-noisy"') == 1 and text.count('class="bar-clean"') == 2
    assert "<script" not in text and "http://" not in text.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert page.stat().st_size < 40_000, page.stat().st_size


def test_html_page_size_is_bounded_for_many_graphs(tmp_path: Path) -> None:
    graphs = [_graph(i, 10, 1.0, "eager", 1.0, CLEAN) for i in range(40)]
    page = Report(graphs).save_html(tmp_path / "r.html")
    assert page.stat().st_size < 400_000, page.stat().st_size


def test_one_eager_time_per_graph_in_table_and_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate timed against eager loses; eager, named next, wins on that same eager
    time: the graph's eager ms, eager's latency and the loser's "vs eager" agree. The
    candidate's 50 ms pass on the virtual clock: slower than eager under any load."""
    torch._dynamo.reset()
    clock = VirtualClock().install(monkeypatch, ROUNDS)
    model, args = build("mlp")
    backend = chain(faults.Sleeps(sleep=clock.sleep), "eager", measure_budget_s=0.05, memory=False)
    compile_and_check(model, args, backend, calls=1)
    [graph] = backend.report.graphs
    slow, eager = graph.attempts
    assert (slow.status, eager.status) == (Status.SLOWER, Status.WON)
    assert eager.latency_ms == graph.eager_ms
    assert f"vs eager {graph.eager_ms:.3f} ±" in slow.reason, (slow.reason, graph.eager_ms)
