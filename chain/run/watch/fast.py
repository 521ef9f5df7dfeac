"""The usual call of a watched winner as one closure: the same cheap checks, fewer steps.

The general path (`chain.run.guard`) goes through the watch's methods, the output spec and the
schedule, each a Python frame whose attributes are read after the graph's own ops, with
cold caches: about 12 us a call on a tiny BERT whose call takes 0.4 ms, 3% of it. For a
graph that writes none of its inputs (most: nothing to keep before the call) with outputs
in a flat tuple, `fast_path` binds what the checks read into one closure, which does the
usual call in full (the same conditions as `Expected.check` and `Reuse.check`, and the
NaN/inf scan on the calls drawn for it) and hands every other (a call to re-verify, an
output that fails a check, an activation written, a NaN found) to the general path as a
`Slow`, which finds the same failure and words it: a verdict is always the general path's.

After a launch-bound graph's ops every step misses the caches, so the closure takes as few
as it can: no helper function, comprehension or method per call (each is a frame and code
to fetch again: on a 24-layer MLP at batch 1, 17 us of checks a call inline against 36 us
through helpers, side by side); the inputs' storages and version counters read before the
graph's ops, one storage read per output for both the aliasing and the reuse checks (the
general path reads each input's once per output: 81 reads a call for a GPT-2 decode step's
9 outputs and 9 cache tensors). Fresh outputs are checked against the activations only: the
model's buffers (a ResNet's batch-norm statistics, 3 per layer) are left to re-verification,
as its parameters are, so that no call's work grows with the number of weights.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any, NamedTuple

import torch

from backends.common.versions import versions as read_versions
from chain.run.watch.expect import _finite, _fits
from chain.run.watch.reuse import RECENT
from chain.run.watch.watch import Watch

NOT_RUN = object()  # Slow.out of a call the fast path left to the general path whole
_version = torch._C.TensorBase._version.__get__  # the C getter, mapped over the activations


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
    call keeps a copy first; its outputs are not a flat tuple). A bucket's watch
    (`counts_calls` false) counts its calls on the bucket, not on the graph's record."""
    expected = watch.expected
    if expected is None or watch.writes is not None or not expected.flat:
        return None
    counts = watch.counts_calls
    counter, stats, schedule, draw = watch.counter, watch.stats, watch.schedule, watch._draw
    count = expected.count
    scanned = tuple(s.index for s in expected.specs if s.finite_cpu)  # for NaN/inf, sampled
    versioned = watch.versioned
    get = operator.itemgetter(*versioned) if versioned else None
    one = len(versioned) == 1
    inference = [False]  # an inference tensor met: its counter is read as the general path does
    reuse = watch.reuse
    remembered = set(reuse.positions) if reuse is not None else set()
    held, recent = (reuse.held, reuse.recent) if reuse is not None else ({}, None)
    groups: list[tuple[int, ...]] = []  # the distinct sets of inputs outputs must not alias
    specs = []
    for s in expected.specs:
        of = tuple(j for j in s.fresh_of if j in versioned) if s.alias is None else ()
        if of and of not in groups:
            groups.append(of)
        group = groups.index(of) if of else -1
        storage = s.alias is not None or group >= 0 or s.index in remembered
        specs.append((s.index, s.dtype, s.static, s.on_cpu, s.device, s, storage, s.alias, group))
    guarded = sorted({j for of in groups for j in of} | {s.alias for s in expected.specs} - {None})
    channels = tuple(s.index for s in expected.specs if s.channels_last)
    tensor, sequence, ref, last = torch.Tensor, (tuple, list), weakref.ref, torch.channels_last
    first = operator.itemgetter(0)

    def call(*args: Any) -> Any:
        n = next(counter)
        if counts:
            stats.calls = n
        timed = n >= schedule.mark  # a call around a re-verification: timed for its budget
        if timed and n >= schedule.due:
            return Slow(n)
        versions = None
        if get is not None and not inference[0]:
            try:
                versions = [_version(get(args))] if one else list(map(_version, get(args)))
            except RuntimeError:  # "Inference tensors do not track version counter"
                inference[0] = True
        if inference[0]:
            versions = read_versions(args, versioned)  # as the general path reads them
        where = {}  # before the graph's ops: after them every read misses the caches
        for j in guarded:
            a = args[j]
            where[j] = a.untyped_storage().data_ptr() if a.numel() else 0
        forbidden = []
        for of in groups:
            ptrs = set(map(where.__getitem__, of))
            ptrs.discard(0)  # an empty input aliases nothing
            forbidden.append(ptrs)
        if timed:
            start = perf_counter()
            out = fn(*args)
            watch.timed(n, perf_counter() - start)
        else:
            out = fn(*args)
        if not (isinstance(out, sequence) and len(out) == count):
            return Slow(n, False, out, versions)
        mine = []  # (storage, output) of the outputs to remember for the reuse check
        for i, dtype, static, on_cpu, device, spec, storage, alias, group in specs:
            t = out[i]
            if not (
                isinstance(t, tensor)
                and t.dtype == dtype
                and (t.is_cpu if on_cpu else t.device == device)
                and (t.shape == static if static is not None else _fits(t, spec, args))
            ):
                return Slow(n, False, out, versions)
            if not storage:
                continue
            ptr = t.untyped_storage().data_ptr() if t.numel() else 0
            if (alias is not None and ptr != where[alias]) or (
                group >= 0 and ptr in forbidden[group]
            ):
                return Slow(n, False, out, versions)
            if ptr and i in remembered:
                for call_, _, earlier in held.get(ptr, ()):
                    if call_ != n and (h := earlier()) is not None and h.numel():
                        return Slow(n, False, out, versions)  # memory of an answer held
                mine.append((ptr, i))
        for i in channels:
            if not out[i].is_contiguous(memory_format=last):
                return Slow(n, False, out, versions)
        if versions is not None:
            now = (
                read_versions(args, versioned)
                if inference[0]
                else [_version(get(args))]
                if one
                else list(map(_version, get(args)))
            )
            if now != versions:
                return Slow(n, False, out, versions)
        if recent is not None and (not recent or recent[-1][0] != n):  # as Reuse.seen keeps
            for ptr, i in mine:  # what was held there is dropped (found so above)
                entries = held.get(ptr)
                if entries is not None and entries[-1][0] == n:  # two outputs, one storage
                    entries.append((n, i, ref(out[i])))
                else:
                    held[ptr] = [(n, i, ref(out[i]))]
            recent.append((n, tuple(map(first, mine))))
            if len(recent) > RECENT:  # call n - RECENT is forgotten
                old, ptrs = recent.popleft()
                for ptr in ptrs:
                    entries = held.get(ptr)
                    if entries is not None and entries[-1][0] <= old:  # nothing newer there
                        del held[ptr]
                    elif entries is not None and entries[0][0] <= old:
                        held[ptr] = [e for e in entries if e[0] > old]
        if scanned and draw() < watch.scan_share and not all(_finite(out[i]) for i in scanned):
            return Slow(n, True, out, versions)  # suspect: re-verified at once
        return out

    return call
