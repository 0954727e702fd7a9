"""TensorRT engines (``platform: "tensorrt_plan"`` / ``backend: "tensorrt"``,
``<version>/model.plan``) with the TensorRT Python API, device memory held by cupy.

Each call sets the input shapes (dynamic dimensions), binds device buffers by
tensor name and runs ``execute_async_v3`` on the instance's own stream. Inputs a
client placed in CUDA shared memory are bound in place; host inputs are copied
to the device once. Outputs come back as cupy arrays, so the worker copies them
device-to-device into a client's CUDA region, or once to the host otherwise.

An engine only runs on an NVIDIA GPU: without TensorRT, cupy or a GPU the model
is unavailable with that reason and every other model keeps serving.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, invalid_arg, unavailable
from conveyor.proto.repository_files import read_bytes
from conveyor.workers.client_regions import is_device_array

try:
    import tensorrt as trt
except ImportError:  # this module is imported only to load a model: say why it cannot be
    raise unavailable("TensorRT is not installed in the worker's environment "
                      "(pip install 'conveyor[tensorrt,gpu]' on a host with an NVIDIA GPU)") from None

# Engine tensor types and the numpy dtype their bytes travel as (BF16 as raw 2-byte words).
_NUMPY = {
    trt.DataType.FLOAT: np.float32, trt.DataType.HALF: np.float16, trt.DataType.INT8: np.int8,
    trt.DataType.INT32: np.int32, trt.DataType.INT64: np.int64, trt.DataType.BOOL: np.bool_,
    trt.DataType.UINT8: np.uint8, trt.DataType.BF16: np.uint16,
}


def gpu_device_id(device: str, config: mc.ModelConfig) -> int:
    """The CUDA device this instance runs on; unavailable when there is none.

    With no ``instance_group`` the router gives every worker an instance of its
    own (``device`` "cpu"): it runs on GPU 0, where Triton's default puts it."""
    if any(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in config.instance_group):
        raise unavailable("TensorRT engines run on GPUs only: instance_group kind KIND_CPU is not supported")
    try:
        import cupy

        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise unavailable(f"no GPU: a TensorRT engine needs an NVIDIA GPU and cupy (conveyor[gpu]): {exc}") from None
    if count == 0:
        raise unavailable("no GPU: a TensorRT engine needs an NVIDIA GPU and this worker sees none")
    return int(device.split(":", 1)[1]) if device.startswith("cuda:") else 0


class TensorRtBackend:
    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        import cupy

        self.device_id = gpu_device_id(device, config)
        self.accepts_device_arrays = True
        self._logger = trt.Logger(trt.Logger.WARNING)
        with cupy.cuda.Device(self.device_id):
            try:
                plan = read_bytes(path, limit=None)  # never a FIFO's wait (proto/repository_files.py)
                self.engine = trt.Runtime(self._logger).deserialize_cuda_engine(plan)
            except OSError as exc:
                raise unavailable(f"cannot read TensorRT engine '{path}': {exc}") from None
            if self.engine is None:
                raise unavailable(f"TensorRT could not deserialize '{path}' (built by another TensorRT "
                                  f"version or for another GPU?)")
            self.context = self.engine.create_execution_context()
            self.stream = cupy.cuda.Stream()  # a blocking stream: ordered after the worker's default-stream copies
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes: dict[str, Any] = {}
        for n in names:
            dtype = _NUMPY.get(self.engine.get_tensor_dtype(n))
            if dtype is None:
                raise unavailable(f"tensor '{n}' has TensorRT type {self.engine.get_tensor_dtype(n)}, "
                                  f"which Conveyor cannot serve")
            if n in self.inputs and self.engine.is_shape_inference_io(n):
                raise unavailable(f"input '{n}' is a shape tensor, which Conveyor's TensorRT backend does not "
                                  f"support yet")
            self.dtypes[n] = np.dtype(dtype)
        for kind, declared, present in (("input", config.input, self.inputs), ("output", config.output, self.outputs)):
            unknown = [t.name for t in declared if t.name not in present]
            if unknown:
                raise unavailable(f"the config declares {kind}(s) {unknown} that the engine does not have; "
                                  f"its {kind}s are {present}")

    def execute(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        import cupy

        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise invalid_arg(f"the engine needs input(s) {missing}")
        with cupy.cuda.Device(self.device_id), self.stream:
            bound: dict[str, Any] = {}  # every buffer must outlive the run
            for name in self.inputs:
                arr = inputs[name]
                dev = cupy.ascontiguousarray(arr if is_device_array(arr) else cupy.asarray(np.asarray(arr)))
                if dev.dtype != self.dtypes[name]:
                    raise invalid_arg(f"input '{name}' is {dev.dtype}, the engine takes {self.dtypes[name]}")
                if not self.context.set_input_shape(name, tuple(dev.shape)):
                    raise invalid_arg(f"input '{name}': shape {list(dev.shape)} is outside the engine's profile")
                self.context.set_tensor_address(name, dev.data.ptr)
                bound[name] = dev
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise internal(f"output '{name}' has a data-dependent shape {list(shape)}, which Conveyor's "
                                   f"TensorRT backend does not support yet")
                out = cupy.empty(shape, dtype=self.dtypes[name])
                self.context.set_tensor_address(name, out.data.ptr)
                bound[name] = out
            if not self.context.execute_async_v3(self.stream.ptr):
                raise internal("TensorRT execution failed (execute_async_v3 returned false)")
            self.stream.synchronize()
        return {name: bound[name] for name in outputs}

    def close(self) -> None:
        del self.context
        del self.engine
