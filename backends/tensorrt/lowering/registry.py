"""The lowering pass registry: an ordered list of `(gm, sample_inputs) -> gm` passes.

The API follows the Torch-TensorRT lowering passes guide: a decorator that appends a pass
or inserts it at an index, a dump of the order, apply, and remove-at-index. The registry is
an object; `snapshot()` restores it after a test that registers or removes passes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import torch
from torch import fx

from backends.registry import restored

logger = logging.getLogger(__name__)

LoweringPass = Callable[[fx.GraphModule, Sequence[Any]], fx.GraphModule]


class LoweringPassError(RuntimeError):
    """A pass raised: names the pass and the passes that ran before it."""


class LoweringPassRegistry:
    """Ordered lowering passes; decorate to register, `apply` to run them in order."""

    def __init__(self, passes: Sequence[LoweringPass] = ()) -> None:
        self._passes: list[LoweringPass] = list(passes)

    @property
    def passes(self) -> tuple[LoweringPass, ...]:
        return tuple(self._passes)

    def add(self, lowering_pass: LoweringPass, index: int | None = None) -> LoweringPass:
        """Append `lowering_pass`, or insert it at `index`; returns it unchanged."""
        if not callable(lowering_pass):
            raise TypeError(f"a lowering pass must be callable, got {lowering_pass!r}")
        if index is None:
            self._passes.append(lowering_pass)
        else:
            self._passes.insert(index, lowering_pass)
        return lowering_pass

    def remove(self, index: int) -> LoweringPass:
        """Remove the pass at `index` and return it; IndexError names the valid range."""
        if not -len(self._passes) <= index < len(self._passes):
            raise IndexError(
                f"no lowering pass at index {index}; there are {len(self._passes)} (0..."
                f"{len(self._passes) - 1})"
            )
        return self._passes.pop(index)

    def dump(self) -> str:
        """The passes in the order they run, one per line, numbered."""
        lines = [f"  {i}: {_name(p)}" for i, p in enumerate(self._passes)]
        return "ATen lowering passes:\n" + "\n".join(lines)

    def apply(self, gm: fx.GraphModule, sample_inputs: Sequence[Any]) -> fx.GraphModule:
        """Run every pass in order on `gm` (in place) and return the result."""
        done: list[str] = []
        for lowering_pass in self._passes:
            try:
                gm = lowering_pass(gm, sample_inputs)
            except Exception as e:
                raise LoweringPassError(
                    f"lowering pass {_name(lowering_pass)} failed "
                    f"(after {', '.join(done) or 'no other pass'}): {e}"
                ) from e
            done.append(_name(lowering_pass))
        logger.debug("graph after %d lowering passes:\n%s", len(done), gm.graph)
        return gm

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[LoweringPassRegistry]:
        """Within the block, changes to the pass list are temporary."""
        with restored(self, "_passes"):
            yield self


def _name(lowering_pass: LoweringPass) -> str:
    return getattr(lowering_pass, "__name__", repr(lowering_pass))


def finish(gm: fx.GraphModule, pass_name: str, changes: Sequence[str]) -> fx.GraphModule:
    """End of a pass: when it changed something, lint, recompile and log what changed."""
    if changes:
        gm.graph.lint()
        gm.recompile()
        logger.debug("%s: %s", pass_name, "; ".join(changes))
    return gm


def replace_node(node: fx.Node, replacement: fx.Node) -> None:
    """Point every user of `node` at `replacement` and erase `node`."""
    node.replace_all_uses_with(replacement)
    node.graph.erase_node(node)


def is_op(node: fx.Node, *targets: Any) -> bool:
    """Whether `node` calls one of `targets` (OpOverloads or OpOverloadPackets)."""
    if node.op != "call_function":
        return False
    packet = getattr(node.target, "overloadpacket", None)
    return node.target in targets or (packet is not None and packet in targets)


aten = torch.ops.aten


class RegistryBoundDecorator:
    """`@aten_lowering_pass` or `@aten_lowering_pass(index=i)` on a given registry."""

    def __init__(self, registry: LoweringPassRegistry) -> None:
        self.registry = registry

    @overload
    def __call__(self, lowering_pass: LoweringPass) -> LoweringPass: ...
    @overload
    def __call__(
        self, lowering_pass: None = None, *, index: int | None = None
    ) -> Callable[[LoweringPass], LoweringPass]: ...

    def __call__(
        self, lowering_pass: LoweringPass | None = None, *, index: int | None = None
    ) -> LoweringPass | Callable[[LoweringPass], LoweringPass]:
        if lowering_pass is not None:
            return self.registry.add(lowering_pass, index)
        return lambda fn: self.registry.add(fn, index)
