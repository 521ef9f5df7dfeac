"""An exported graph as an artefact: the ONNX model bytes and how the graph's inputs feed
it, so that a new process builds its session without exporting again (`reuse`).

Bytes: a first line `onnxruntime-artefact <format> <header length>`, a JSON header (the
`OnnxGraph` fields but the model), then the model. Integrity and trust are the store's
business (the chain digests and signs what it stores); this module checks the header's
shape and refuses a model that reads external data files (ONNX Runtime would resolve them
against the current directory), before any session is built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from backends.common.onnx_export import OnnxGraph
from backends.errors import Unsupported
from backends.registry import Artefact

FORMAT = 3  # 2: size carriers (symbolic ints fed as (n, 0) inputs); 3: fixed ints, threads
READS = (2, 3)  # formats this version reads (format 2 has no fixed ints)
MAGIC = b"onnxruntime-artefact"


def to_artefact(graph: OnnxGraph) -> Artefact:
    """The graph as an artefact; it reads the frozen weights and inlined module scalars."""
    header = {
        "input_names": list(graph.input_names),
        "output_names": list(graph.output_names),
        "input_positions": list(graph.input_positions),
        "frozen": list(graph.frozen),
        "derived": list(graph.derived),
        "scalars": {str(k): v for k, v in graph.scalars.items()},
        "dynamic_dims": {str(k): list(v) for k, v in graph.dynamic_dims.items()},
        "opset": graph.opset,
        "num_initializers": graph.num_initializers,
        "decomposed": list(graph.decomposed),
        "mutated": list(graph.mutated),
        "carriers": list(graph.carriers),
        "carrier_names": list(graph.carrier_names),
        "fixed": {str(k): v for k, v in graph.fixed.items()},
        "intra_op_threads": graph.threads,
    }
    text = json.dumps(header, sort_keys=True).encode()
    first = MAGIC + f" {FORMAT} {len(text)}\n".encode()
    reads = tuple(sorted({*graph.frozen, *graph.scalars}))
    return Artefact(first + text + graph.model, reads)


_INDICES = ("input_positions", "frozen", "derived", "mutated", "carriers")
_LISTS = ("input_names", "output_names", "decomposed", "carrier_names", *_INDICES)


def _checked_header(header: Any) -> dict[str, Any]:
    """The header with its fields' shapes checked; Unsupported naming the first wrong one
    (the store digests what it keeps, but a header is still data until checked)."""
    if not isinstance(header, dict):
        raise Unsupported("onnxruntime artefact header is not an object")
    wrong = [n for n in _LISTS if not isinstance(header.get(n), list)]
    wrong += [n for n in ("scalars", "dynamic_dims") if not isinstance(header.get(n), dict)]
    wrong += [n for n in ("opset", "num_initializers") if type(header.get(n)) is not int]
    if wrong:
        raise Unsupported(f"onnxruntime artefact header: field(s) missing or mistyped: {wrong}")
    indices = [*header["dynamic_dims"].values(), *(header[n] for n in _INDICES)]
    if not all(isinstance(v, list) and all(_index(i) for i in v) for v in indices):
        raise Unsupported("onnxruntime artefact header: an index list holds a non-index")
    texts = [*header["input_names"], *header["output_names"], *header["decomposed"]]
    texts += header["carrier_names"]
    if not all(isinstance(n, str) for n in texts):
        raise Unsupported("onnxruntime artefact header: a name is not text")
    if not all(k.isdigit() for k in (*header["scalars"], *header["dynamic_dims"])):
        raise Unsupported("onnxruntime artefact header: scalars or dynamic_dims not by index")
    if not all(type(v) in (int, float) for v in header["scalars"].values()):
        raise Unsupported("onnxruntime artefact header: a scalar is not a number")
    threads = header.setdefault("intra_op_threads", None)  # format 2 has none
    if threads is not None and (type(threads) is not int or threads not in (0, 1)):
        raise Unsupported("onnxruntime artefact header: intra_op_threads is not 0, 1 or null")
    fixed = header.setdefault("fixed", {})  # format 2 has none
    if not isinstance(fixed, dict) or not all(k.isdigit() for k in fixed):
        raise Unsupported("onnxruntime artefact header: fixed ints not by index")
    if not all(type(v) is int for v in fixed.values()):
        raise Unsupported("onnxruntime artefact header: a fixed int is not an int")
    if len(header["carriers"]) != len(header["carrier_names"]):
        raise Unsupported("onnxruntime artefact header: carriers and their names differ in length")
    return header


def _index(value: Any) -> bool:
    """Whether `value` is an input position: an int >= 0 (not a bool, not a float)."""
    return type(value) is int and value >= 0


def _tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto a model holds: initializers (dense and sparse) and the tensors in
    node attributes, in every graph, subgraph, function and training graph."""
    graphs = [model.graph]
    graphs += [g for t in model.training_info for g in (t.initialization, t.algorithm)]
    nodes = [n for f in model.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            yield from graph.initializer
            for sparse in graph.sparse_initializer:
                yield from (sparse.values, sparse.indices)
            nodes.extend(graph.node)
            continue
        for attribute in nodes.pop().attribute:
            yield from (attribute.t, *attribute.tensors)
            for sparse in (attribute.sparse_tensor, *attribute.sparse_tensors):
                yield from (sparse.values, sparse.indices)
            graphs.extend((attribute.g, *attribute.graphs))


def refuse_external_data(model_bytes: bytes) -> None:
    """Raise Unsupported when the ONNX model reads tensors from files outside itself: ONNX
    Runtime resolves external-data paths against the current directory, so a stored model
    that names one would read whatever file sits there. An artefact carries its weights."""
    import onnx

    try:
        model = onnx.load_model_from_string(model_bytes)
    except Exception as error:  # protobuf's DecodeError has no stable import path
        raise Unsupported(f"onnxruntime artefact is not an ONNX model: {error}") from None
    external = [
        t.name or "(unnamed)"
        for t in _tensors(model)
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data)
    ]
    if external:
        raise Unsupported(
            f"onnxruntime artefact reads {len(external)} tensor(s) from external data files "
            f"({', '.join(repr(n[:40]) for n in external[:3])}): refused, an artefact must "
            "carry its weights"
        )


def from_artefact(data: bytes) -> OnnxGraph:
    """The exported graph in `data`; Unsupported when it is not one this version reads, or
    its model reads external data files (checked before any session is built)."""
    first, _, rest = data.partition(b"\n")
    fields = first.split(b" ")
    if (
        len(fields) != 3
        or fields[0] != MAGIC
        or fields[1] not in [str(f).encode() for f in READS]
        or not fields[2].isdigit()
    ):
        raise Unsupported(f"not an onnxruntime artefact of format {READS}: {first[:60]!r}")
    size = int(fields[2])
    try:
        header = _checked_header(json.loads(rest[:size]))
    except (ValueError, RecursionError) as error:
        raise Unsupported(f"onnxruntime artefact header unreadable: {error}") from None
    refuse_external_data(rest[size:])
    return OnnxGraph(
        model=rest[size:],
        input_names=tuple(header["input_names"]),
        output_names=tuple(header["output_names"]),
        input_positions=tuple(header["input_positions"]),
        frozen=tuple(header["frozen"]),
        derived=tuple(header["derived"]),
        scalars={int(k): v for k, v in header["scalars"].items()},
        dynamic_dims={int(k): tuple(v) for k, v in header["dynamic_dims"].items()},
        opset=header["opset"],
        num_initializers=header["num_initializers"],
        decomposed=tuple(header["decomposed"]),
        mutated=tuple(header["mutated"]),
        carriers=tuple(header["carriers"]),
        carrier_names=tuple(header["carrier_names"]),
        fixed={int(k): v for k, v in header["fixed"].items()},
        threads=header["intra_op_threads"],
    )
