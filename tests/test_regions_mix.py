"""Mixed regions in mode `fastest` (chain.select.regions.mix), with speeds that differ by
design: each tower of the model holds an op that sleeps 3 ms in eager, and the test
backends are real graph rewrites that drop such an op (an identity in value). The delays
pass on a virtual clock that the timing rounds read (tests/clock.py), and the timing's
evidence says the machine is quiet, so every decision comes out the same on a busy machine.
Decisions are asserted on outcomes and reasons, never on wall time."""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx, nn

import chain.judge.rounds as rounds
from backends.errors import Unsupported
from chain import chain
from chain.report.records import Status
from chain.select.regions.mix import REGIONS
from tests.clock import ROUNDS, VirtualClock
from tests.helpers import in_threads

SLEEP_S = 3e-3
# the delays' sleep: the virtual clock's while a test runs (the `quiet_clock` fixture)
_sleep: list[Callable[[float], None]] = [time.sleep]


@pytest.fixture(autouse=True)
def quiet_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """Delays on the virtual clock the timing rounds read; a quiet machine on their evidence."""
    clock = VirtualClock().install(monkeypatch, ROUNDS)
    monkeypatch.setattr(rounds, "running_threads", lambda: None)
    monkeypatch.setattr(rounds, "load_average", lambda: 0.0)
    _sleep[0] = clock.sleep
    yield clock
    _sleep[0] = time.sleep


@torch.library.custom_op("regions_test::slow_a", mutates_args=())
def slow_a(x: torch.Tensor) -> torch.Tensor:
    """The identity, 3 ms late (eager's cost of tower a)."""
    _sleep[0](SLEEP_S)
    return x.clone()


@torch.library.custom_op("regions_test::slow_b", mutates_args=())
def slow_b(x: torch.Tensor) -> torch.Tensor:
    """The identity, 3 ms late (eager's cost of tower b)."""
    _sleep[0](SLEEP_S)
    return x.clone()


@slow_a.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@slow_b.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


A, B = torch.ops.regions_test.slow_a.default, torch.ops.regions_test.slow_b.default


class Tower(nn.Module):
    """Linear layers, a norm and one slow op: a region of its own (over 8 ops)."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor], dim: int = 16) -> None:
        super().__init__()
        self.op = op
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.up(x))
        h = self.op(self.down(h))
        return self.norm(torch.tanh(h) * 0.5 + x)


class TwoTowers(nn.Module):
    """Tower a then tower b (each slow in eager on its own op)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Tower(slow_a)
        self.b = Tower(slow_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def rewrite(
    name: str,
    drop: tuple[Any, ...],
    *,
    needs: tuple[Any, ...] = (),
    sleep_s: float = 0.0,
    wrong: bool = False,
) -> Callable[..., Any]:
    """A backend that drops the ops in `drop` from the graph (they are identities in
    value; `wrong`: replaced by x + 1 instead), refuses graphs without all of `needs`,
    and sleeps `sleep_s` per call."""

    def compile_fn(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        targets = {n.target for n in gm.graph.nodes}
        if missing := [op for op in needs if op not in targets]:
            raise Unsupported(f"{name} needs {missing}")
        new = copy.deepcopy(gm)
        for node in list(new.graph.nodes):
            if node.target in drop:
                if wrong:
                    with new.graph.inserting_after(node):
                        plus = new.graph.call_function(torch.add, (node.args[0], 1.0))
                    node.replace_all_uses_with(plus)
                else:
                    node.replace_all_uses_with(node.args[0])
                new.graph.erase_node(node)
        new.recompile()

        def run(*args: Any) -> Any:
            if sleep_s:
                _sleep[0](sleep_s)
            return new(*args)

        return run

    compile_fn.__name__ = name
    return compile_fn


def mixing_chain() -> Any:
    """drop_a then drop_b in mode `fastest` with regions, on a fresh dynamo (graphs anew)."""
    torch._dynamo.reset()
    return chain(rewrite("drop_a", (A,)), rewrite("drop_b", (B,)), mode="fastest", regions=True)


def regions_attempt(backend: Any) -> Any:
    """The regions attempt of the first graph (each shape is a graph of its own: dynamic=False)
    and its record, after checking every graph's record has one."""
    records = backend.report.graphs
    assert records and all(any(a.backend == REGIONS for a in r.attempts) for r in records)
    return next(a for a in records[0].attempts if a.backend == REGIONS), records[0]


def check_calls(fast: Callable[..., Any], model: nn.Module, grad: Any) -> None:
    for shape in ((2, 16), (3, 16)):
        x = torch.randn(*shape)
        with grad():
            torch.testing.assert_close(fast(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_each_region_to_its_fastest_backend(grad: Any) -> None:
    model = TwoTowers().eval()
    backend = mixing_chain()
    fast = torch.compile(model, backend=backend, dynamic=False)
    check_calls(fast, model, grad)
    attempt, record = regions_attempt(backend)
    assert record.winner == REGIONS, attempt.reason
    assert attempt.reason.startswith("faster than whole-graph drop_")
    rows = attempt.details["regions"]
    assert [r["backend"] for r in rows[:1]] == ["drop_a"] and rows[-1]["backend"] == "drop_b"
    beaten = [a for a in record.attempts if a.backend in ("drop_a", "drop_b")]
    assert all(a.status is Status.SLOWER for a in beaten)
    assert any("the mixed regions beat it" in a.reason for a in beaten)
    assert attempt.details["crossings_ms"]  # measured between the backends that ran
    assert attempt.speedup is not None and attempt.speedup > 1.0


def test_the_stitched_graph_serves_threads() -> None:
    model = TwoTowers().eval()
    backend = mixing_chain()
    fast = torch.compile(model, backend=backend, dynamic=False)
    x = torch.randn(2, 16)
    with torch.no_grad():
        want = model(x)
        fast(x)

    def call() -> None:
        for _ in range(5):
            with torch.no_grad():
                torch.testing.assert_close(fast(x), want, rtol=1e-5, atol=1e-5)

    in_threads(call)
    assert backend.report.graphs[0].winner == REGIONS


def test_a_region_whose_best_fails_verification_is_served_by_the_next() -> None:
    torch._dynamo.reset()
    model = TwoTowers().eval()
    backend = chain(
        rewrite("wrong_b", (B,), wrong=True),  # the fastest on tower b, and wrong
        rewrite("drop_a", (A,)),
        rewrite("drop_b_late", (B,), sleep_s=1e-3),  # right on b, 1 ms slower than wrong_b
        mode="fastest",
        regions=True,
    )
    fast = torch.compile(model, backend=backend, dynamic=False)
    check_calls(fast, model, torch.no_grad)
    attempt, record = regions_attempt(backend)
    assert record.winner == REGIONS, attempt.reason
    b = attempt.details["regions"][-1]
    assert b["backend"] == "drop_b_late"
    assert b["failed"]["wrong_b"].startswith("mismatch")
    assert "wrong_b" not in b["ms"]
    assert attempt.details["regions"][0]["backend"] == "drop_a"


def test_a_stitched_graph_slower_than_the_whole_graph_winner_is_not_kept() -> None:
    torch._dynamo.reset()
    model = TwoTowers().eval()
    backend = chain(
        rewrite("drop_a_late", (A,), sleep_s=1e-3),  # each region 1 ms dearer than ...
        rewrite("drop_b_late", (B,), sleep_s=1e-3),
        rewrite("drop_both", (A, B), needs=(A, B)),  # ... the whole graph, which only it takes
        mode="fastest",
        regions=True,
    )
    fast = torch.compile(model, backend=backend, dynamic=False)
    check_calls(fast, model, torch.no_grad)
    attempt, record = regions_attempt(backend)
    assert record.winner == "drop_both"
    assert attempt.status is Status.SLOWER
    assert "not faster than whole-graph drop_both" in attempt.reason
    rows = attempt.details["regions"]
    assert (rows[0]["backend"], rows[-1]["backend"]) == ("drop_a_late", "drop_b_late")
    assert "drop_both" not in attempt.details["regions"][0]["ms"]  # it refused a region


def test_dynamic_graphs_are_declined_with_the_reason() -> None:
    model = TwoTowers().eval()
    backend = mixing_chain()
    fast = torch.compile(model, backend=backend, dynamic=True)
    check_calls(fast, model, torch.no_grad)
    attempt, record = regions_attempt(backend)
    assert attempt.status is Status.UNSUPPORTED
    assert "symbolic sizes" in attempt.reason
    assert record.winner in ("drop_a", "drop_b")


def test_regions_needs_fastest_mode() -> None:
    from backends.errors import InvalidOption

    with pytest.raises(InvalidOption, match="regions=True needs mode='fastest'"):
        chain("eager", regions=True)
    assert chain("eager", mode="fastest").selection.regions is False


def test_the_report_shows_each_region_its_winner_and_the_crossings(tmp_path: Any) -> None:
    from chain.report.report import Report

    model = TwoTowers().eval()
    backend = mixing_chain()
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(torch.randn(2, 16))
    path = backend.report.save(tmp_path / "run.json")
    for report in (backend.report, Report.load(path)):  # live, and read back from its file
        text = report.render(width=200)
        assert "graph 0: regions won (faster than whole-graph drop_" in text
        assert " a (" in text and "-> drop_a: drop_a " in text
        assert " b (" in text and "-> drop_b: drop_b " in text
        assert "crossings: drop_a -> drop_b " in text
        assert "-> drop_b: drop_b" in report.to_markdown()


def test_the_html_report_draws_the_regions(tmp_path: Any) -> None:
    from chain.report.look import html
    from chain.report.report import Report

    backend = mixing_chain()
    with torch.no_grad():
        torch.compile(TwoTowers().eval(), backend=backend, dynamic=False)(torch.randn(2, 16))
    path = backend.report.save(tmp_path / "run.json")
    page = html.render(Report.load(path))
    assert '<div id="regions-0"><p>Mixed regions (won)' in page
    assert page.count("<rect ") >= 2 and "a: drop_a, " in page and "b: drop_b, " in page
    assert "<td>drop_a</td>" in page and "<td>drop_b</td>" in page


def _remembering(store: Any) -> Any:
    torch._dynamo.reset()
    return chain(
        rewrite("drop_a", (A,)), rewrite("drop_b", (B,)), mode="fastest", regions=True,
        memory=True, store=store,
    )  # fmt: skip


@pytest.mark.parametrize("grad", [torch.no_grad, torch.inference_mode])
def test_a_mixed_winner_is_remembered_and_a_warm_process_builds_its_plan(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, grad: Any
) -> None:
    """Selected once, stored with its plan; a warm start (fresh dynamo, same store) cuts the
    graph, compiles each part under the remembered backend, verifies the whole and serves
    it: no region tried under the other candidates, nothing timed."""
    import chain.select.regions.mix as mix

    model = TwoTowers().eval()
    cold = _remembering(tmp_path / "store")
    check_calls(torch.compile(model, backend=cold, dynamic=False), model, grad)
    assert cold.report.graphs[0].winner == REGIONS
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()], "nothing stored"

    def untried(*args: Any) -> Any:
        raise AssertionError("a region was tried on a warm start")

    monkeypatch.setattr(mix, "trial", untried)
    monkeypatch.setattr(mix, "_timed", untried)
    warm = _remembering(tmp_path / "store")
    check_calls(torch.compile(model, backend=warm, dynamic=False), model, grad)
    for record in warm.report.graphs:
        assert record.winner == REGIONS, record.notes
        won = record.winning_attempt
        assert won.reason.startswith("the remembered plan: 2 parts (drop_a, drop_b)"), won
        assert won.details["remembered"]["compiled"] is True
        assert any("memory: hit" in n or "remembered" in n for n in record.notes), record.notes


def test_a_remembered_plan_that_no_longer_fits_the_graph_is_selected_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph is cut into other regions than the stored plan's (a changed model, a
    changed cut): the hit is a miss with the reason, and the graph is mixed anew."""
    import chain.select.regions.mix as mix

    model = TwoTowers().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.compile(model, backend=_remembering(tmp_path / "store"), dynamic=False)(x)
    real = mix.cut

    def other_keys(gm: Any, inputs: Any) -> Any:
        regions = real(gm, inputs)
        first = dataclasses.replace(regions.regions[0], key="changed")
        return dataclasses.replace(regions, regions=(first, *regions.regions[1:]))

    monkeypatch.setattr(mix, "cut", other_keys)
    warm = _remembering(tmp_path / "store")
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=warm, dynamic=False)(x), model(x))
    [record] = warm.report.graphs
    notes = " | ".join(record.notes)
    assert "other regions than the remembered plan" in notes, notes
    assert any(a.backend == REGIONS and "remembered" not in a.reason for a in record.attempts)


class ThreeTowers(nn.Module):
    """Two towers of the same structure (slow in eager on op a), then tower b."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Tower(slow_a)
        self.a2 = Tower(slow_a)
        self.b = Tower(slow_b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a2(self.a(x)))


def test_consecutive_regions_of_one_backend_become_one_part() -> None:
    model = ThreeTowers().eval()
    backend = mixing_chain()
    fast = torch.compile(model, backend=backend, dynamic=False)
    check_calls(fast, model, torch.no_grad)
    attempt, record = regions_attempt(backend)
    assert record.winner == REGIONS, attempt.reason
    rows, parts = attempt.details["regions"], attempt.details["parts"]
    assert [r["backend"] for r in rows] == ["drop_a", "drop_a", "drop_b"]
    assert rows[0]["key"] == rows[1]["key"] and attempt.details["unique"] == 2  # one trial
    assert [p["backend"] for p in parts] == ["drop_a", "drop_b"]
    assert parts[0]["ops"] == rows[0]["ops"] + rows[1]["ops"]
    assert "parts (consecutive regions of one backend joined): " in backend.report.render(200)
