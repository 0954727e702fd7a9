"""A running group keeps its megabyte buffers warm (deploy/runtime/heap.py): after warm-up, a 1 MiB request
over HTTP faults no fresh pages into the HTTP ingress, whose body, chunks and response buffers
otherwise come from the kernel anew on every request (about 256 page faults per MiB each)."""

from __future__ import annotations

import os
import platform

import numpy as np
import pytest
import tritonclient.http as th

from tests.support.group import pids_of, start_server
from tests.support.python_models import write_model

LEVEL = "e2e"

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

ELEMENTS = 1 << 18  # FP32: 1 MiB

PLUS_ONE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + 1.0)]) for r in requests]
'''

CONFIG = f'''
name: "plus_one"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]
'''


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_megabyte_requests_fault_no_fresh_pages_into_the_http_ingress(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = str(tmp_path_factory.mktemp("heap"))
    write_model(repo, "plus_one", PLUS_ONE, CONFIG)
    server = start_server(repo, f"hp{os.getpid()}", "--workers", "1", "--grpc-ingress", "0", grpc=False)
    try:
        [ingress] = pids_of(server, "ingress-http")
        client = th.InferenceServerClient(server.http_url)
        x = th.InferInput("INPUT0", [ELEMENTS], "FP32")
        data = np.arange(ELEMENTS, dtype=np.float32)
        x.set_data_from_numpy(data)

        def one() -> None:
            assert np.array_equal(client.infer("plus_one", [x]).as_numpy("OUTPUT0"), data + 1.0)

        for _ in range(10):
            one()
        before = minor_faults(ingress)
        for _ in range(20):
            one()
        per_request = (minor_faults(ingress) - before) / 20
        client.close()
        assert per_request < 32, f"{per_request} page faults per 1 MiB request in the HTTP ingress"
    finally:
        assert server.stop() == 0
