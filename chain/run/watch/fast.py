"""The usual call of a watched winner as one closure: the same cheap checks, fewer steps.

The general path (`chain.run.guard`) goes through the watch's methods, the output spec and the
schedule, each a Python frame whose attributes are read after the graph's own ops, with
cold caches: about 12 us a call on a tiny BERT whose call takes 0.4 ms, 3% of it. For a
graph that writes none of its inputs (most: nothing to keep before the call) with outputs
in a flat tuple, `fast_path` binds what the checks read into one closure, which does the
usual call in full (the same conditions as `Expected.check`, in one loop, and the NaN/inf
scan on the calls drawn for it) and hands every other (a call to re-verify, an output that
fails a check, an activation written, a NaN found) to the general path as a `Slow`, which
finds the same failure and words it: a verdict is always the general path's.

Aliasing and reuse are checked in one pass: the storages of the activations an output must
not alias are read once a call, then each output's once, for both checks (the general path
reads an input's per output: 81 reads a call for a GPT-2 decode step's 9 outputs and 9
cache tensors, then each output's again for the reuse check; 18 reads here).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any, NamedTuple

import torch

from backends.common.versions import reader
from chain.run.watch.expect import OutputSpec, _finite, _fits, _storage
from chain.run.watch.reuse import Reuse
from chain.run.watch.watch import Watch

NOT_RUN = object()  # Slow.out of a call the fast path left to the general path whole


MemoryCheck = Callable[[int, Any, dict[int, int]], bool]


class Slow(NamedTuple):
    """A call for the general path: before the winner ran (`out` is NOT_RUN), or after it
    ran and a check failed (`out`, with the activations' versions read before it ran;
    `scan` True: a NaN/inf was found)."""

    n: int
    scan: bool | None = None  # whether to scan the outputs for NaN/inf (None: as drawn)
    out: Any = NOT_RUN
    versions: list[int] | None = None


def fast_path(watch: Watch, fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """`fn` under `watch`'s cheap checks as one closure returning the output or a `Slow`;
    None when the graph needs the general path on every call (it writes an input, so each
    call keeps a copy first; its outputs are not a flat tuple; a bucket's watch)."""
    expected = watch.expected
    if expected is None or watch.writes is not None or not expected.flat:
        return None
    if not watch.counts_calls:
        return None
    counter, stats, schedule, draw = watch.counter, watch.stats, watch.schedule, watch._draw
    count = expected.count
    scanned = tuple(s.index for s in expected.specs if s.finite_cpu)  # for NaN/inf, sampled
    specs = tuple((s.index, s.dtype, s.static, s.on_cpu, s.device, s) for s in expected.specs)
    inputs, memory = _memory_check(expected.specs, watch.reuse, set(watch.versioned))
    read_versions = reader(watch.versioned) if watch.versioned else None
    tensor, sequence = torch.Tensor, (tuple, list)  # `tuple | list` is built on each use

    def call(*args: Any) -> Any:
        n = next(counter)
        stats.calls = n
        timed = n >= schedule.mark  # a call around a re-verification: timed for its budget
        if timed and n >= schedule.due:
            return Slow(n)
        versions = read_versions(args) if read_versions is not None else None
        where = inputs(args)  # before the graph's ops: after them every read misses the caches
        if timed:
            start = perf_counter()
            out = fn(*args)
            watch.timed(n, perf_counter() - start)
        else:
            out = fn(*args)
        if isinstance(out, sequence) and len(out) == count:
            for i, dtype, static, on_cpu, device, spec in specs:
                t = out[i]
                if not (
                    isinstance(t, tensor)
                    and t.dtype == dtype
                    and (t.is_cpu if on_cpu else t.device == device)
                    and (t.shape == static if static is not None else _fits(t, spec, args))
                ):
                    return Slow(n, False, out, versions)
            if memory is not None and not memory(n, out, where):
                return Slow(n, False, out, versions)
            if read_versions is not None and read_versions(args) != versions:
                return Slow(n, False, out, versions)
            if scanned and draw() < watch.scan_share and not all(_finite(out[i]) for i in scanned):
                return Slow(n, True, out, versions)  # suspect: re-verified at once
            return out
        return Slow(n, False, out, versions)

    return call


def _memory_check(
    specs: Sequence[OutputSpec], reuse: Reuse | None, activations: set[int]
) -> tuple[Callable[[Sequence[Any]], dict[int, int]], MemoryCheck | None]:
    """(args -> the storages of the inputs involved, read before the call; (call, outputs,
    those storages) -> whether every output's aliasing and layout are eager's and no output
    is memory an earlier call handed out (`Reuse`), None when there is nothing to check),
    with one storage read per input and output involved (as `expect._layout` and
    `Reuse.check`, which word a failure). Fresh outputs are checked against the
    `activations` only: the model's buffers (a ResNet's batch-norm statistics: 3 per layer)
    are left to the re-verifications, as its parameters are, so that no call's work grows
    with the weights."""
    aliased = tuple((s.index, s.alias) for s in specs if s.alias is not None)
    groups: dict[tuple[int, ...], list[int]] = {}  # outputs by the inputs they must not alias
    for s in specs:
        of = tuple(j for j in s.fresh_of if j in activations)
        if s.alias is None and of:
            groups.setdefault(of, []).append(s.index)
    fresh = tuple((of, tuple(outputs)) for of, outputs in groups.items())
    guarded = tuple(sorted({j for of, _ in fresh for j in of} | {j for _, j in aliased}))
    channels = tuple(s.index for s in specs if s.channels_last)
    remembered = set(reuse.positions) if reuse is not None else set()
    read = tuple(sorted({i for _, outputs in fresh for i in outputs} | remembered))
    seen = reuse.seen if reuse is not None else None

    def inputs(args: Sequence[Any]) -> dict[int, int]:
        return {j: _storage(args[j]) for j in guarded}

    if not (aliased or read or channels):
        return inputs, None
    last = torch.channels_last

    def check(n: int, out: Any, where: dict[int, int]) -> bool:
        for i, j in aliased:
            if _storage(out[i]) != where[j]:
                return False
        storages = {i: _storage(out[i]) for i in read}  # 0: empty, aliases nothing
        for of, outputs in fresh:
            forbidden = {where[j] for j in of}
            forbidden.discard(0)
            if any(storages[i] in forbidden for i in outputs):
                return False
        if seen is not None and seen(n, out, storages) is not None:
            return False
        return all(out[i].is_contiguous(memory_format=last) for i in channels)

    return inputs, check
