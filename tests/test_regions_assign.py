"""The cheapest assignment of backends to regions (chain.judge.assign), on synthetic
costs: exact, deterministic, independent of the machine."""

from __future__ import annotations

import itertools

import pytest

from chain.judge.assign import cheapest

ORT, IND, EAG = "onnxruntime", "inductor", "eager"
CROSS = {(ORT, IND): 0.2, (IND, ORT): 0.2, (ORT, EAG): 0.1, (EAG, ORT): 0.1,
         (IND, EAG): 0.1, (EAG, IND): 0.1}  # fmt: skip


def brute(costs: list[dict[str, float]], crossings: dict[tuple[str, str], float]) -> float:
    """Every path's cost, the least of them."""
    best = float("inf")
    for path in itertools.product(*[list(c) for c in costs]):
        total = sum(c[b] for c, b in zip(costs, path, strict=True))
        total += sum(crossings.get((a, b), 0.0) for a, b in itertools.pairwise(path))
        best = min(best, total)
    return best


def test_a_dual_encoder_splits_where_the_towers_meet() -> None:
    vision = {ORT: 1.8, IND: 5.2, EAG: 6.0}
    text = {ORT: 11.2, IND: 6.6, EAG: 12.0}
    a = cheapest([vision, vision, text, text], CROSS)
    assert a.backends == (ORT, ORT, IND, IND)
    assert a.total == pytest.approx(1.8 * 2 + 6.6 * 2 + 0.2)
    assert a.crossings == pytest.approx(0.2) and a.switches == 1


def test_a_crossing_dearer_than_the_gain_keeps_one_backend() -> None:
    costs = [{ORT: 1.0, IND: 1.1}, {ORT: 1.1, IND: 1.0}]
    assert cheapest(costs, CROSS).backends == (ORT, ORT)  # 0.1 saved < 0.2 to cross
    cheap = {k: 0.01 for k in CROSS}
    assert cheapest(costs, cheap).backends == (ORT, IND)


def test_a_region_some_backend_cannot_run() -> None:
    costs = [{ORT: 1.0, IND: 2.0}, {IND: 2.0, EAG: 2.5}, {ORT: 1.0, IND: 2.0}]
    a = cheapest(costs, CROSS)
    assert a.backends[1] in (IND, EAG)
    assert a.total == pytest.approx(brute(costs, CROSS))


def test_ties_go_to_the_first_listed_and_repeat_exactly() -> None:
    costs = [{IND: 1.0, ORT: 1.0}] * 3
    assert cheapest(costs, CROSS).backends == (IND, IND, IND)
    assert cheapest(costs, CROSS) == cheapest(costs, CROSS)


@pytest.mark.parametrize("seed", range(20))
def test_matches_every_path_tried(seed: int) -> None:
    import random

    rng = random.Random(seed)
    names = [ORT, IND, EAG]
    costs = [{b: rng.uniform(0.1, 3.0) for b in rng.sample(names, rng.randint(1, 3))}
             for _ in range(rng.randint(1, 6))]  # fmt: skip
    crossings = {(a, b): rng.uniform(0, 1.0) for a in names for b in names if a != b}
    a = cheapest(costs, crossings)
    assert a.total == pytest.approx(brute(costs, crossings))
    assert all(b in c for b, c in zip(a.backends, costs, strict=True))


def test_errors_name_what_is_missing() -> None:
    with pytest.raises(ValueError, match="no regions"):
        cheapest([], CROSS)
    with pytest.raises(ValueError, match="region 1 has no backend"):
        cheapest([{ORT: 1.0}, {}], CROSS)
    with pytest.raises(KeyError, match="from onnxruntime to tensorrt"):
        cheapest([{ORT: 1.0}, {"tensorrt": 1.0}], CROSS)
