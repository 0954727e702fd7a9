"""GPU paths: an ONNX model with KIND_GPU runs on onnxruntime's CUDA provider; a client's CUDA
shared memory feeds ONNX models and receives their outputs.

Each test skips without what it needs: a GPU (seen through cupy), and onnxruntime's CUDA
execution provider (onnxruntime-gpu) for the KIND_GPU ONNX model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

LEVEL = "e2e"

ort = pytest.importorskip("onnxruntime")


def _have_gpu() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


ORT_CUDA = "CUDAExecutionProvider" in ort.get_available_providers() and _have_gpu()
GPU_GROUP = "\ninstance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]\n"

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not ORT_CUDA, reason="needs a CUDA GPU and onnxruntime-gpu")
def test_kind_gpu_instance_runs_on_cuda(tmp_path: object) -> None:
    from conveyor.deploy.example_repo import identity
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.onnxruntime.backend import OnnxRuntimeBackend

    repo = str(tmp_path)
    identity(repo, "gpu_identity", "FP32", 0, "-1")
    with open(f"{repo}/gpu_identity/config.pbtxt") as f:
        config = parse_text(f.read() + GPU_GROUP)
    backend = OnnxRuntimeBackend(f"{repo}/gpu_identity/1/model.onnx", config, "cuda:0")
    assert backend.session.get_providers()[0] == "CUDAExecutionProvider"
    x = np.arange(1024, dtype=np.float32)
    out = backend.execute({"INPUT0": x}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], x)


# --- CUDA shared memory end to end -------------------------------------------------------------


def _cudashm() -> object:
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as exc:  # needs cuda-python (cuda.bindings)
        pytest.skip(f"tritonclient's cuda_shared_memory is unavailable: {exc}")
    return cudashm


@pytest.mark.skipif(not _have_gpu(), reason="needs a CUDA GPU (and cupy)")
def test_cuda_shared_memory_in_and_out(tmp_path: object) -> None:
    """A client's CUDA regions feed a KIND_GPU model in place (where onnxruntime-gpu is) and a
    KIND_CPU one through the host, and receive their output, over HTTP and gRPC, with
    tritonclient's own cuda_shared_memory helpers."""
    import os

    import tritonclient.grpc as tg
    import tritonclient.http as th

    from conveyor.deploy.example_repo import identity
    from tests.support.group import start_server

    cudashm: Any = _cudashm()
    repo = str(tmp_path)
    models = ["cpu_identity"]
    identity(repo, "cpu_identity", "FP32", 0, "-1")
    if ORT_CUDA:  # onnxruntime (CPU) cannot load a KIND_GPU model: the server would not be ready
        models.append("gpu_identity")
        identity(repo, "gpu_identity", "FP32", 0, "-1")
        with open(f"{repo}/gpu_identity/config.pbtxt", "a") as f:
            f.write(GPU_GROUP)
    srv = start_server(repo, f"g{os.getpid()}", "--workers", "1", "--allow-client-shm", "true")
    x = np.arange(1 << 16, dtype=np.float32)
    ins = cudashm.create_shared_memory_region("cin", x.nbytes, 0)
    outs = cudashm.create_shared_memory_region("cout", x.nbytes, 0)
    try:
        cudashm.set_shared_memory_region(ins, [x])
        http = th.InferenceServerClient(srv.http_url)
        grpc = tg.InferenceServerClient(srv.grpc_url)
        http.register_cuda_shared_memory("cin", cudashm.get_raw_handle(ins), 0, x.nbytes)
        grpc.register_cuda_shared_memory("cout", cudashm.get_raw_handle(outs), 0, x.nbytes)
        assert {r["name"] for r in http.get_cuda_shared_memory_status()} == {"cin", "cout"}
        for model in models:  # via the host, and on the device
            for client, mod in ((http, th), (grpc, tg)):
                inp = mod.InferInput("INPUT0", [x.size], "FP32")
                inp.set_shared_memory("cin", x.nbytes)
                out = mod.InferRequestedOutput("OUTPUT0")
                out.set_shared_memory("cout", x.nbytes)
                client.infer(model, [inp], outputs=[out])
                got = cudashm.get_contents_as_numpy(outs, np.float32, [x.size])
                np.testing.assert_array_equal(got, x)
                cudashm.set_shared_memory_region(outs, [np.zeros_like(x)])
        http.unregister_cuda_shared_memory()
        assert http.get_cuda_shared_memory_status() == []
    finally:
        cudashm.destroy_shared_memory_region(ins)
        cudashm.destroy_shared_memory_region(outs)
        assert srv.stop() == 0
