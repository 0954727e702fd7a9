"""Backends by name, imported on first use so a worker only loads what it runs.

The pytorch, tensorrt, fil, openvino and tensorflow modules raise an UNAVAILABLE ``ConveyorError`` on import
when their framework is not installed, so the model says why it cannot load."""

from __future__ import annotations

from collections.abc import Callable

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import unsupported
from conveyor.proto.triton_test_backends import NAMES as TRITON_TEST_BACKENDS
from conveyor.workers.backends.base import Backend, RequestBackend


def load_backend(
    backend: str, path: str, config: mc.ModelConfig, device: str, instance: int = 0, instance_name: str = "",
    post: Callable[[bytes], None] | None = None,
) -> Backend | RequestBackend:
    """``instance``: the router's number of the instance; ``instance_name``: Triton's name of it;
    ``post``: sends a message to the router from any thread (a vLLM engine's evictions)."""
    if backend == "onnxruntime":
        from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend(path, config, device)
    if backend == "python":
        from conveyor.workers.backends.python.backend import PythonBackend

        return PythonBackend(path, config, device, instance, instance_name)
    if backend == "pytorch" and config.platform == "torch_aoti":
        from conveyor.workers.backends.pytorch.aoti import AotiBackend

        return AotiBackend(path, config, device)
    if backend == "pytorch":
        from conveyor.workers.backends.pytorch.backend import TorchScriptBackend

        return TorchScriptBackend(path, config, device)
    if backend == "tensorrt":
        from conveyor.workers.backends.tensorrt import TensorRtBackend

        return TensorRtBackend(path, config, device)
    if backend == "vllm":
        from conveyor.workers.backends.vllm.backend import VllmBackend

        return VllmBackend(path, config, device, instance_name, instance, post)
    if backend == "fil":
        from conveyor.workers.backends.fil.backend import FilBackend

        return FilBackend(path, config, device)
    if backend == "openvino":
        from conveyor.workers.backends.openvino.backend import OpenVinoBackend

        return OpenVinoBackend(path, config, device)
    if backend == "tensorflow":
        from conveyor.workers.backends.tensorflow.backend import TensorFlowBackend

        return TensorFlowBackend(path, config, device)
    if backend in TRITON_TEST_BACKENDS:
        from conveyor.workers.backends.triton_test import load_test_backend

        return load_test_backend(backend, path, config, device, instance_name)
    raise unsupported(f"backend '{backend}' is not supported by this worker")
