"""onnxruntime: FX graph -> ONNX (weights as initializers) -> ONNX Runtime, zero-copy I/O.

Export and session creation happen once per graph, at compile time; `chain.export` puts
the ONNX models in programs through the hooks of `deploy.py`. The compiled callable
carries the ONNX bytes as `chain_payload` and providers, opset, initializer count and
frozen inputs as `chain_details`. See `runtime` for what happens when frozen weights change.

Options: `providers` (default: TensorRT EP and CUDA EP for CUDA inputs when installed, then
CPU), `graph_optimization_level` (disable|basic|extended|all, default all),
`intra_op_num_threads` (default on CPU: 1 or ORT's, timed per graph and kept with the stored
export: `threads`), `allow_spinning` (default False: see
`common.ort_session.session_options`), `on_weight_change` (reexport|raise, default
reexport).
Inputs the graph writes in place come back as extra ONNX outputs and are copied into the
caller's tensors. Symbolic ints no tensor size carries are fed as size carriers
(`runtime`). Refused with `Unsupported`: autograd graphs (inputs that require grad
under grad mode), non-tensor inputs/outputs, inputs on several devices, ops the exporter
or ORT cannot take, dynamic shapes the exporter cannot express ("dynamic shapes: ...").
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch import fx

from backends import cancel
from backends.common.onnx_export import OnnxGraph, export_onnx
from backends.common.ort_session import LEVELS, session_options
from backends.errors import Unsupported
from backends.onnxruntime.artefact import from_artefact
from backends.onnxruntime.deploy import export_parts, load_payload
from backends.onnxruntime.facts import (
    check_inference,
    details,
    device_of,
    output_nodes,
    output_specs,
)
from backends.onnxruntime.frozen import snapshot_frozen
from backends.onnxruntime.refresh import Refresher, initializer_positions, session_with
from backends.onnxruntime.revive import revive
from backends.onnxruntime.runtime import Compiled, FrozenWeightChanged, OrtRunner, OutputSpec
from backends.onnxruntime.session import (
    Provider,
    available,
    create_session,
    default_providers,
    user_stream,
)
from backends.onnxruntime.threads import Choice
from backends.onnxruntime.threads import choose as choose_threads
from backends.options import BadValue, Check, boolean, did_you_mean, one_of, optional
from backends.options import threads as thread_count  # the module `threads` is ours
from backends.registry import register_backend


def _providers(value: Any) -> Any:
    """A list of provider names or (name, options) pairs, as `InferenceSession` takes them."""
    ok = isinstance(value, list | tuple) and all(
        isinstance(p, str)
        or (isinstance(p, tuple | list) and len(p) == 2 and isinstance(p[0], str))
        for p in value
    )
    if not ok:
        raise BadValue("a list of provider names or (name, options) pairs")
    here = _available_providers()
    for provider in value:
        name = provider if isinstance(provider, str) else provider[0]
        if here is not None and name not in _all_providers():  # a typo: refused at chain()
            raise BadValue(
                f"provider names onnxruntime knows; {name!r} is not one"
                f"{did_you_mean(name, _all_providers())} (available here: {', '.join(here)})"
            )
    return value


def _available_providers() -> list[str] | None:
    """onnxruntime.get_available_providers(); None without onnxruntime (nothing to check)."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def _check_chosen(chosen: Sequence[Provider]) -> None:
    """A provider the user named that this install lacks (a CUDA provider on a CPU machine):
    the backend declines with the reason, where ONNX Runtime would fall back silently."""
    here = _available_providers() or []
    missing = [p if isinstance(p, str) else p[0] for p in chosen]
    missing = [name for name in missing if name not in here]
    if missing:
        raise Unsupported(
            f"provider(s) {', '.join(missing)} not available in this onnxruntime install "
            f"(available: {', '.join(here)}); ONNX Runtime would fall back without a word"
        )


def _all_providers() -> list[str]:
    """Every provider onnxruntime knows of, built into this install or not."""
    import onnxruntime

    return list(onnxruntime.get_all_providers())


OPTIONS: dict[str, Check] = {  # name -> value check (backends.options), checked at chain()
    "providers": optional(_providers),
    "graph_optimization_level": one_of(*LEVELS),
    "intra_op_num_threads": optional(thread_count()),
    "allow_spinning": boolean,
    "on_weight_change": one_of("reexport", "raise"),
}


# A graph specialized for one shape (plain int inputs: a per-shape bucket, chain.run.buckets)
# gets a fixed-shape session on CUDA only. On CPU (a tiny BERT, 1 thread, mixed lengths:
# docs/guide/buckets.md, Figures) such a session was 1.1x the dynamic one called alone, and
# the chain serving 1 to 8 of them ran 0.80-0.88x at their lengths: a session per shape
# costs more than the fixed shapes save.
FIXED_ON_CPU = (
    "a session for one shape (a per-shape bucket) is built on CUDA only: on CPU one "
    "measured 1.1x the dynamic session alone and 0.80-0.88x served beside it "
    "(docs/guide/buckets.md)"
)


def _compile(
    gm: fx.GraphModule, example_inputs: list[Any], stored: OnnxGraph | None, **options: Any
) -> OrtRunner:
    """The runner for `gm`: from the `stored` export when given (no export), else exported."""
    outputs, single = output_nodes(gm)
    fix = device_of(example_inputs).type == "cuda"
    nodes = zip(gm.graph.find_nodes(op="placeholder"), example_inputs, strict=False)
    if not fix and any(type(v) is int and n.users for n, v in nodes):
        raise Unsupported(FIXED_ON_CPU)
    return build_runner(
        example_inputs,
        stored,
        output_specs(outputs),
        single,
        lambda inputs: export_onnx(gm, inputs, carry_ints=True, fix_ints=fix),
        **options,
    )


def build_runner(
    example_inputs: Sequence[Any],
    stored: OnnxGraph | None,
    specs: Sequence[OutputSpec],
    single: bool,
    export: Callable[[Sequence[object]], OnnxGraph],
    *,
    providers: Sequence[Provider] | None = None,
    graph_optimization_level: str = "all",
    intra_op_num_threads: int | None = None,
    allow_spinning: bool = False,
    on_weight_change: str = "reexport",
) -> OrtRunner:
    """The runner of the `stored` export (None: `export(inputs)` makes it) whose outputs are
    `specs` (one bare value when `single`); `export` also serves re-exports."""
    intra = intra_op_num_threads  # None: ORT's default, or 1 where measured faster
    check_inference(example_inputs)
    device = device_of(example_inputs)
    chosen = list(providers) if providers is not None else default_providers(device)
    _check_chosen(chosen)

    def build(inputs: Sequence[object], graph: OnnxGraph | None = None) -> Compiled:
        graph = graph if graph is not None else export(inputs)
        if graph.num_outputs != len(specs):
            raise Unsupported(
                f"exported model has {graph.num_outputs} outputs, graph has {len(specs)}"
            )
        if any(i >= len(inputs) for i in (*graph.input_positions, *graph.frozen, *graph.carriers)):
            raise Unsupported(f"the model reads inputs the graph has not ({len(inputs)} inputs)")
        cancel.checkpoint()  # an abandoned compile builds no session
        session = create_session(graph.model, make_options(), chosen)
        return Compiled(graph, session, snapshot_frozen(graph, inputs))

    def update(inputs: Sequence[object], refresher: Refresher) -> Compiled:
        """The same model, its named initializers given the current weights (no export)."""
        names, values = refresher.overrides(inputs)
        graph = runner.graph
        session, kept = session_with(graph.model, make_options, chosen, names, values)
        return Compiled(graph, session, snapshot_frozen(graph, inputs), kept)

    def make_options() -> Any:
        return session_options(graph_optimization_level, intra, allow_spinning)

    choice = None
    measured = intra is None and device.type == "cpu"  # the user pinned none: measured
    if measured and stored is not None and stored.threads is not None:  # timed when stored
        intra = stored.threads or None
        what = "1 thread" if intra else "ORT's default"
        choice = Choice(intra, f"{what}, as timed when this export was stored")
    start = time.perf_counter()
    compiled = build(example_inputs, stored)
    built_s = time.perf_counter() - start
    if measured and choice is None:
        graph = compiled.graph
        one_thread = session_options(graph_optimization_level, 1, allow_spinning)
        one = lambda: create_session(graph.model, one_thread, chosen)  # noqa: E731
        choice, session = choose_threads(graph, example_inputs, compiled.session, one)
        intra = choice.threads
        timed = dataclasses.replace(graph, threads=choice.stored)  # kept with its artefact
        compiled = dataclasses.replace(compiled, graph=timed, session=session)
    facts = details(compiled.graph, chosen, compiled.session)
    if choice is not None:
        facts["intra_op_threads"] = choice.threads or "default"
        facts["intra_op_threads_why"] = choice.why
    if stored is not None:
        facts["from_artefact"] = True  # built from a stored export: nothing exported
    refresher = Refresher(initializer_positions(compiled.graph) if device.type == "cpu" else {})
    if stored is None:  # an export and a session: what a re-export costs
        refresher.reexport_s = built_s
    runner = OrtRunner(
        compiled,
        device=device,
        outputs=specs,
        single_output=single,
        rebuild=build,
        on_weight_change=on_weight_change,
        details=facts,
        stream=user_stream(chosen),
        update=update,
        refresher=refresher,
    )
    return runner


def onnxruntime_reuse(
    gm: fx.GraphModule, example_inputs: list[Any], *, artefact: bytes, **options: Any
) -> OrtRunner:
    """The backend's compile from a stored export (`chain_artefact`): no export, a session."""
    return _compile(gm, example_inputs, from_artefact(artefact), **options)


@register_backend(
    "onnxruntime",
    available=available,
    options=OPTIONS,
    exporter=export_parts,
    loader=load_payload,
    reuse=onnxruntime_reuse,
    revive=revive,
)
def onnxruntime_backend(gm: fx.GraphModule, example_inputs: list[Any], **options: Any) -> OrtRunner:
    """Export the graph to ONNX once and run it with ONNX Runtime."""
    return _compile(gm, example_inputs, None, **options)


__all__ = [
    "FIXED_ON_CPU",
    "OPTIONS",
    "FrozenWeightChanged",
    "OnnxGraph",
    "OrtRunner",
    "export_onnx",
    "onnxruntime_backend",
]

from backends.onnxruntime import graphs as _graphs  # noqa: E402, F401  (its CUDA graphs variant)
