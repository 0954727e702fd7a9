"""OpenVINO models served by the real process group, called with tritonclient over HTTP and gRPC,
against OpenVINO's own answers in this process: IR and ONNX files, Triton's README configs
(latency, throughput, reshaping), a config completed from the model, dynamic batching, a static
batch padded as Triton pads it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server, start_server

pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install 'conveyor[openvino]')")

from tests.support import openvino_models as ovm  # after the skip: it imports OpenVINO

LEVEL = "e2e"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    repo = str(tmp_path_factory.mktemp("openvino"))
    files = ovm.build(repo)
    srv = start_server(repo, f"ov{os.getpid()}", "--workers", "1", ready_timeout=180)  # 12 instances to compile
    yield srv, files
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def connect(server: Server, protocol: Any) -> Any:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def infer(client: Any, protocol: Any, model: str, name: str, x: np.ndarray, output: str) -> np.ndarray:
    inp = protocol.InferInput(name, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result: np.ndarray = client.infer(model, [inp]).as_numpy(output)
    return result


def close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


@pytest.mark.parametrize("model", ["ov_ir_auto", "ov_onnx_latency", "ov_throughput", "ov_static_padded"])
def test_single_requests_match_openvino(served: Any, protocol: Any, model: str) -> None:
    server, files = served
    client = connect(server, protocol)
    for n, seed in ((1, 1), (3, 2)):
        x = rows(n, seed)
        want = ovm.reference(files["ov_onnx_latency"], {"X": x})["Y"]  # the same graph, batch n
        close(infer(client, protocol, model, "X", x, "Y"), want)
        rtol, atol = ovm.numpy_tolerance()
        np.testing.assert_allclose(want, np.maximum(x @ ovm.W + ovm.B, 0), rtol=rtol, atol=atol)


def test_float32_precision_on_any_cpu(served: Any, protocol: Any) -> None:
    server, _ = served
    x = rows(3, 7)
    close(infer(connect(server, protocol), protocol, "ov_f32", "X", x, "Y"), np.maximum(x @ ovm.W + ovm.B, 0))


@pytest.mark.parametrize("model", ["ov_onnx_latency", "ov_ir_auto"])
def test_dynamically_batched_requests_get_their_own_rows(served: Any, protocol: Any, model: str) -> None:
    server, files = served

    def one(i: int) -> None:
        x = rows(1 + i % 3, 100 + i)
        close(infer(connect(server, protocol), protocol, model, "X", x, "Y"),
              ovm.reference(files[model], {"X": x})["Y"])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)["model_stats"][0]
    assert stats["inference_count"] >= 24 and stats["execution_count"] < stats["inference_count"]


def test_reshaping_example_takes_any_batch_and_image_size(served: Any, protocol: Any) -> None:
    server, files = served
    client = connect(server, protocol)
    for shape in ((2, 3, 5, 7), (1, 3, 9, 4)):
        x = np.random.default_rng(sum(shape)).random(shape, dtype=np.float32)
        want = ovm.reference(files["ov_reshape"], {"input": x})["output"]
        assert want.shape == (shape[0], ovm.CLASSES)
        close(infer(client, protocol, "ov_reshape", "input", x, "output"), want)


def test_config_completed_from_the_model(served: Any) -> None:
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    config = client.get_model_config("ov_ir_auto")
    assert config["backend"] == "openvino" and config["default_model_filename"] == "model.xml"
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config  # Triton's default-max-batch-size
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("X", "TYPE_FP32", [4])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("Y", "TYPE_FP32", [3])]
    metadata = client.get_model_metadata("ov_reshape")
    assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]


def test_static_batch_without_padding_fails_as_triton_does(served: Any, protocol: Any) -> None:
    server, files = served
    client = connect(server, protocol)
    with pytest.raises(InferenceServerException, match="expected requests with batch size '8', got '3'"):
        infer(client, protocol, "ov_static_unpadded", "X", rows(3, 5), "Y")
    x = rows(8, 6)
    want = ovm.reference(files["ov_static_unpadded"], {"X": x})["Y"]
    close(infer(client, protocol, "ov_static_unpadded", "X", x, "Y"), want)


def test_a_config_the_model_does_not_fit_says_why(served: Any) -> None:
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready("ov_wrong_input")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert "unexpected inference input 'x', allowed inputs are: X" in index["ov_wrong_input"]["reason"]
