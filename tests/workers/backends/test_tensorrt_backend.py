"""TensorRT models where TensorRT or a GPU is missing: unavailable, with the reason,
while every other model serves. (The GPU path itself: tests/workers/backends/test_gpu_backends.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import write_model
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.router.repository.scan import scan
from conveyor.workers.backends import load_backend
from tests.support.group import Server

LEVEL = "e2e"

NO_TENSORRT = importlib.util.find_spec("tensorrt") is None
REASON = "TensorRT is not installed|no GPU"

CONFIG = ('platform: "tensorrt_plan" max_batch_size: 0 input [{ name: "x" data_type: TYPE_FP32 dims: [4] }] '
          'output [{ name: "y" data_type: TYPE_FP32 dims: [4] }]')


def test_repository_resolves_platform_backend_and_file(tmp_path: Path) -> None:
    for name, head in (("by_platform", 'platform: "tensorrt_plan"'), ("by_backend", 'backend: "tensorrt"')):
        write_model(tmp_path, name, CONFIG.replace('platform: "tensorrt_plan"', head), {"model.plan": b""})
    specs = scan([str(tmp_path)])
    for name in ("by_platform", "by_backend"):
        spec = specs[name]
        assert spec.error == "" and spec.backend == "tensorrt"
        assert spec.config.platform == "tensorrt_plan" and spec.config.backend == "tensorrt"
        assert spec.versions[1].endswith("/1/model.plan")


@pytest.mark.skipif(not NO_TENSORRT, reason="TensorRT is installed here")
def test_without_tensorrt_the_backend_says_why(tmp_path: Path) -> None:
    with pytest.raises(ConveyorError, match="TensorRT is not installed") as info:
        load_backend("tensorrt", str(tmp_path / "model.plan"), parse_text(CONFIG), "cuda:0")
    assert info.value.status == Status.UNAVAILABLE


@pytest.mark.skipif(not NO_TENSORRT, reason="TensorRT is installed here")
def test_plan_model_unavailable_while_others_serve(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready("trt_plan")
    with pytest.raises(InferenceServerException, match=REASON):
        client.get_model_metadata("trt_plan")
    assert client.is_server_ready() and client.is_model_ready("simple")
