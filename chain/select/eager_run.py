"""Eager's recorded run: the outputs (and float64 ones) a graph's candidates are verified
against, recorded at selection and recorded again, on the weights as they are then, for
work verified later (a package build, a challenger) when the user changed a weight since.

A challenger built in a child is verified 30-40 s after the graph's second call; a user who
loads a checkpoint, takes an optimizer step or merges a LoRA adapter meanwhile has changed
what the graph computes. Judged against the old outputs, a correct challenger fails
("mismatch", seen in a user-style run: 1.4e7x eager's error) and one that kept the old
weights would pass. Recorded again, both are judged on today's weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import fx

from backends.common.versions import version
from chain.judge.fp64 import Later, fp64_reference
from chain.judge.verify import unchanged
from chain.select.attempt import Reference
from chain.select.isolation import Fingerprint


def eager_run(
    gm: fx.GraphModule,
    reference: Reference,
    recorded: tuple[float | None, ...] | None = None,
    checked: Callable[[], str | None] | None = None,
) -> tuple[Reference, list[str]]:
    """`reference` with eager's outputs on fresh copies of its inputs, eager's writes to
    them, and the float64 outputs (with `recorded`, a remembered decision's eager errors:
    float64 later, only if the quick check needs it); notes on what limits verification.
    `checked` runs right after eager's run (selection's weight watch), its note kept."""
    ran = reference.inputs()
    base = {i: version(t) for i, t in enumerate(ran) if isinstance(t, torch.Tensor)}
    with torch.no_grad():
        outputs = gm(*ran)
    written = checked() if checked is not None else None
    fp64, later, notes = None, None, [written] if written else []
    if recorded is not None:
        later = Later(gm, reference.inputs())
    else:
        fp64, note = fp64_reference(gm, reference.inputs())
        notes += [note] if note else []
    runs = reference.runs or ()
    after = {i: ran[i] for i in reference.copied() if isinstance(ran[i], torch.Tensor)}
    wrote = frozenset(i for i, x in after.items() if not unchanged(x, runs[i]))
    again = dataclasses.replace(
        reference,
        outputs=outputs,
        fp64=fp64,
        after=after,
        after_base={i: base[i] for i in after},
        wrote=wrote,
        recorded=recorded,
        later=later,
    )
    return again, notes


def weights_at(reference: Reference) -> dict[int, Fingerprint]:
    """The fingerprints of the weights `reference` shares with the caller (not copied)."""
    if reference.isolation is None or reference.runs is None:
        return {}
    runs = reference.runs
    return {
        i: Fingerprint.of(t)
        for i in reference.isolation.watched
        if isinstance(t := runs[i], torch.Tensor)
    }


def current(gm: fx.GraphModule, reference: Reference) -> tuple[Reference, str | None]:
    """`reference`, or the same recorded again when a weight changed since its `weights`
    were fingerprinted; the note names the weights (None: unchanged)."""
    if not reference.weights or reference.outputs is None or reference.runs is None:
        return reference, None
    prints = weights_at(reference)  # before the run: a change during it is seen next time
    changed = [
        i
        for i, then in reference.weights.items()
        if (now := prints[i]).version != then.version or not now.same_values(then)
    ]
    if not changed:
        return reference, None
    again, notes = eager_run(gm, dataclasses.replace(reference, recorded=None, later=None))
    again = dataclasses.replace(again, weights=prints)
    names = ", ".join(reference.name(i) for i in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    note = f"reference recorded again: weight(s) {names}{more} changed since selection"
    return again, "; ".join([note, *notes])
