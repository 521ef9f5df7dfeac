"""An nn.Module that runs a serialized TensorRT engine on torch CUDA tensors.

Inputs are bound by address (`set_tensor_address`), outputs are allocated by torch, and
the engine runs on torch's current CUDA stream (`execute_async_v3`), so it orders with the
PyTorch parts around it without extra synchronisation. An engine built with optimization
profiles (a block of a graph with symbolic sizes) switches to the first profile containing
the call's input shapes (`runtime.profile_choice`); a shape no profile contains raises
`NoProfile` before TensorRT is called, and the chain's guard falls back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from backends.tensorrt.conversion.profiles import Profile
from backends.tensorrt.runtime.profile_choice import choose_profile


def torch_dtype(trt_dtype: Any) -> torch.dtype:
    """The torch dtype of a TensorRT tensor dtype."""
    import tensorrt as trt

    table = {
        trt.float32: torch.float32,
        trt.float16: torch.float16,
        trt.bfloat16: torch.bfloat16,
        trt.int32: torch.int32,
        trt.int64: torch.int64,
        trt.int8: torch.int8,
        trt.uint8: torch.uint8,
        trt.bool: torch.bool,
    }
    if trt_dtype not in table:
        raise TypeError(f"TensorRT dtype {trt_dtype} has no torch equivalent")
    return table[trt_dtype]


class TensorRTEngineModule(nn.Module):
    """Runs one engine; returns a tensor, or a tuple when the block returned several."""

    def __init__(
        self,
        engine: bytes,
        input_names: Sequence[str],
        output_names: Sequence[str],
        returns_tuple: bool,
        profiles: Sequence[Profile] = (),
        input_positions: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        self.serialized = engine
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.returns_tuple = returns_tuple
        self.profiles = tuple(profiles)  # keyed by input name; () for a fixed-shape engine
        # which forward arguments feed the engine (None: all, in order); the others are
        # sizes the engine reads from its tensors' shapes
        self.input_positions = None if input_positions is None else tuple(input_positions)
        self._active = 0  # the context's profile (TensorRT selects profile 0 at creation)
        self._runtime: Any = None  # kept alive as long as the engine it deserialized
        self._engine: Any = None
        self._context: Any = None

    def load(self) -> None:
        """Deserialize the engine and make its context now (a bad engine fails here, once)."""
        import tensorrt as trt

        from backends.tensorrt.conversion.engine import trt_logger

        runtime = trt.Runtime(trt_logger())
        engine = runtime.deserialize_cuda_engine(self.serialized)
        if engine is None:
            raise RuntimeError(
                "TensorRT could not deserialize the engine (version or GPU changed?)"
            )
        names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
        missing = set(self.input_names + self.output_names) - names
        if missing:
            raise RuntimeError(f"engine lacks tensors {sorted(missing)}; it has {sorted(names)}")
        for name in self.input_names:
            if engine.get_tensor_mode(name) != trt.TensorIOMode.INPUT:
                raise RuntimeError(f"engine tensor {name!r} is not an input")
        self._runtime, self._engine = runtime, engine
        self._context = engine.create_execution_context()
        self._active = 0

    def forward(self, *args: Any) -> torch.Tensor | tuple[torch.Tensor, ...]:
        inputs = args if self.input_positions is None else [args[i] for i in self.input_positions]
        if len(inputs) != len(self.input_names):
            raise TypeError(f"engine takes {len(self.input_names)} inputs, got {len(inputs)}")
        profile = None
        if self.profiles:
            shapes = {n: tuple(t.shape) for n, t in zip(self.input_names, inputs, strict=True)}
            profile = choose_profile(self.profiles, shapes)  # NoProfile: before any TRT call
        if self._context is None:
            self.load()
        engine, context = self._engine, self._context
        device = inputs[0].device if inputs else torch.device("cuda")
        stream = torch.cuda.current_stream(device)
        if profile is not None and profile != self._active:
            # IExecutionContext.set_optimization_profile_async(index, stream) -> bool
            # (TensorRT 10 Python API; C++ setOptimizationProfileAsync); set before the
            # input shapes, which it invalidates
            if not context.set_optimization_profile_async(profile, stream.cuda_stream):
                raise RuntimeError(f"TensorRT refused to switch to optimization profile {profile}")
            self._active = profile
        keep = []
        for name, tensor in zip(self.input_names, inputs, strict=True):
            expected = torch_dtype(engine.get_tensor_dtype(name))
            tensor = tensor.to(device=device, dtype=expected).contiguous()
            keep.append(tensor)
            if not context.set_input_shape(name, tuple(tensor.shape)):
                raise RuntimeError(f"TensorRT refused shape {tuple(tensor.shape)} for {name!r}")
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = []
        for name in self.output_names:
            shape = tuple(context.get_tensor_shape(name))
            dtype = torch_dtype(engine.get_tensor_dtype(name))
            out = torch.empty(shape, dtype=dtype, device=device)
            context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        del keep  # the stream orders later frees after the engine ran
        return tuple(outputs) if self.returns_tuple else outputs[0]
