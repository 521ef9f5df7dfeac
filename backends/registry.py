"""The backend registry: a decorator to register, lookup by name, and a snapshot for tests.

A backend is what dynamo calls a backend, `(gm, example_inputs, **options) -> callable`,
plus `available() -> str | None` (None when it can run here, else a short reason).
A backend that cannot take a graph raises `backends.errors.Unsupported(reason)`; any other
exception is a real failure. A backend never mutates the `gm` it is given. A backend that
compiles for fixed shapes declares `dynamic=False`: given a graph with symbolic sizes
(dynamo's dynamic shapes) it is `Unsupported` ("dynamic shapes: ...") before it runs. A
backend may declare a `graphed` hook, the same compiler with its result run under CUDA
graphs, which the chain's `cuda_graphs` stage tries as a variant (`<name>+graphs`).

A compiled callable may carry `chain_details: dict` (JSON-able facts for the report:
partition counts, fallback reasons, cache hits, providers), which the chain copies into
the attempt's `details` (its `summary`, one line, shows in the report's reason column),
and `chain_payload` (bytes: an ONNX model, a TensorRT engine), which the report never holds.

A backend that can be exported (`chain.export`) declares two more hooks, kept in its own
folder (`backends.common.parts` has their vocabulary): `exporter(request) -> ExportedParts
| None` turns its compiled graph into parts with payloads, and `loader(header, body,
device) -> runner` runs a payload it built, in any process that imports `backends`.

A backend whose compile has an expensive step whose result can be kept (ONNX Runtime's
export) declares `reuse(gm, example_inputs, artefact=bytes, **options) -> callable`: the
same compile from an `Artefact` its compiled callable offered as `chain_artefact`. The
chain's memory stores it with a remembered decision and offers it back in a new process.
An artefact too expensive to build on the caller's thread (inductor's AOTInductor package:
a second compile) is offered as `chain_artefact_later`: once the decision is kept, the chain
calls it on the compiling thread (what must happen there: inductor's export) and runs the
`() -> Artefact` it returns in the background. Such a backend may also declare
`prepare(gm, example_inputs, **options) -> () -> Artefact`: the same build without its
compile in this process (what must happen on the calling thread, then the build off it),
so the chain can try it as a challenger compiled in a child process. A `reuse` hook that
takes `cuda_graphs=True` also rebuilds the backend's CUDA graphs variant from the same
artefact. A backend whose artefacts hold native code (loading one runs it) declares
`native_artefacts=True`: the chain then loads them only from a store the user trusts
(docs/trust.md).

A backend whose compiled callable can run again in another process from its artefact alone,
without the graph (torch's precompile: `aot_compile`, `save_compiled_function`), declares
`revive(artefact=bytes, facts=dict, **options) -> callable`; its compiled callable offers
`chain_revival() -> Revival`: the artefact, JSON facts the graph would give (output specs),
and the weight tensors at the artefact's `reads`, as baked in (`Unsupported` when it cannot).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from backends.common.fx_utils import symbolic_inputs
from backends.errors import InvalidBackend, Unsupported
from backends.options import Check, check_options, did_you_mean

if TYPE_CHECKING:
    from backends.common.parts import Exporter, Loader

CompiledFn = Callable[..., Any]
CompilerFn = Callable[..., CompiledFn]  # (gm, example_inputs, **options) -> CompiledFn


@dataclass(frozen=True)
class Artefact:
    """What a compiled graph can be rebuilt from without its expensive step: `data` (bytes
    the backend's `reuse` hook reads back) and `reads`, the positions of the graph inputs
    whose values are baked into it (weights): a store keys the artefact by their values."""

    data: bytes
    reads: tuple[int, ...] = ()


@dataclass(frozen=True)
class Revival:
    """What a compiled callable offers for torch's precompile: its `artefact`, JSON-able
    `facts` that its backend's `revive` hook needs instead of the graph, and `weights`:
    the tensors at `artefact.reads` whose values the artefact holds (their digest is kept)."""

    artefact: Artefact
    facts: Mapping[str, Any]
    weights: Mapping[int, torch.Tensor]


def offered_revival(fn: object) -> Revival:
    """The revival a compiled callable offers (`chain_revival()`); `Unsupported` when none."""
    offer = getattr(fn, "chain_revival", None)
    if not callable(offer):
        raise Unsupported(f"its compiled {type(fn).__name__} offers no artefact to revive")
    revival = offer()
    if not isinstance(revival, Revival):
        raise Unsupported(f"its chain_revival() gave a {type(revival).__name__}")
    return revival


def offered_artefact(fn: object) -> Artefact | None:
    """The artefact a compiled callable offers (`chain_artefact`), or None."""
    artefact = getattr(fn, "chain_artefact", None)
    return artefact if isinstance(artefact, Artefact) else None


def offered_later(fn: object) -> Callable[[], Callable[[], Artefact]] | None:
    """The artefact build a compiled callable offers to run later (`chain_artefact_later`)."""
    later = getattr(fn, "chain_artefact_later", None)
    return later if callable(later) else None


def always_available() -> str | None:
    """The `available()` of backends that need nothing: no reason not to run."""
    return None


Vocabulary = Callable[[], Mapping[str, Check | None]]  # a compiler's own option names


@dataclass(frozen=True)
class Backend:
    """A named compiler with a cheap availability check and the options it accepts.

    `options` are the declared option names and `checks` value checks for some of them
    (`backends.options`); `vocabulary` adds the names of a compiler with its own
    vocabulary (inductor's config), fetched only when options are checked.
    `options=None` without a vocabulary: options pass through unchecked.
    """

    name: str
    compiler: CompilerFn
    available: Callable[[], str | None] = always_available
    options: frozenset[str] | None = frozenset()
    doc: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)
    checks: Mapping[str, Check] = field(default_factory=dict)
    vocabulary: Vocabulary | None = None
    vocabulary_doc: str | None = None  # what to say instead of listing a long vocabulary
    graphed: CompilerFn | None = None  # the same compiler with its output under CUDA graphs
    exporter: Exporter | None = None  # compiled graph -> parts with payloads (chain.export)
    loader: Loader | None = None  # payload header and body -> a runner (at load time)
    dynamic: bool = True  # takes graphs with symbolic sizes (False: fixed shapes only)
    reuse: CompilerFn | None = None  # (gm, inputs, artefact=bytes, **options): from an artefact
    native_artefacts: bool = False  # loading its artefacts runs their code (trusted stores only)
    revive: CompilerFn | None = None  # (artefact=bytes, facts=dict, **options): no graph needed
    prepare: CompilerFn | None = None  # (gm, inputs, **options) -> () -> Artefact, built apart

    def reusing(self, data: bytes) -> Backend:
        """This backend compiling from a stored artefact's `data` (its `reuse` hook)."""
        if self.reuse is None:
            raise ValueError(f"backend {self.name!r} has no reuse hook")
        return dataclasses.replace(self, compiler=functools.partial(self.reuse, artefact=data))

    @property
    def exportable(self) -> bool:
        """Whether `chain.export` can put this backend's compiled parts in a program."""
        return self.exporter is not None and self.loader is not None

    def __call__(
        self, gm: fx.GraphModule, example_inputs: Sequence[torch.Tensor], **options: Any
    ) -> CompiledFn:
        if not self.dynamic and (symbolic := symbolic_inputs(gm, example_inputs)):
            raise Unsupported(
                f"dynamic shapes: {self.name} compiles for fixed shapes; {symbolic[0]}"
            )
        return self.compiler(gm, list(example_inputs), **options)

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options, checked: InvalidOption names an unknown option or a refused value."""
        if self.options is None and self.vocabulary is None:
            return dict(options)
        table: dict[str, Check | None] = dict(self.vocabulary()) if self.vocabulary else {}
        table.update({name: self.checks.get(name) for name in self.options or ()})
        valid = None
        if self.vocabulary_doc:
            declared = ", ".join(sorted(self.options or ()))
            valid = f"{declared}, or {self.vocabulary_doc}" if declared else self.vocabulary_doc
        return check_options(f"backend {self.name!r}", options, table, valid)


class BackendRegistry:
    """Name -> Backend. Use `register` as a decorator; `snapshot()` restores it after tests."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}

    def register(
        self,
        name: str,
        *,
        available: Callable[[], str | None] = always_available,
        options: Sequence[str] | Mapping[str, Check | None] | None = (),
        tags: Sequence[str] = (),
        replace: bool = False,
        vocabulary: Vocabulary | None = None,
        vocabulary_doc: str | None = None,
        graphed: CompilerFn | None = None,
        exporter: Exporter | None = None,
        loader: Loader | None = None,
        dynamic: bool = True,
        reuse: CompilerFn | None = None,
        native_artefacts: bool = False,
        revive: CompilerFn | None = None,
        prepare: CompilerFn | None = None,
    ) -> Callable[[CompilerFn], Backend]:
        """Decorator: register `fn(gm, example_inputs, **options)` under `name`.

        `options`: the option names, or a mapping of names to value checks
        (`backends.options`: `one_of`, `integer`, ...; None for no check).
        `graphed(gm, example_inputs, **options)`, when given, compiles the same way and runs
        the result under CUDA graphs (the chain's `cuda_graphs` stage tries it as a variant).
        `exporter` and `loader` (given together) make the backend exportable: see
        `backends.common.parts`. `dynamic=False`: the backend compiles for fixed shapes
        only, and graphs with symbolic sizes are refused before it is called.
        `reuse(gm, example_inputs, artefact=bytes, **options)` compiles from an `Artefact`
        the backend's compiled callable offered (`chain_artefact`), skipping its expensive step.
        `native_artefacts`: its artefacts hold native code, loaded only from trusted stores.
        `revive(artefact=bytes, facts=dict, **options)` runs a `Revival` its compiled
        callable offered, in another process, without the graph (torch's precompile).
        `prepare(gm, example_inputs, **options) -> () -> Artefact`: its artefact's build
        prepared without compiling in this process (a challenger built in a child).
        """
        if (exporter is None) != (loader is None):
            raise ValueError(f"backend {name!r}: give both exporter and loader, or neither")
        checks = (
            {k: v for k, v in options.items() if v is not None}
            if isinstance(options, Mapping)
            else {}
        )

        def decorate(fn: CompilerFn) -> Backend:
            if name in self._backends and not replace:
                raise ValueError(f"backend {name!r} is already registered")
            backend = Backend(
                name=name,
                compiler=fn,
                available=functools.cache(available),
                options=None if options is None else frozenset(options),
                doc=(fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else "",
                tags=tuple(tags),
                checks=checks,
                vocabulary=vocabulary,
                vocabulary_doc=vocabulary_doc,
                graphed=graphed,
                exporter=exporter,
                loader=loader,
                dynamic=dynamic,
                reuse=reuse,
                native_artefacts=native_artefacts,
                revive=revive,
                prepare=prepare,
            )
            self._backends[name] = backend
            return backend

        return decorate

    def graphed_variant(self, name: str) -> Callable[[CompilerFn], CompilerFn]:
        """Decorator: `fn` is the CUDA graphs variant of the registered backend `name`.

        For a backend whose package registers it elsewhere: its graphs module adds the hook.
        """

        def decorate(fn: CompilerFn) -> CompilerFn:
            if name not in self._backends:
                raise ValueError(f"no backend {name!r} to give a CUDA graphs variant")
            self._backends[name] = dataclasses.replace(self._backends[name], graphed=fn)
            return fn

        return decorate

    def lookup(self, name: str) -> Backend:
        """Our registry first, then dynamo's; raise InvalidBackend listing both."""
        if name in self._backends:
            return self._backends[name]
        from torch._dynamo import lookup_backend

        dynamo_names = self.dynamo_names()
        if name in dynamo_names:
            fn = lookup_backend(name)
            return Backend(
                name=name,
                compiler=fn,
                available=functools.cache(functools.partial(dynamo_available, name)),
                options=None,
                tags=("dynamo",),
            )
        hint = did_you_mean(name, [*self.names(), *dynamo_names])
        raise InvalidBackend(
            f"unknown backend {name!r}{hint}; ours: {', '.join(self.names())}; "
            f"dynamo's: {', '.join(dynamo_names)}"
        )

    def dynamo_names(self) -> list[str]:
        """Dynamo's backends not shadowed by ours, less its `*_TESTING_ONLY` fault injectors."""
        from torch._dynamo import list_backends

        return [
            n
            for n in list_backends(exclude_tags=())
            if n not in self._backends and not n.endswith("_TESTING_ONLY")
        ]

    def names(self) -> list[str]:
        return sorted(self._backends)

    def loader(self, name: str) -> Loader | None:
        """The payload loader of our backend `name`, or None (unknown or not exportable)."""
        backend = self._backends.get(name)
        return backend.loader if backend is not None else None

    def exportable_names(self) -> list[str]:
        """Our backends with export hooks: the ones whose payloads a program may hold."""
        return [n for n in self.names() if self._backends[n].exportable]

    def __contains__(self, name: object) -> bool:
        return name in self._backends

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[BackendRegistry]:
        """Within the block, registrations are temporary: the registry is restored after."""
        with restored(self, "_backends"):
            yield self


@contextlib.contextmanager
def restored(owner: object, attribute: str) -> Iterator[None]:
    """Within the block `owner.attribute` (a dict or list) is a copy; the original returns after.

    The registries' `snapshot()`: tests register freely and leave nothing behind.
    """
    original = getattr(owner, attribute)
    setattr(owner, attribute, copy.copy(original))
    try:
        yield
    finally:
        setattr(owner, attribute, original)


def import_submodules(package_name: str) -> list[str]:
    """Import every module and subpackage of `package`, in name order: the folder is the list.

    As dynamo's `import_submodule` does for `torch._dynamo.backends`: each backend module
    registers itself when imported, so adding a backend is adding a file (or a folder whose
    `__init__` imports its variants). Names starting with `_` are skipped. A module must be
    cheap to import: heavy libraries (onnxruntime, tensorrt) load inside `available()` or
    the compiler, never at import time. Returns the names imported.
    """
    package = importlib.import_module(package_name)
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__))
    names = [n for n in names if not n.startswith("_")]
    for name in names:
        importlib.import_module(f"{package_name}.{name}")
    return names


# dynamo's named backends that need a package torch does not bring: (module, install hint)
DYNAMO_PACKAGES: dict[str, tuple[str, str]] = {
    "tvm": ("tvm", "pip install apache-tvm"),
    "openxla": ("torch_xla", "pip install torch_xla (https://github.com/pytorch/xla)"),
    "openxla_eval": ("torch_xla", "pip install torch_xla (https://github.com/pytorch/xla)"),
    "torchxla_trace_once": ("torch_xla", "pip install torch_xla"),
    "aot_torchxla_trace_once": ("torch_xla", "pip install torch_xla"),
    "tensorrt": ("torch_tensorrt", "pip install torch-tensorrt"),
    "torch_tensorrt": ("torch_tensorrt", "pip install torch-tensorrt"),
    "ipex": ("intel_extension_for_pytorch", "pip install intel-extension-for-pytorch"),
    "onnxrt": ("onnxruntime", "pip install onnxruntime"),
}


def dynamo_available(name: str) -> str | None:
    """`available()` of dynamo's backend `name`: None, or why not (its package is missing,
    with the install hint), checked without importing the package: dynamo lists tvm and
    openxla whether or not they are installed, and they fail only once called."""
    if name not in DYNAMO_PACKAGES:
        return None
    module, hint = DYNAMO_PACKAGES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError) as e:  # a broken install: say so, as missing
        return f"{module} cannot be found ({type(e).__name__}: {e}): {hint}"
    return None if found else f"{module} is not installed: {hint}"


registry = BackendRegistry()
register_backend = registry.register
lookup_backend = registry.lookup
