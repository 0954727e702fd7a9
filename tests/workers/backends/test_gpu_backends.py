"""GPU paths of the TorchScript and TensorRT backends: KIND_GPU instances, device
inputs (cupy arrays, as a client's CUDA shared memory gives them) used in place,
outputs left on the device for the worker to copy.

Each test skips unless its framework can use a CUDA GPU here.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.deploy.example_repo import write_model

LEVEL = "e2e"

pytestmark = pytest.mark.gpu


def _cupy_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


def _torch_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


needs_torch_cuda = pytest.mark.skipif(not (_torch_cuda() and _cupy_gpu()),
                                      reason="needs torch with CUDA, cupy and a GPU")
needs_tensorrt = pytest.mark.skipif(importlib.util.find_spec("tensorrt") is None or not _cupy_gpu(),
                                    reason="needs TensorRT, cupy and a GPU")

GPU_GROUP = "instance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]"


# --- TorchScript ---------------------------------------------------------------------------------


@needs_torch_cuda
def test_torch_kind_gpu_uses_device_arrays_in_place(tmp_path: Path) -> None:
    import cupy
    import torch

    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.pytorch.backend import TorchScriptBackend
    from tests.support import torch_models

    text = torch_models.ADD_SUB_CONFIG.format(name="m", extra=GPU_GROUP)
    path = torch_models.save(torch.jit.script(torch_models.AddSub()), str(tmp_path), "m", text)
    backend = TorchScriptBackend(path, parse_text(text), "cuda:0")
    assert backend.accepts_device_arrays and backend.device == torch.device("cuda:0")
    a, b = np.arange(16, dtype=np.float32), np.ones(16, dtype=np.float32)
    out = backend.execute({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0"])  # host inputs go to the device
    assert isinstance(out["OUTPUT__0"], cupy.ndarray)
    np.testing.assert_array_equal(out["OUTPUT__0"].get(), a + b)
    da, db = cupy.asarray(a), cupy.asarray(b)
    assert backend.tensors.to_torch("INPUT__0", da).data_ptr() == da.data.ptr  # DLPack: no copy
    out = backend.execute({"INPUT__0": da, "INPUT__1": db}, ["OUTPUT__0", "OUTPUT__1"])
    assert all(isinstance(v, cupy.ndarray) for v in out.values())
    np.testing.assert_array_equal(out["OUTPUT__1"].get(), a - b)


def _cudashm() -> Any:
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as exc:  # needs cuda-python (cuda.bindings)
        pytest.skip(f"tritonclient's cuda_shared_memory is unavailable: {exc}")
    return cudashm


@needs_torch_cuda
def test_torch_cuda_shared_memory_in_and_out(tmp_path: Path) -> None:
    """A client's CUDA regions feed a KIND_GPU TorchScript model in place and receive its output."""
    import tritonclient.grpc as tg
    import tritonclient.http as th

    from tests.support import torch_models
    from tests.support.group import start_server

    cudashm = _cudashm()
    repo = str(tmp_path)
    torch_models.add_sub(repo, "torch_gpu", GPU_GROUP)
    srv = start_server(repo, f"g{os.getpid()}", "--workers", "1", "--allow-client-shm", "true")
    a, b = np.arange(16, dtype=np.float32), np.full(16, 2.0, dtype=np.float32)
    ins = cudashm.create_shared_memory_region("tin", a.nbytes * 2, 0)
    outs = cudashm.create_shared_memory_region("tout", a.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(ins, [a, b])
        http, grpc = th.InferenceServerClient(srv.http_url), tg.InferenceServerClient(srv.grpc_url)
        http.register_cuda_shared_memory("tin", cudashm.get_raw_handle(ins), 0, a.nbytes * 2)
        http.register_cuda_shared_memory("tout", cudashm.get_raw_handle(outs), 0, a.nbytes)
        for client, mod in ((http, th), (grpc, tg)):
            inputs = [mod.InferInput("INPUT__0", [16], "FP32"), mod.InferInput("INPUT__1", [16], "FP32")]
            inputs[0].set_shared_memory("tin", a.nbytes)
            inputs[1].set_shared_memory("tin", b.nbytes, offset=a.nbytes)
            out = mod.InferRequestedOutput("OUTPUT__1")
            out.set_shared_memory("tout", a.nbytes)
            client.infer("torch_gpu", inputs, outputs=[out])
            np.testing.assert_array_equal(cudashm.get_contents_as_numpy(outs, np.float32, [16]), a - b)
            cudashm.set_shared_memory_region(outs, [np.zeros_like(a)])
        http.unregister_cuda_shared_memory()
    finally:
        cudashm.destroy_shared_memory_region(ins)
        cudashm.destroy_shared_memory_region(outs)
        assert srv.stop() == 0


# --- TensorRT ------------------------------------------------------------------------------------

TRT_CONFIG = """name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }}
]
dynamic_batching {{ }}
instance_group [{{ kind: KIND_GPU count: 1 gpus: [0] }}]
"""


def build_trt_add_sub(repo: str, name: str) -> str:
    """Triton's 'simple' add/sub as an ONNX graph, built into a TensorRT engine here (batch 1..8)."""
    import tensorrt as trt

    from conveyor.deploy.example_repo import add_sub

    add_sub(repo, f"{name}_onnx", 8)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "EXPLICIT_BATCH"):  # TensorRT 8; always explicit from 10
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    with open(os.path.join(repo, f"{name}_onnx", "1", "model.onnx"), "rb") as f:
        assert parser.parse(f.read()), [str(parser.get_error(i)) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        profile.set_shape(network.get_input(i).name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    return os.path.join(write_model(repo, name, TRT_CONFIG.format(name=name), {"model.plan": bytes(plan)}),
                        "1", "model.plan")


@needs_tensorrt
def test_tensorrt_engine_runs_host_and_device_inputs(tmp_path: Path) -> None:
    import cupy

    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.tensorrt import TensorRtBackend

    path = build_trt_add_sub(str(tmp_path), "trt")
    backend = TensorRtBackend(path, parse_text(TRT_CONFIG.format(name="trt")), "cuda:0")
    a = np.arange(3 * 16, dtype=np.int32).reshape(3, 16)
    b = np.full((3, 16), 5, dtype=np.int32)
    out = backend.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    assert isinstance(out["OUTPUT0"], cupy.ndarray)
    np.testing.assert_array_equal(out["OUTPUT0"].get(), a + b)
    np.testing.assert_array_equal(out["OUTPUT1"].get(), a - b)
    out = backend.execute({"INPUT0": cupy.asarray(a[:1]), "INPUT1": cupy.asarray(b[:1])}, ["OUTPUT1"])
    np.testing.assert_array_equal(out["OUTPUT1"].get(), a[:1] - b[:1])
    backend.close()


@needs_tensorrt
def test_tensorrt_model_served(tmp_path: Path) -> None:
    import tritonclient.http as th

    from tests.support.group import start_server

    repo = str(tmp_path)
    build_trt_add_sub(repo, "trt")
    srv = start_server(repo, f"g{os.getpid()}", "--workers", "1")
    try:
        client = th.InferenceServerClient(srv.http_url)
        a = np.arange(2 * 16, dtype=np.int32).reshape(2, 16)
        inputs = [th.InferInput("INPUT0", [2, 16], "INT32"), th.InferInput("INPUT1", [2, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        result = client.infer("trt", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * a)
    finally:
        assert srv.stop() == 0


# --- onnxruntime execution accelerators ----------------------------------------------------------


def _ort_providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:
        return []


needs_ort_cuda = pytest.mark.skipif("CUDAExecutionProvider" not in _ort_providers() or not _cupy_gpu(),
                                    reason="needs onnxruntime-gpu, cupy and a GPU")
needs_ort_tensorrt = pytest.mark.skipif("TensorrtExecutionProvider" not in _ort_providers() or not _cupy_gpu(),
                                        reason="needs onnxruntime-gpu with its TensorRT provider and a GPU")


@needs_ort_cuda
def test_ort_cuda_accelerator_options_reach_the_cuda_provider(tmp_path: Path) -> None:
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend
    from tests.support import external_data_models as ext

    text = ext.CONFIG + GPU_GROUP + """
    parameters { key: "arena_extend_strategy" value: { string_value: "1" } }
    parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0;gpu:0" } }
    optimization { execution_accelerators { gpu_execution_accelerator [{
      name: "cuda"
      parameters { key: "cudnn_conv_algo_search" value: "HEURISTIC" }
      parameters { key: "gpu_mem_limit" value: "1073741824" }
    }]}}"""
    path = ext.model_directory(str(tmp_path), "m", text)  # external data on the GPU path too
    backend = OnnxRuntimeBackend(path, parse_text(text), "cuda:0")
    assert backend.session.get_providers()[0] == "CUDAExecutionProvider"
    cuda = backend.session.get_provider_options()["CUDAExecutionProvider"]
    assert cuda["cudnn_conv_algo_search"] == "HEURISTIC" and cuda["gpu_mem_limit"] == "1073741824"
    assert cuda["arena_extend_strategy"] == "kSameAsRequested" and cuda["device_id"] == "0"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):  # both arenas shrink after each run; the next run still works
        np.testing.assert_array_equal(backend.execute({"X": x}, ["Y"])["Y"], ext.expected(x))
    backend.close()


@needs_ort_tensorrt
def test_ort_tensorrt_accelerator_runs_before_cuda(tmp_path: Path) -> None:
    from conveyor.proto.errors import ConveyorError
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend
    from tests.support import external_data_models as ext

    cache = tmp_path / "engines"
    text = ext.CONFIG + GPU_GROUP + f"""
    optimization {{ execution_accelerators {{ gpu_execution_accelerator [{{
      name: "tensorrt"
      parameters {{ key: "precision_mode" value: "FP16" }}
      parameters {{ key: "max_workspace_size_bytes" value: "268435456" }}
      parameters {{ key: "trt_engine_cache_enable" value: "1" }}
      parameters {{ key: "trt_engine_cache_path" value: "{cache}" }}
    }}]}}}}"""
    path = ext.model_file_beside_data(str(tmp_path), "m", text)
    try:
        backend = OnnxRuntimeBackend(path, parse_text(text), "cuda:0")
    except ConveyorError as exc:
        # onnxruntime-gpu lists the provider even where TensorRT's libraries are missing;
        # the backend must refuse that (not fall back to CUDA), which is what this checks then.
        assert "could not start TensorrtExecutionProvider" in exc.message
        pytest.skip(f"TensorRT's libraries are not loadable here: {exc.message}")
    assert backend.session.get_providers()[:2] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    trt = backend.session.get_provider_options()["TensorrtExecutionProvider"]
    assert trt["trt_fp16_enable"] in ("1", "True", "true") and trt["trt_max_workspace_size"] == "268435456"
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(backend.execute({"X": x}, ["Y"])["Y"], ext.expected(x), rtol=1e-2)
    assert any(cache.iterdir()), "the engine cache is empty"
    backend.close()
