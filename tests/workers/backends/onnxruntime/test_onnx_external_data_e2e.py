"""ONNX models with external data and onnxruntime options, served by the real
process group and called with tritonclient over HTTP and gRPC:

* ``big_dir``: Triton's layout for models over 2 GB, ``1/model.onnx/`` a directory
  holding ``model.onnx`` and its weights file; no config.pbtxt (completed from the graph);
* ``big_file``: ``1/model.onnx`` with its weights file beside it, and Triton's
  onnxruntime session and run options in its config;
* accelerator configs the server must refuse at load, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import external_data_models as ext
from tests.support.group import Server, start_server

LEVEL = "e2e"

OPTIONS = """parameters { key: "execution_mode" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "2" } }
parameters { key: "enable_mem_pattern" value: { string_value: "0" } }
parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }
optimization { graph { level: 1 } }
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("external_data"))
    ext.model_directory(repo, "big_dir")
    ext.model_file_beside_data(repo, "big_file", 'platform: "onnxruntime_onnx"\n' + ext.CONFIG + OPTIONS)
    ext.model_file_beside_data(repo, "accel_unknown", ext.CONFIG + """optimization { execution_accelerators {
        gpu_execution_accelerator [{ name: "tensorrtt" }] } }""")
    ext.model_file_beside_data(repo, "accel_openvino", ext.CONFIG + """optimization { execution_accelerators {
        cpu_execution_accelerator [{ name: "openvino" }] } }""")
    srv = start_server(repo, f"xd{os.getpid()}", "--workers", "1")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def connect(server: Server, protocol: Any) -> Any:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def infer(client: Any, protocol: Any, model: str, x: np.ndarray) -> np.ndarray:
    inp = protocol.InferInput("X", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result: np.ndarray = client.infer(model, [inp]).as_numpy("Y")
    return result


@pytest.mark.parametrize("model", ["big_dir", "big_file"])
def test_external_data_models_give_the_right_answer(server: Server, protocol: Any, model: str) -> None:
    client = connect(server, protocol)
    assert client.is_model_ready(model)
    for rows in (1, 3):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) - 5
        np.testing.assert_array_equal(infer(client, protocol, model, x), ext.expected(x))


def test_model_directory_config_is_completed_from_its_graph(server: Server) -> None:
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("big_dir")
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("X", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("Y", "TYPE_FP32", [4])]
    metadata = grpcclient.InferenceServerClient(server.grpc_url).get_model_metadata("big_dir")
    assert [(t.name, list(t.shape)) for t in metadata.inputs] == [("X", [-1, 4])]


def _refused_with(server: Server, model: str, words: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready(model)
    with pytest.raises(InferenceServerException, match=words):
        infer(client, httpclient, model, np.ones((1, 4), dtype=np.float32))
    row = {r["name"]: r for r in client.get_model_repository_index()}[model]
    assert row["state"] == "UNAVAILABLE" and words in row["reason"]
    assert client.is_model_ready("big_file")  # every other model serves


def test_unknown_accelerator_is_refused_at_load(server: Server) -> None:
    _refused_with(server, "accel_unknown", "unknown Execution Accelerator 'tensorrtt'")


def test_accelerator_this_onnxruntime_lacks_is_refused_at_load(server: Server) -> None:
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has OpenVINO")
    _refused_with(server, "accel_openvino", "no OpenVINOExecutionProvider")
