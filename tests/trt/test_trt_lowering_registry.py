"""The lowering pass registry API: decorator (append / index), dump, apply, remove, restore."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import fx

from backends.tensorrt import lowering
from backends.tensorrt.lowering import (
    LoweringPassError,
    LoweringPassRegistry,
    apply_lowering_passes,
    aten_lowering_pass,
    dump_lowering_passes,
    lowering_passes,
    remove_lowering_pass,
)
from tests.trt.helpers import aten, aten_graph, targets

SHIPPED = [
    "remove_assert_ops",
    "remove_detach",
    "remove_noop_aliases",
    "remove_noop_to_copy",
    "view_to_reshape",
    "fuse_mm_add",
    "constant_fold",
    "eliminate_dead_code",
    "repair_input_as_output",
]


@pytest.fixture(autouse=True)
def _restore_registry() -> Any:
    with lowering_passes.snapshot():
        yield


def _names() -> list[str]:
    return [p.__name__ for p in lowering_passes.passes]


def test_shipped_passes_in_order() -> None:
    assert _names() == SHIPPED
    dump = dump_lowering_passes().splitlines()
    assert dump[1:] == [f"  {i}: {name}" for i, name in enumerate(SHIPPED)]


def test_decorator_appends_and_inserts_at_index() -> None:
    @aten_lowering_pass
    def last_pass(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
        return gm

    @aten_lowering_pass(index=0)
    def first_pass(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
        return gm

    @aten_lowering_pass(index=2)
    def third_pass(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
        return gm

    assert _names() == ["first_pass", SHIPPED[0], "third_pass", *SHIPPED[1:], "last_pass"]
    assert callable(last_pass) and last_pass.__name__ == "last_pass"
    assert "  2: third_pass" in dump_lowering_passes()


def test_remove_at_index_and_restore() -> None:
    removed = remove_lowering_pass(1)
    assert removed.__name__ == "remove_detach"
    assert _names() == [SHIPPED[0], *SHIPPED[2:]]
    with pytest.raises(IndexError, match="no lowering pass at index 42"):
        remove_lowering_pass(42)


def test_snapshot_restores_registry() -> None:
    with lowering_passes.snapshot():
        remove_lowering_pass(0)
        aten_lowering_pass(lambda gm, inputs: gm)
        assert len(lowering_passes.passes) == len(SHIPPED)
        assert _names()[0] == SHIPPED[1]
    assert _names() == SHIPPED


def test_apply_runs_passes_in_order() -> None:
    calls: list[str] = []

    def make(name: str) -> Any:
        def record(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
            calls.append(name)
            return gm

        record.__name__ = name
        return record

    registry = LoweringPassRegistry([make("a"), make("b")])
    registry.add(make("c"), index=1)
    gm = aten_graph(lambda x: x.relu(), torch.randn(3))
    assert registry.apply(gm, [torch.randn(3)]) is gm
    assert calls == ["a", "c", "b"]


def test_apply_shipped_passes_to_graph() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.view.default(x.detach() + 1, [-1])

    gm = aten_graph(f, torch.randn(2, 3))
    apply_lowering_passes(gm, [torch.randn(2, 3)])
    assert targets(gm) == [aten.add.Tensor, aten.reshape.default]


def test_failing_pass_is_named_with_passes_before() -> None:
    def broken(gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
        raise ValueError("boom")

    aten_lowering_pass(broken, index=1)
    gm = aten_graph(lambda x: x + 1, torch.randn(2))
    with pytest.raises(LoweringPassError, match=r"broken failed \(after remove_assert_ops\)"):
        apply_lowering_passes(gm, [torch.randn(2)])


def test_registry_rejects_non_callable() -> None:
    with pytest.raises(TypeError, match="must be callable"):
        lowering.lowering_passes.add("not a pass")  # type: ignore[arg-type]
