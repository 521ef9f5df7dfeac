"""Each lowering pass on a small ATen graph: what it changes, what it must leave alone."""

from __future__ import annotations

import torch
from torch import fx

from backends.tensorrt.aten import FREEZE
from backends.tensorrt.lowering.passes import (
    constant_fold,
    eliminate_dead_code,
    fuse_mm_add,
    remove_assert_ops,
    remove_detach,
    remove_noop_aliases,
    remove_noop_to_copy,
    repair_input_as_output,
    view_to_reshape,
)
from tests.trt.helpers import aten, aten_graph, targets


def _same(gm: fx.GraphModule, reference: fx.GraphModule, *inputs: torch.Tensor) -> None:
    """The pass kept the graph valid (lint) and the results equal."""
    gm.graph.lint()
    torch.testing.assert_close(gm(*inputs), reference(*inputs))


def test_repair_input_as_output_clones_returned_input() -> None:
    x = torch.randn(3)
    gm = aten_graph(lambda a: (a.relu(), a), x)
    out = repair_input_as_output(gm, [x])
    output = next(n for n in out.graph.nodes if n.op == "output")
    returned = output.args[0][1]
    assert returned.target == aten.clone.default and returned.args[0].op == "placeholder"
    result = out(x)
    assert result[1] is not x and torch.equal(result[1], x)


def test_repair_input_as_output_leaves_other_graphs() -> None:
    gm = aten_graph(lambda a: a.relu(), torch.randn(3))
    before = gm.code
    assert repair_input_as_output(gm, [torch.randn(3)]).code == before


def test_remove_detach() -> None:
    x = torch.randn(4)
    gm = aten_graph(lambda a: torch.ops.aten.detach.default(a.sin()).cos(), x)
    reference = aten_graph(lambda a: a.sin().cos(), x)
    assert aten.detach.default in targets(gm)
    remove_detach(gm, [x])
    assert targets(gm) == [aten.sin.default, aten.cos.default]
    _same(gm, reference, x)


def test_remove_noop_aliases_keeps_memory_format_clone_and_returned_input_clone() -> None:
    x = torch.randn(2, 3)

    def f(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        plain = torch.ops.aten.clone.default(a.exp())
        alias = torch.ops.aten.alias.default(plain)
        laid = torch.ops.aten.clone.default(alias.t(), memory_format=torch.contiguous_format)
        return laid, torch.ops.aten.clone.default(a)

    gm = aten_graph(f, x)
    reference = aten_graph(f, x)
    remove_noop_aliases(gm, [x])
    clones = [n for n in gm.graph.nodes if n.target == aten.clone.default]
    assert aten.alias.default not in targets(gm)
    assert len(clones) == 2
    assert clones[0].kwargs["memory_format"] == torch.contiguous_format
    assert clones[1].args[0].op == "placeholder"
    _same(gm, reference, x)


def test_remove_assert_ops() -> None:
    x = torch.randn(3)

    def f(a: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._assert_async.msg(torch.ops.aten.gt.Scalar(a.sum(), -1e9), "bad")
        return a * 2

    gm = aten_graph(f, x)
    assert aten._assert_async.msg in targets(gm)
    remove_assert_ops(gm, [x])
    eliminate_dead_code(gm, [x])
    assert targets(gm) == [aten.mul.Tensor]
    torch.testing.assert_close(gm(x), x * 2)


def test_constant_fold_freezes_tagged_inputs_and_folds_weight_math() -> None:
    x, w = torch.randn(2, 3), torch.randn(4, 3)
    gm = aten_graph(lambda a, weight: torch.ops.aten.mm.default(a, weight.t() * 2), x, w)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    placeholders[1].meta[FREEZE] = True
    constant_fold(gm, [x, w])
    eliminate_dead_code(gm, [x, w])
    assert targets(gm) == [aten.mm.default]
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 1
    assert not placeholders[1].users and placeholders[0].users  # calling convention kept
    torch.testing.assert_close(gm(x, torch.zeros_like(w)), x @ (w.t() * 2))


def test_constant_fold_leaves_untagged_inputs_and_expanding_ops() -> None:
    x, w = torch.randn(2, 3), torch.randn(3)
    gm = aten_graph(lambda a, b: a + b.expand(2, 3), x, w)
    constant_fold(gm, [x, w])
    assert aten.expand.default in targets(gm)
    assert not any(n.op == "get_attr" for n in gm.graph.nodes)


def test_eliminate_dead_code_drops_unused_nodes_and_constants() -> None:
    x = torch.randn(3)

    def f(a: torch.Tensor) -> torch.Tensor:
        a.cos()  # dead
        return a.sin()

    gm = aten_graph(f, x)
    gm.register_buffer("_frozen_unused", torch.ones(2), persistent=False)
    eliminate_dead_code(gm, [x])
    assert targets(gm) == [aten.sin.default]
    assert not hasattr(gm, "_frozen_unused")
    assert [n.op for n in gm.graph.nodes].count("placeholder") == 1


def test_view_to_reshape() -> None:
    x = torch.randn(2, 3, 4)

    def f(a: torch.Tensor) -> torch.Tensor:
        v = torch.ops.aten.view.default(a, [6, 4])
        return torch.ops.aten._unsafe_view.default(v.relu(), [24])

    gm, reference = aten_graph(f, x), aten_graph(f, x)
    view_to_reshape(gm, [x])
    assert targets(gm) == [aten.reshape.default, aten.relu.default, aten.reshape.default]
    _same(gm, reference, x)
    # reshape also takes the non-contiguous inputs a view cannot:
    torch.testing.assert_close(gm(x.transpose(0, 1).contiguous().transpose(0, 1)), f(x))


def test_remove_noop_to_copy_only_when_nothing_changes() -> None:
    x = torch.randn(3)

    def f(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        same = torch.ops.aten._to_copy.default(a, dtype=torch.float32)
        half = torch.ops.aten._to_copy.default(a, dtype=torch.float16)
        return same + 1, half

    gm, reference = aten_graph(f, x), aten_graph(f, x)
    remove_noop_to_copy(gm, [x])
    copies = [n for n in gm.graph.nodes if n.target == aten._to_copy.default]
    assert len(copies) == 1 and copies[0].kwargs["dtype"] == torch.float16
    _same(gm, reference, x)


def test_fuse_mm_add_into_addmm() -> None:
    x, w, b = torch.randn(2, 3), torch.randn(3, 4), torch.randn(4)
    gm = aten_graph(lambda a, weight, bias: bias + torch.ops.aten.mm.default(a, weight), x, w, b)
    reference = aten_graph(lambda a, weight, bias: torch.mm(a, weight) + bias, x, w, b)
    fuse_mm_add(gm, [x, w, b])
    assert targets(gm) == [aten.addmm.default]
    _same(gm, reference, x, w, b)


def test_fuse_mm_add_leaves_shared_mm_and_broadcasting_bias() -> None:
    x, w = torch.randn(2, 3), torch.randn(3, 4)

    def shared(a: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        product = torch.mm(a, weight)
        return product + 1.0, product  # mm has two users: fusing would compute it twice

    def growing(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.mm(a, weight) + bias  # bias (3, 2, 4) is not an addmm bias

    gm = aten_graph(shared, x, w)
    fuse_mm_add(gm, [x, w])
    assert aten.addmm.default not in targets(gm)
    bias = torch.randn(3, 2, 4)
    gm = aten_graph(growing, x, w, bias)
    fuse_mm_add(gm, [x, w, bias])
    assert targets(gm) == [aten.mm.default, aten.add.Tensor]
