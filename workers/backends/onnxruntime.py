"""ONNX models on onnxruntime: CPU by default, CUDA for KIND_GPU instances.

A CUDA instance given device arrays (inputs in a client's CUDA shared memory)
binds them in place with IOBinding and leaves its outputs on the device, so the
tensors never make a host round trip.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable
from conveyor.workers.client_regions import is_device_array

# ORT's element type names for the numeric types a device tensor can have.
_ORT_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def _parameter(config: mc.ModelConfig, key: str) -> str:
    p = config.parameters.get(key)
    return p.string_value if p is not None else ""


def session_options(config: mc.ModelConfig) -> ort.SessionOptions:
    """Triton's onnxruntime backend parameters, where they map onto ORT options."""
    opts = ort.SessionOptions()
    intra = _parameter(config, "intra_op_thread_count")
    inter = _parameter(config, "inter_op_thread_count")
    # NOTE: one thread by default: each worker process is already one unit of
    # parallelism, and ORT's default (all cores per session) oversubscribes.
    opts.intra_op_num_threads = int(intra) if intra else 1
    if inter:
        opts.inter_op_num_threads = int(inter)
        opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    level = config.optimization.graph.level
    opts.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    return opts


def providers_for(device: str) -> list[str]:
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise unavailable(
                "the config asks for a GPU instance but onnxruntime has no CUDA execution provider "
                "(install conveyor[gpu] on a host with a GPU)"
            )
        return ["CUDAExecutionProvider"]
    return ["CPUExecutionProvider"]


class OnnxRuntimeBackend:
    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        providers: list[str | tuple[str, dict[str, str]]] = list(providers_for(device))
        self.device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
        self.accepts_device_arrays = device.startswith("cuda")
        if device.startswith("cuda:"):
            providers = [("CUDAExecutionProvider", {"device_id": str(self.device_id)})]
        try:
            self.session = ort.InferenceSession(path, sess_options=session_options(config), providers=providers)
        except Exception as exc:
            raise unavailable(f"onnxruntime could not load '{path}': {exc}") from None
        self._string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        if self.accepts_device_arrays and any(is_device_array(a) for a in inputs.values()):
            return self._execute_on_device(inputs, outputs)
        feed = {
            # ORT's string tensors take str elements.
            name: (_decode(arr) if name in self._string_inputs else arr) for name, arr in inputs.items()
        }
        try:
            results = self.session.run(outputs, feed)
        except Exception as exc:
            raise internal(f"onnxruntime execution failed: {exc}") from None
        return dict(zip(outputs, results, strict=True))

    def _execute_on_device(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        import cupy

        binding = self.session.io_binding()
        keep = []  # contiguous copies must outlive the run
        for name, arr in inputs.items():
            if is_device_array(arr):
                arr = cupy.ascontiguousarray(arr)
                keep.append(arr)
                binding.bind_input(name, "cuda", self.device_id, arr.dtype, list(arr.shape), arr.data.ptr)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in outputs:
            binding.bind_output(name, "cuda", self.device_id)
        try:
            self.session.run_with_iobinding(binding)
        except Exception as exc:
            raise internal(f"onnxruntime execution failed: {exc}") from None
        return {name: _device_array(value, self.device_id) for name, value in zip(outputs, binding.get_outputs(),
                                                                                 strict=True)}

    def close(self) -> None:
        del self.session


def _device_array(value: Any, device_id: int) -> Any:
    """A cupy view of an OrtValue on the GPU; the view keeps the OrtValue alive."""
    import cupy

    dtype = np.dtype(_ORT_NUMPY[value.data_type()])
    shape = tuple(value.shape())
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    mem = cupy.cuda.UnownedMemory(value.data_ptr(), nbytes, value, device_id=device_id)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))


def _decode(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=np.object_)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, b in enumerate(flat_in):
        flat_out[i] = b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)
    return out
