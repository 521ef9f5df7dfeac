"""Run an ONNX Runtime session on torch tensors without copying them.

CPU: inputs go in as numpy views of the torch tensors, outputs come back as numpy arrays
wrapped by `torch.from_numpy` (no copy either way). CUDA: IOBinding binds torch's memory
by pointer; outputs of known shape are allocated by torch and bound, the others are
allocated by ORT and wrapped through DLPack; the session runs on torch's current stream
(the CUDA EP is created with it as its user compute stream; called from another stream,
the runner first waits for that stream's pending work).

Frozen weights (ONNX initializers) are checked on every call, in bulk (C-level `map`s,
no per-weight Python code): same tensor objects, same `_version`s (bumped by every
in-place write, `copy_`, `load_state_dict`). When that fails, each weight is looked at:
another tensor with equal values (a caller's clone of a buffer) is accepted as is; a real
change makes the runner refresh its session before it answers (`on_weight_change="reexport"`,
the default: new initializer values where the export kept them by name, else a re-export,
the cheaper as measured: `backends.onnxruntime.refresh`; counted in
`chain_details["refreshes"]` and `["reexports"]`) or raise `FrozenWeightChanged`
(`"raise"`: a chain then falls back to its next candidate, which reads the new weights).
A chain calls `chain_refresh` itself when it sees the weights change between calls, to time
the refresh and record it. Writes through `.data` (which has its own version counter) are
not seen here: the chain's re-verifications see them by value.

Inputs the graph writes in place (`OnnxGraph.mutated`) come back as the model's last
outputs and are copied into the caller's tensors, so the caller sees eager's writes.
Symbolic ints no tensor size carries (`OnnxGraph.carriers`: a decode step's cache position)
are fed at every call as zero-element arrays of shape (n, 0), which hold no memory.
Plain ints inlined in a model compiled for one shape (`OnnxGraph.fixed`, a per-shape
bucket) are compared at every call: another value raises `FixedIntChanged`.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from backends.common import tracing
from backends.common.onnx_export import OnnxGraph
from backends.onnxruntime.artefact import to_artefact
from backends.onnxruntime.frozen import Frozen, _version
from backends.onnxruntime.refresh import Refresher, initializer_positions
from backends.registry import Artefact, Revival

log = logging.getLogger(__name__)


class FrozenWeightChanged(RuntimeError):
    """A parameter or buffer baked into the ONNX model changed after export."""


class FixedIntChanged(ValueError):
    """A model compiled for one shape (its plain int inputs inlined) got another value."""


def check_fixed(fixed: Sequence[tuple[int, int]], args: Sequence[Any]) -> None:
    """Raise FixedIntChanged when an inlined int input is not the value compiled for."""
    for i, value in fixed:
        if args[i] != value:
            raise FixedIntChanged(
                f"graph input {i} is {args[i]!r}, and this model was compiled for {value} "
                "(a fixed-shape compile: that value only)"
            )


@dataclass(frozen=True)
class OutputSpec:
    """What torch allocates for a bound output on CUDA: None shape when not static.

    `channels_last`: eager's output is laid out channels_last (ONNX Runtime writes plain
    contiguous memory, so the runner converts it: a winner keeps eager's layout)."""

    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    channels_last: bool = False


@dataclass(frozen=True)
class Compiled:
    """One export + session: what a weight change replaces as a whole."""

    graph: OnnxGraph
    session: Any
    frozen: Frozen | tuple[()] = ()
    kept: tuple[Any, ...] = ()  # the OrtValues of initializers added to the session


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype ORT binds for a torch dtype (bfloat16 has none)."""
    return torch.empty((), dtype=dtype).numpy().dtype


class OrtRunner:
    """The compiled callable: feeds the session, checks frozen weights, returns torch tensors."""

    def __init__(
        self,
        compiled: Compiled,
        *,
        device: torch.device,
        outputs: Sequence[OutputSpec],
        single_output: bool,
        rebuild: Callable[[Sequence[object]], Compiled] | None,
        on_weight_change: str = "reexport",
        update: Callable[[Sequence[object], Refresher], Compiled] | None = None,
        refresher: Refresher | None = None,
        details: dict[str, Any] | None = None,
        stream: int | None = None,
    ) -> None:
        if on_weight_change not in ("reexport", "raise"):
            raise ValueError(f"on_weight_change {on_weight_change!r}; valid: reexport, raise")
        self._device = device
        self._outputs = tuple(outputs)
        self._single = single_output
        self._channels_last = tuple(k for k, o in enumerate(self._outputs) if o.channels_last)
        self._rebuild = rebuild
        self._on_change = on_weight_change
        self._stream = stream
        self.chain_details: dict[str, Any] = dict(details or {})
        self._update = update
        self.refresher = refresher or Refresher({})
        self._lock = threading.Lock()  # one refresh at a time; a thread that waited re-checks
        self.reexports = 0
        self.updates = 0  # initializer updates (no export)
        self.chain_details["reexports"] = 0
        self.chain_details["refreshes"] = 0
        self._use(compiled)

    @property
    def refreshes(self) -> int:
        """Weight refreshes so far: re-exports and initializer updates."""
        return self.reexports + self.updates

    def _use(self, compiled: Compiled) -> None:
        self._compiled = compiled
        graph = compiled.graph
        self._session = compiled.session
        self._feeds = tuple(zip(graph.input_names, graph.input_positions, strict=True))
        self._names = list(graph.output_names)
        self._mutated = tuple(enumerate(graph.mutated, start=graph.num_outputs))
        self._scalars = tuple(graph.scalars.items())
        self._sizes = tuple(zip(graph.carrier_names, graph.carriers, strict=True))
        self._fixed = tuple(graph.fixed.items())
        frozen = compiled.frozen if isinstance(compiled.frozen, Frozen) else Frozen((), (), ())
        self._frozen = frozen
        self._frozen_args = frozen.getter()
        self._frozen_tensors = frozen.tensors
        self._frozen_versions = frozen.versions
        if self._device.type == "cuda":
            self._binding = compiled.session.io_binding()
            self._run_options = cuda_run_options(self._stream is not None)
        self._cpu = self._device.type == "cpu"
        self._run = cpu_run(compiled.session)
        plain = self._cpu and not (
            self._scalars or self._mutated or self._channels_last or self._sizes or self._fixed
        )
        self._call = self._plain_cpu() if plain else self._general

    @property
    def chain_payload(self) -> bytes:
        """The ONNX model this runner executes (weights included as initializers)."""
        return self._compiled.graph.model

    @property
    def chain_artefact(self) -> Artefact:
        """The export this runner executes, for the chain to store (`reuse` reads it back)."""
        return to_artefact(self._compiled.graph)

    def chain_revival(self) -> Revival:
        """Its export, output specs and baked weights, for torch's precompile (`revive.py`)."""
        from backends.onnxruntime.revive import revival

        return revival(self)

    @property
    def graph(self) -> OnnxGraph:
        """The exported graph this runner executes (export reads its input mapping)."""
        return self._compiled.graph

    @property
    def session(self) -> Any:
        return self._session

    def feeds(self, args: Sequence[Any]) -> dict[str, np.ndarray]:
        """CPU inputs as numpy views sharing memory with the torch tensors."""
        return {name: args[i].numpy() for name, i in self._feeds}

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def _plain_cpu(self) -> Callable[..., Any]:
        """The usual CPU call as one closure: the frozen weights checked, the C session run on
        numpy views, outputs wrapped; no attribute of the runner read (a launch-bound call
        pays a cache miss for each: 6 us of a 24-layer MLP's, 21 us of a GPT-2 decode
        step's). After a re-export the new session's call answers."""
        getter, tensors, versions = self._frozen_args, self._frozen_tensors, self._frozen_versions
        run, names, feeds, single = self._run, self._names, self._feeds, self._single
        check, is_, from_numpy = self._check_frozen, operator.is_, torch.from_numpy

        def call(*args: Any) -> Any:
            got = getter(args)
            if not (all(map(is_, got, tensors)) and tuple(map(_version, tensors)) == versions):
                check(args, got)
                if self._call is not call:  # re-exported: the new session answers
                    return self._call(*args)
            outs = run(names, {name: args[i].numpy() for name, i in feeds}, None)
            return from_numpy(outs[0]) if single else tuple(map(from_numpy, outs))

        return call

    def _general(self, *args: Any) -> Any:
        """Any call: scalars inlined as constants, fixed ints, size carriers, written inputs,
        channels_last, CUDA."""
        if self._fixed:
            check_fixed(self._fixed, args)
        got = self._frozen_args(args)
        if not (
            all(map(operator.is_, got, self._frozen_tensors))
            and tuple(map(_version, self._frozen_tensors)) == self._frozen_versions
        ):
            self._check_frozen(args, got)
        for i, number in self._scalars:
            if args[i].item() != number:
                with self._lock:
                    if args[i].item() != dict(self._scalars).get(i, number):
                        trace = tracing.may_trace()
                        self._weights_changed(i, "a different value", args, trace=trace)
                break
        if self._cpu:
            feeds = {name: args[i].numpy() for name, i in self._feeds}
            for name, i in self._sizes:
                feeds[name] = carrier_array(args[i])
            outs = list(map(torch.from_numpy, self._run(self._names, feeds, None)))
        else:
            outs = self._run_cuda(args)
        if self._mutated:
            for k, i in self._mutated:
                args[i].copy_(outs[k])
            del outs[-len(self._mutated) :]
        for k in self._channels_last:
            outs[k] = outs[k].contiguous(memory_format=torch.channels_last)
        return outs[0] if self._single else tuple(outs)

    def _check_frozen(self, args: Sequence[Any], got: Sequence[Any]) -> None:
        """The slow path, when the bulk check failed: refresh only on a real change (a
        thread that waited for another's refresh finds nothing left to do)."""
        with self._lock:
            changes = self._frozen.all_changed(self._frozen_args(args))
            if changes:
                trace = tracing.may_trace()  # not beside other threads' calls
                self._weights_changed(changes[0][0], changes[0][1], args, changes, False, trace)

    def chain_refresh(
        self, args: Sequence[Any], force: bool = False, trace: bool = True
    ) -> str | None:
        """The weights in `args` into the session before the next answer (the chain calls
        this when it sees them change between calls): how it was done, or None when
        nothing frozen changed (`force`: changed by value with no counter moved, as
        through `.data`: every frozen weight is taken as changed). FrozenWeightChanged
        under `on_weight_change="raise"`, and where only a re-export would do and `trace`
        is False (other threads call: a trace changes torch for all of them)."""
        with self._lock:
            changes = self._frozen.all_changed(self._frozen_args(args))
            if force and not changes:
                changes = [(i, "changed by value") for i in self._frozen.positions]
            moved = [i for i, number in self._scalars if args[i].item() != number]
            if not changes and not moved:
                return None
            first = changes[0] if changes else (moved[0], "a different value")
            return self._weights_changed(first[0], first[1], args, changes, bool(moved), trace)

    def _weights_changed(
        self,
        position: int,
        how: str,
        args: Sequence[Any],
        changes: Sequence[tuple[int, str]] = (),
        scalars: bool = True,
        trace: bool = True,
    ) -> str:
        """Refresh the session on `args`' weights: initializer values where every changed
        one kept its initializer and that measured cheaper (or `trace` is False), else a
        re-export (never with `trace` False: FrozenWeightChanged)."""
        message = f"frozen weight (graph input {position}) changed after export ({how})"
        if self._on_change == "raise" or self._rebuild is None:
            raise FrozenWeightChanged(message + "; compile again to pick it up")
        refresher = self.refresher
        changed = [i for i, _ in changes]
        start = time.perf_counter()
        updatable = self._update is not None and not scalars and refresher.can_update(changed)
        if not updatable and not trace:
            raise FrozenWeightChanged(
                f"{message}; a re-export would trace the graph while other threads call "
                "compiled models (it changes torch for all of them): not done"
            )
        if updatable and (refresher.prefer_update() or not trace):
            refresher.dirty.update(changed)
            self._use(self._update(args, refresher))
            refresher.update_s = time.perf_counter() - start
            self.updates += 1
            done = f"initializers updated in {refresher.update_s * 1e3:.1f} ms"
        else:
            log.warning("%s: re-exporting the ONNX model", message)
            self._use(self._rebuild(args))
            refresher.dirty.clear()
            if refresher.mapped:  # the new export's initializers, by name
                refresher.mapped = initializer_positions(self._compiled.graph)
            refresher.reexport_s = time.perf_counter() - start
            self.reexports += 1
            done = f"re-exported in {refresher.reexport_s * 1e3:.1f} ms"
        self.chain_details["reexports"] = self.reexports
        self.chain_details["refreshes"] = self.refreshes
        return done

    def _run_cuda(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """IOBinding on torch memory; outputs of static shape allocated by torch.

        ORT runs on torch's current stream (the CUDA EP's user compute stream) and does not
        synchronize the host after the run: torch's stream order covers what follows. From
        another stream, the two streams wait on each other on the device, not on the host.
        """
        binding = self._binding
        index = self._device.index or 0
        keep = []
        for name, i in self._feeds:
            t = args[i].contiguous()
            keep.append(t)
            binding.bind_input(
                name, "cuda", index, numpy_dtype(t.dtype), tuple(t.shape), t.data_ptr()
            )
        for name, i in self._sizes:  # no elements: only its shape is read (ORT's Shape op)
            binding.bind_cpu_input(name, carrier_array(args[i]))
        allocated: list[torch.Tensor | None] = []
        for name, spec in zip(self._names, self._outputs, strict=True):
            if spec.shape is None or spec.dtype is None:
                binding.bind_output(name, "cuda", index)
                allocated.append(None)
                continue
            out = torch.empty(spec.shape, dtype=spec.dtype, device=self._device)
            binding.bind_output(
                name, "cuda", index, numpy_dtype(spec.dtype), spec.shape, out.data_ptr()
            )
            allocated.append(out)
        current = torch.cuda.current_stream(self._device)
        other = self._stream is not None and current.cuda_stream != self._stream
        if other:
            ort_stream = torch.cuda.ExternalStream(self._stream, device=self._device)
            ort_stream.wait_stream(current)
        elif self._stream is None:
            current.synchronize()  # ORT on its own stream: torch's writes must land first
        self._session.run_with_iobinding(binding, self._run_options)
        if other:
            current.wait_stream(ort_stream)
        if all(a is not None for a in allocated):
            return allocated  # type: ignore[return-value]
        ort_values = binding.get_outputs()
        return [
            a if a is not None else torch.from_dlpack(v)
            for a, v in zip(allocated, ort_values, strict=True)
        ]


def carrier_array(n: Any) -> np.ndarray:
    """The size carrier of the int `n` as ORT takes it: shape (n, 0), int64, no elements."""
    return np.empty((int(n), 0), dtype=np.int64)


def cpu_run(session: Any) -> Callable[[list[str], dict[str, Any], Any], list[Any]]:
    """`run(names, feeds, options)` of a session: the C session's own where only the CPU EP
    runs it. The Python wrapper checks the feed names (ours are the model's own) and falls
    back to other EPs on an EP failure (there is none to fall back to): several us a call
    of a launch-bound graph."""
    inner = getattr(session, "_sess", None)
    if inner is not None and session.get_providers() == ["CPUExecutionProvider"]:
        return inner.run
    return session.run


def cuda_run_options(on_torch_stream: bool) -> Any:
    """Run options for CUDA: no host sync after the run when ORT is on torch's stream."""
    import onnxruntime as ort

    options = ort.RunOptions()
    if on_torch_stream:
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    return options
