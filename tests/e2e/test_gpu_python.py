"""Python-backend models with GPU tensors: ``pb_utils.Tensor.from_dlpack`` of a torch CUDA tensor stays on
the device (``is_cpu()`` false, ``as_numpy()`` raises Triton's error), returns as an output (to the host
and into a client's CUDA shared memory), and passes through BLS to another model.

Skips without a CUDA GPU, cupy and a CUDA build of torch.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conveyor.deploy.example_repo import write_model

LEVEL = "e2e"

pytestmark = pytest.mark.gpu


def _torch_cuda_and_cupy() -> bool:
    try:
        import cupy
        import torch

        return bool(torch.cuda.is_available() and cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


# Doubles INPUT0 on cuda:0 and answers with the device tensor; every GPU-tensor property it relies on is
# checked inside, so a wrong one fails the request with its reason.
DOUBLE = '''
import numpy as np
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            t = torch.utils.dlpack.from_dlpack(x.to_dlpack()).to("cuda:0") * 2
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(t))
            assert not out.is_cpu(), "a CUDA tensor reports is_cpu()"
            try:
                out.as_numpy()
                raise AssertionError("as_numpy() of a GPU tensor did not raise")
            except pb_utils.TritonModelException as exc:
                assert "stored in GPU" in str(exc), str(exc)
            back = torch.utils.dlpack.from_dlpack(out.to_dlpack())
            assert back.is_cuda and back.data_ptr() == t.data_ptr(), "to_dlpack copied or left the device"
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''

# Sends a device tensor to DOUBLE through BLS and answers with what comes back.
BLS = '''
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            t = torch.utils.dlpack.from_dlpack(x.to_dlpack()).to("cuda:0")
            device_input = pb_utils.Tensor.from_dlpack("INPUT0", t)
            assert not device_input.is_cpu()
            answer = pb_utils.InferenceRequest(
                model_name="py_double", requested_output_names=["OUTPUT0"], inputs=[device_input]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
'''

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }}]
instance_group [{{ kind: KIND_GPU count: 1 gpus: [0] }}]
"""


def _model(repo: Path, name: str, source: str) -> None:
    write_model(repo, name, CONFIG.format(name=name), {"model.py": textwrap.dedent(source)})


@pytest.mark.skipif(not _torch_cuda_and_cupy(), reason="needs a CUDA GPU, cupy and CUDA torch")
def test_python_backend_gpu_tensors(tmp_path: Path) -> None:
    import tritonclient.grpc as tg
    import tritonclient.http as th

    from tests.support.group import start_server

    _model(tmp_path, "py_double", DOUBLE)
    _model(tmp_path, "py_bls_gpu", BLS)
    srv = start_server(str(tmp_path), f"gp{os.getpid()}", "--workers", "1", "--allow-client-shm", "true")
    x = np.arange(4096, dtype=np.float32)
    try:
        for client, mod in ((th.InferenceServerClient(srv.http_url), th),
                            (tg.InferenceServerClient(srv.grpc_url), tg)):
            for model in ("py_double", "py_bls_gpu"):
                inp = mod.InferInput("INPUT0", [x.size], "FP32")
                inp.set_data_from_numpy(x)
                got = client.infer(model, [inp]).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(got, x * 2, err_msg=f"{model} over {mod.__name__}")
        _device_output_into_cuda_shm(srv, x)
    finally:
        assert srv.stop() == 0


def _device_output_into_cuda_shm(srv: Any, x: np.ndarray) -> None:
    """A device output goes straight into a client's CUDA region."""
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except Exception as exc:  # needs cuda-python (cuda.bindings)
        pytest.skip(f"tritonclient's cuda_shared_memory is unavailable: {exc}")
    import tritonclient.http as th

    out = cudashm.create_shared_memory_region("pyout", x.nbytes, 0)
    try:
        client = th.InferenceServerClient(srv.http_url)
        client.register_cuda_shared_memory("pyout", cudashm.get_raw_handle(out), 0, x.nbytes)
        inp = th.InferInput("INPUT0", [x.size], "FP32")
        inp.set_data_from_numpy(x)
        req = th.InferRequestedOutput("OUTPUT0")
        req.set_shared_memory("pyout", x.nbytes)
        client.infer("py_double", [inp], outputs=[req])
        np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out, np.float32, [x.size]), x * 2)
        client.unregister_cuda_shared_memory()
    finally:
        cudashm.destroy_shared_memory_region(out)
