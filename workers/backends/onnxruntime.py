"""ONNX models on onnxruntime: CPU by default, CUDA for KIND_GPU instances."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable


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
        if device.startswith("cuda:"):
            providers = [("CUDAExecutionProvider", {"device_id": device.split(":", 1)[1]})]
        try:
            self.session = ort.InferenceSession(path, sess_options=session_options(config), providers=providers)
        except Exception as exc:
            raise unavailable(f"onnxruntime could not load '{path}': {exc}") from None
        self._string_inputs = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        feed = {
            # ORT's string tensors take str elements.
            name: (_decode(arr) if name in self._string_inputs else arr) for name, arr in inputs.items()
        }
        try:
            results = self.session.run(outputs, feed)
        except Exception as exc:
            raise internal(f"onnxruntime execution failed: {exc}") from None
        return dict(zip(outputs, results, strict=True))

    def close(self) -> None:
        del self.session


def _decode(arr: np.ndarray) -> np.ndarray:
    out = np.empty(arr.shape, dtype=np.object_)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, b in enumerate(flat_in):
        flat_out[i] = b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)
    return out
