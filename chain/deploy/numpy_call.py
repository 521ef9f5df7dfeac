"""The loaded program's call on numpy views: the fewest torch entry points per call.

After an idle gap each distinct torch or C entry point a call touches runs from cold caches
(20 ms idle on the 2-core VM: `x.dtype`/`x.shape`/`x.is_cpu`/`requires_grad`/`is_neg`/
`is_conj` ~45 us an input, `torch.compiler.is_compiling` two Python frames; issue 47). The
ONNX Runtime runner needs each input's numpy view anyway, and `Tensor.numpy()` itself
refuses what the direct path must leave to the graph (a negative or conjugate bit, a tensor
off the CPU, a dtype numpy lacks; a gradient only under grad mode, so `requires_grad` stays
a getter): this call takes the view and checks its dtype and shape, no other torch getter.
What it checks, and where each refusal goes, is `Direct.fused`'s: the modes first, then
each input's type, gradient, dtype and shape before ONNX Runtime sees it (a mismatch goes
to the graph, which raises the same `InputMismatch`), then the outputs against the node's
declared specs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from backends.common.payload import check_outputs

NumpyRun = Callable[[list[str], dict[str, Any], Any], list[Any]]
_Tensor = torch.Tensor
_numpy = torch.Tensor.numpy
_requires_grad = torch._C.TensorBase.requires_grad.__get__
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_transforms = torch._C._are_functorch_transforms_active
_dynamo = torch.compiler.is_dynamo_compiling  # one frame; dynamo folds it to True
_compiler = torch.compiler  # its `_is_compiling_flag`: the rest of `is_compiling()`


def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype `Tensor.numpy()` gives a `dtype` tensor; None where it has none."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:  # bfloat16, float8, ...: `numpy()` refuses them, so does this path
        return None


def compiling() -> bool:
    """`torch.compiler.is_compiling()` without its `torch.jit.is_scripting()` frame (the
    loaded program is never scripted): dynamo tracing, or torch's own compiling flag."""
    return _dynamo() or _compiler._is_compiling_flag


def numpy_fused(
    facts: Sequence[tuple[torch.dtype, torch.Size]],
    want: Sequence[tuple[torch.Size, torch.dtype]] | None,
    parts: tuple[NumpyRun, list[str], tuple[str, ...]],
    choose: Callable[[Any], tuple[Any, ...]],
    unflatten: Callable[[Any], Any],
    graph: Callable[..., Any],
    outputs: str,
) -> Callable[..., Any] | None:
    """The program call for positional static CPU inputs, all fed to the payload in order:
    `parts` is the runner's (session run, output names, input names). None when a dtype has
    no numpy twin (`Direct.fused` then serves)."""
    inputs = [(numpy_dtype(dtype), tuple(size)) for dtype, size in facts]
    results = [(tuple(shape), numpy_dtype(dtype)) for shape, dtype in want or ()]
    if any(d is None for d, _ in inputs) or any(d is None for _, d in results):
        return None
    run, names, feeds = parts
    count, flat = len(inputs), choose is tuple
    dispatch, function, transforms = _dispatch_modes, _function_modes, _transforms
    tensor, numpy, requires_grad = _Tensor, _numpy, _requires_grad
    from_numpy = torch.from_numpy

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != count or compiling() or dispatch() or function() or transforms():
            return graph(*args, **kwargs)
        for x in args:  # numpy() takes a tensor that requires grad under no_grad: the graph's
            if type(x) is not tensor or requires_grad(x):
                return graph(*args, **kwargs)
        try:
            arrays = list(map(numpy, args))
        except (RuntimeError, TypeError):  # a neg/conj bit, not on the CPU, no numpy dtype:
            return graph(*args, **kwargs)  # the graph serves it (or raises its InputMismatch)
        for array, (dtype, shape) in zip(arrays, inputs, strict=False):  # len(args) == count
            if array.dtype is not dtype or array.shape != shape:
                return graph(*args, **kwargs)
        outs = run(names, dict(zip(feeds, arrays, strict=False)), None)
        if want is not None:  # a loop, not any(): no generator frame per call
            if len(outs) != len(results):
                check_outputs(list(map(from_numpy, outs)), outputs, list(args))  # raises
            for out, (shape, dtype) in zip(outs, results, strict=False):
                if out.shape != shape or out.dtype is not dtype:
                    check_outputs(list(map(from_numpy, outs)), outputs, list(args))  # raises
        if flat:
            return unflatten(tuple(map(from_numpy, outs)))
        return unflatten(choose(list(map(from_numpy, outs))))

    return call
