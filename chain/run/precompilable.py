"""The chain's compiled graph as torch's `SerializableCallable` (torch's precompile:
`aot_compile`, `save_compiled_function`, `load_compiled_function`): the bytes and their
checks are `chain.deploy.precompile`'s; on a torch without precompile, a plain base."""

from __future__ import annotations

import importlib.util
from typing import Any

if importlib.util.find_spec("torch._dynamo.aot_compile_types") is not None:
    from torch._dynamo.aot_compile_types import SerializableCallable as _Base
else:  # torch < 2.12 has no precompile: nothing asks for the methods below
    _Base = object  # type: ignore[assignment,misc]


class Precompilable(_Base):  # type: ignore[misc,valid-type]
    """Saves a compiled graph as its decision and its winner's artefact (signed), and loads
    it without compiling; a graph whose winner cannot be saved is a one-line refusal."""

    __slots__ = ()

    @classmethod
    def serialize_compile_artifacts(cls, fn: Any) -> bytes:
        from chain.deploy.precompile import serialize

        return serialize(fn)

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        from chain.deploy.precompile import deserialize

        return deserialize(data)
