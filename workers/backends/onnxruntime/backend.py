"""ONNX models on onnxruntime: CPU by default, CUDA for KIND_GPU instances, with
the execution accelerators and session options the config asks for
(``providers.py``, ``settings.py``).

A CUDA instance given device arrays (inputs in a client's CUDA shared memory)
binds them in place with IOBinding and leaves its outputs on the device, so the
tensors never make a host round trip.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, internal, unavailable
from conveyor.proto.onnx_graph import external_files
from conveyor.proto.repository_files import check_regular, unreadable
from conveyor.workers.backends.onnxruntime.providers import INSTALL, execution_providers
from conveyor.workers.backends.onnxruntime.settings import run_options, session_options
from conveyor.workers.backends.onnxruntime.validate import check_session
from conveyor.workers.client_regions import is_device_array

# ORT's element type names for the numeric types a device tensor can have.
_ORT_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


def model_file(path: str) -> str:
    """The ONNX file for a version's model path: as in Triton, a directory (a model
    with external data, e.g. over protobuf's 2 GB) holds it as ``model.onnx``. ORT
    resolves external-data locations relative to the file, so it must get the path."""
    return os.path.join(path, "model.onnx") if os.path.isdir(path) else path


def check_files(path: str, model: str) -> None:
    """UNAVAILABLE unless the model file and the external data files it names are regular files:
    ONNX Runtime opens them by name, and a FIFO among them would hold the instance's thread for ever
    (proto/repository_files.py). Checked here, opened again by ONNX Runtime: a name swapped between
    the two is not seen."""
    try:
        check_regular(path)
    except FileNotFoundError:
        raise unavailable(f"unable to find '{path}' for model '{model}'") from None
    except OSError as exc:
        raise unavailable(unreadable(path, exc)) from None
    try:
        external = external_files(path)
    except (OSError, ValueError):
        return  # no ONNX model this reader knows: ONNX Runtime says what is wrong with it
    for name in external:
        try:
            check_regular(name)
        except FileNotFoundError:
            continue  # ONNX Runtime's own error names it
        except OSError as exc:
            raise unavailable(unreadable(name, exc)) from None


class OnnxRuntimeBackend:
    # Short batches may run on the worker's main thread (workers/inline.py; a CPU session only): a
    # session is not tied to a thread.
    runs_on_any_thread = True

    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        path = model_file(path)
        check_files(path, config.name)
        providers = execution_providers(config, device, ort.get_available_providers())
        self.device_id = int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0
        self.accepts_device_arrays = device.startswith("cuda")
        self._run_options = run_options(config, device)
        try:
            self.session = ort.InferenceSession(path, sess_options=session_options(config), providers=providers)
        except Exception as exc:
            raise unavailable(f"onnxruntime could not load '{path}': {exc}") from None
        # ORT falls back to the next provider, with a warning, when one fails to start (a
        # TensorRT provider without TensorRT's libraries): refuse it, as Triton does.
        started = set(self.session.get_providers())
        missing = [name for name, _ in providers if name not in started]
        if missing:
            del self.session
            raise unavailable(f"onnxruntime could not start {', '.join(missing)} for '{path}' (its warning in the "
                              f"worker's log says why): {'; '.join(INSTALL.get(m, '') for m in missing)}")
        try:
            check_session(self.session, config)  # Triton's checks of the config against the model
        except ConveyorError:
            del self.session
            raise
        self._string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        if self.accepts_device_arrays and any(is_device_array(a) for a in inputs.values()):
            return self._execute_on_device(inputs, outputs)
        feed = {
            # ORT's string tensors take str elements.
            name: (_decode(arr) if name in self._string_inputs else arr) for name, arr in inputs.items()
        }
        try:
            results = self.session.run(outputs, feed, self._run_options)
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
            self.session.run_with_iobinding(binding, self._run_options)
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
