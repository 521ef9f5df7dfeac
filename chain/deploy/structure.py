"""Input and output structures as data: stand-ins for the classes a serving process lacks.

torch.export records each program's input and output structure as a pytree spec
(`in_spec` / `out_spec` in model.json): every class by its serialized name
(`transformers.models.swin.modeling_swin.SwinModelOutput`) and, for a class that flattens
to named fields (transformers' `ModelOutput`, a dict), the field names as a JSON list. That
record is what `chain.load` reads, as data. torch's loader needs each class registered with
pytree; a serving process should not need the training code's package for that. So, before
torch reads the program: a class registered in this process is used as is; any other
recorded with its fields gets a stand-in (`StandIn`: a dict with attribute and positional
access, as `ModelOutput`), made from the record and registered under the recorded name,
with one warning per load. Nothing is imported on the file's say-so: a module is only
looked up in `sys.modules` (this also holds for what torch's own context readers would
import: enum keys and defaultdict factories).
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.fx import _pytree as fx_pytree
from torch.utils import _pytree as pytree

from backends.common.payload import PayloadError

_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}(\.[A-Za-z_][A-Za-z0-9_]{0,99}){1,20}")
_FIELD = re.compile(r"[^\x00-\x1f\x7f]{1,200}")
_MAX_FIELDS = 4096
_UNNAMED = pytree.NO_SERIALIZED_TYPE_NAME_FOUND
_lock = threading.Lock()
_made: dict[str, type[StandIn]] = {}  # recorded name -> its stand-in (one per process)


class StandInWarning(UserWarning):
    """A loaded program returns (or takes) stand-ins for classes this process has not imported."""


class StandIn(dict):  # type: ignore[type-arg]
    """A recorded structure whose class this process has not imported: its fields by key,
    by attribute and by position, in the recorded order (as transformers' ModelOutput)."""

    recorded: ClassVar[str] = ""  # the class's serialized name in the program

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} (stand-in for {self.recorded}) has no field {name!r}"
            ) from None

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int | slice):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def to_tuple(self) -> tuple[Any, ...]:
        """The fields' values in order (ModelOutput's `to_tuple`)."""
        return tuple(self.values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


def _flatten(value: StandIn) -> tuple[list[Any], list[str]]:
    return list(value.values()), list(value.keys())


def _flatten_with_keys(value: StandIn) -> tuple[list[tuple[Any, Any]], list[str]]:
    return [(pytree.MappingKey(k), v) for k, v in value.items()], list(value.keys())


def stand_in(name: str) -> type[StandIn]:
    """The stand-in class registered (with pytree) under the recorded name `name`."""
    with _lock:
        made = _made.get(name)
        if made is not None:
            return made
        short = name.rsplit(".", 1)[-1]
        cls: type[StandIn] = type(
            short, (StandIn,), {"recorded": name, "__module__": __name__, "__qualname__": short}
        )

        def unflatten(values: Any, context: Any) -> StandIn:
            return cls(zip(context, values, strict=True))

        pytree.register_pytree_node(
            cls,
            _flatten,
            unflatten,
            serialized_type_name=name,
            flatten_with_keys_fn=_flatten_with_keys,
        )
        # the loaded program's input check flattens a call's values by the spec's keys
        fx_pytree.register_pytree_flatten_spec(cls, lambda d, spec: [d[k] for k in spec.context])
        _made[name] = cls
        return cls


def is_stand_in(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, StandIn)


def _nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every node of a serialized treespec (`[protocol, node]`) that names a type."""
    if not isinstance(node, dict):
        raise TypeError("a treespec node that is not an object")
    if node.get("type") is not None:
        yield node
    children = node.get("children_spec", [])
    if not isinstance(children, list):
        raise TypeError("a treespec's children that are not a list")
    for child in children:
        yield from _nodes(child)


def spec_nodes(text: str) -> Iterator[dict[str, Any]]:
    """The typed nodes of one serialized treespec string (JSON, read as data)."""
    data = json.loads(text)
    if not isinstance(data, list) or len(data) != 2 or data[0] != 1:
        raise ValueError("a treespec of an unknown protocol")
    yield from _nodes(data[1])


def fields_of(node: dict[str, Any]) -> list[str] | None:
    """The recorded field names of a node (a JSON list of strings, one per child), or None."""
    context = node.get("context")
    try:
        fields = json.loads(context) if isinstance(context, str) else None
    except ValueError:
        return None
    if (
        not isinstance(fields, list)
        or len(fields) != len(node.get("children_spec", []))
        or len(fields) > _MAX_FIELDS
        or not all(isinstance(f, str) and _FIELD.fullmatch(f) for f in fields)
        or len(set(fields)) != len(fields)
    ):
        return None
    return fields


def _imported(module: Any) -> bool:
    return isinstance(module, str) and module in sys.modules


def _check_context(name: str, node: dict[str, Any]) -> None:
    """Refuse a context that torch's reader would turn into an import of a module this
    process has not imported (an enum's class, a defaultdict's factory)."""
    context = node.get("context")
    if node["type"] == "collections.defaultdict":
        if not isinstance(context, dict) or not _imported(context.get("default_factory_module")):
            raise PayloadError(f"{name}: a defaultdict whose factory is not imported: refused")
        return
    if isinstance(context, str) and "__enum__" in context:
        for found in _enums(json.loads(context)):
            if not _imported(str(found.get("fqn", "")).partition(":")[0]):
                raise PayloadError(f"{name}: an enum key whose module is not imported: refused")


def _enums(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        if "__enum__" in value:
            yield value
        for item in value.values():
            yield from _enums(item)
    elif isinstance(value, list):
        for item in value:
            yield from _enums(item)


def prepare(name: str, specs: list[str]) -> list[str]:
    """Make sure torch can read every class of the program's specs: registered ones as they
    are, others as stand-ins; returns the recorded names served by stand-ins. Raises
    `PayloadError` for a class that is neither registered nor recorded with its fields."""
    served: list[str] = []
    if _made:  # torch caches read specs: one read while a stand-in served a name stays so
        pytree.treespec_loads.cache_clear()
    for text in specs:
        for node in spec_nodes(text):
            type_name = node["type"]
            if not isinstance(type_name, str) or type_name == _UNNAMED:
                raise PayloadError(f"{name}: a structure without a class name: refused")
            _check_context(name, node)
            registered = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(type_name)
            if registered is not None and not is_stand_in(registered):
                continue
            if not _TYPE_NAME.fullmatch(type_name) or fields_of(node) is None:
                shown = re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", type_name[:200])
                raise PayloadError(
                    f"{name}: its inputs or outputs are {shown}, not registered in this "
                    f"process and not recorded by field names: import "
                    f"{shown.rsplit('.', 1)[0]} before loading"
                )
            if registered is None:
                stand_in(type_name)
            if type_name not in served:
                served.append(type_name)
    return served


def warning_text(served: list[str]) -> str:
    """The one warning of a load that uses stand-ins."""
    classes = ", ".join(served[:5]) + (f" and {len(served) - 5} more" if len(served) > 5 else "")
    return (
        f"the program's inputs or outputs are {classes}, not imported in this process: "
        "they come as stand-ins with the same fields (chain.deploy.StandIn: by key, by "
        "attribute, by position); import the class's module before chain.load to get it"
    )


def _unrecorded(spec: pytree.TreeSpec) -> Iterator[str]:
    """Classes of `spec` that are not builtins and do not flatten to named fields."""
    if spec.is_leaf():
        return
    serialized = pytree.SUPPORTED_SERIALIZED_TYPES.get(spec.type)
    type_name = serialized.serialized_type_name if serialized is not None else _UNNAMED
    if not type_name.startswith(("builtins.", "collections.", "torch.")):
        context = spec.context
        named = (
            serialized is not None
            and serialized.to_dumpable_context is None
            and isinstance(context, list)
            and all(isinstance(k, str) for k in context)
            and len(context) == spec.num_children
        )
        if not named:
            yield type_name if type_name != _UNNAMED else spec.type.__qualname__
    for child in spec.children():
        yield from _unrecorded(child)


def custom_classes(spec: pytree.TreeSpec | None) -> list[str]:
    """The serialized names of the classes of `spec` that are not torch's or Python's."""
    if spec is None or spec.is_leaf():
        return []
    serialized = pytree.SUPPORTED_SERIALIZED_TYPES.get(spec.type)
    name = serialized.serialized_type_name if serialized is not None else _UNNAMED
    found = [] if name.startswith(("builtins.", "collections.", "torch.")) else [name]
    for child in spec.children():
        found += [n for n in custom_classes(child) if n not in found]
    return found


def without_sample_inputs(program: torch.export.ExportedProgram) -> list[str]:
    """Drop the program's sample inputs when they hold instances of a custom class: saved,
    they are pickles of that class, which no strict reader loads (and torch's loader
    would need the class); returns the note saying so."""
    classes = custom_classes(program.call_spec.in_spec)
    if not classes or program.example_inputs is None:
        return []
    program.example_inputs = None
    return [f"export: sample inputs not saved (they hold {', '.join(classes)})"]


def structure_notes(program: torch.export.ExportedProgram) -> list[str]:
    """Notes for the classes of the program's inputs and outputs that a serving process
    must import (they do not flatten to named fields, so no stand-in can replace them)."""
    found: list[str] = []
    for spec in (program.call_spec.in_spec, program.call_spec.out_spec):
        if spec is not None:
            found += [n for n in _unrecorded(spec) if n not in found]
    return [
        f"export: {n} is not recorded by field names: loading needs its module imported"
        for n in found
    ]
