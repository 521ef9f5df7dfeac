"""Machinery several backends share: the FX -> ONNX exporter, CUDA graph preconditions, ...

Nothing here registers a backend; each module is used by more than one backend folder.
"""
