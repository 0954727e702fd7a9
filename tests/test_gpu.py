"""GPU paths: an ONNX model with KIND_GPU runs on onnxruntime's CUDA provider.

Skipped unless onnxruntime has the CUDA execution provider and a GPU is present.
"""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")


def _have_cuda() -> bool:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _have_cuda(), reason="needs a CUDA GPU and onnxruntime-gpu")]


def test_kind_gpu_instance_runs_on_cuda(tmp_path: object) -> None:
    from conveyor.deploy.example_repo import identity
    from conveyor.proto.model_config import parse_text
    from conveyor.workers.backends.onnxruntime import OnnxRuntimeBackend

    repo = str(tmp_path)
    identity(repo, "gpu_identity", "FP32", 0, "-1")
    with open(f"{repo}/gpu_identity/config.pbtxt") as f:
        config = parse_text(f.read() + "\ninstance_group [{ kind: KIND_GPU count: 1 gpus: [0] }]\n")
    backend = OnnxRuntimeBackend(f"{repo}/gpu_identity/1/model.onnx", config, "cuda:0")
    assert backend.session.get_providers()[0] == "CUDAExecutionProvider"
    x = np.arange(1024, dtype=np.float32)
    out = backend.execute({"INPUT0": x}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], x)
