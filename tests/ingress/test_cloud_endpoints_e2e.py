"""SageMaker and Vertex AI endpoints driven with plain HTTP, as those platforms' health
checks and clients call them; and refused requests counted as REJECTED failures.

One group serves HTTP, gRPC, metrics, SageMaker and Vertex AI on loopback ports, in
explicit model-control mode (SageMaker's multi-model loads need it, as in Triton).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_port
from tests.support.cloud_http import A, B, call
from tests.support.group import Server, abandon, wait_ready

LEVEL = "e2e"

PREDICT = "/v1/endpoints/e/deployedModels/m:predict"
HEALTH = "/v1/endpoints/e/deployedModels/m"
SM_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
VX_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="


@dataclass
class Cloud:
    server: Server
    sagemaker: int
    vertex: int
    tmp: str


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    tmp = str(tmp_path_factory.mktemp("cloud"))
    repo = os.path.join(tmp, "repo")
    add_sub(repo, "simple", 0)
    ports = [free_port() for _ in range(5)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "SAGEMAKER_"))}
    env.update(AIP_PREDICT_ROUTE=PREDICT, AIP_HEALTH_ROUTE=HEALTH)
    group = f"cl{os.getpid()}"
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", repo, "--group", group,
        "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2]),
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--workers", "1",
        "--arena-size", str(64 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0",
        "--model-control-mode", "explicit", "--load-model", "simple",
        "--allow-sagemaker", "true", "--sagemaker-port", str(ports[3]),
        "--allow-vertex-ai", "true", "--vertex-ai-port", str(ports[4]),
        "--sagemaker-model-root", os.path.join(tmp, "opt-ml-models"),
    ], env=env)
    try:
        wait_ready(ports[0], proc, (ports[1], ports[2], ports[3], ports[4]))
    except Exception:
        abandon(proc)
        raise
    srv = Server(proc, group, ports[0], ports[1], ports[2], repo)
    yield Cloud(srv, ports[3], ports[4], tmp)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert srv.shm_segments() == []


SHAPED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            dims = pb_utils.Tensor("DIMS", np.array(x.shape, dtype=np.int64))
            params = pb_utils.Tensor("PARAMS", np.array([request.parameters().encode()], dtype=np.object_))
            out.append(pb_utils.InferenceResponse([dims, params]))
        return out
"""


SHAPED_CONFIG = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [2, -1]}],
    "output": [{"name": "DIMS", "data_type": "TYPE_INT64", "dims": [-1]},
               {"name": "PARAMS", "data_type": "TYPE_STRING", "dims": [1]}],
})


def json_request(binary_output: bool = False) -> bytes:
    doc: dict[str, object] = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [16], "data": A},
        {"name": "INPUT1", "datatype": "INT32", "shape": [16], "data": B},
    ]}
    if binary_output:
        doc["parameters"] = {"binary_data_output": True}
    return json.dumps(doc).encode()


def binary_request() -> tuple[bytes, int]:
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [16], "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [16], "parameters": {"binary_data_size": 64}},
    ], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    raw = np.array(A, dtype=np.int32).tobytes() + np.array(B, dtype=np.int32).tobytes()
    return header + raw, len(header)


def output0(body: bytes, content_type: str, mime: str) -> list[int]:
    if content_type.startswith(mime):
        n = int(content_type[len(mime):])
        doc = json.loads(body[:n])
        return np.frombuffer(body[n:n + 64], dtype=np.int32).tolist()
    doc = json.loads(body)
    return next(o["data"] for o in doc["outputs"] if o["name"] == "OUTPUT0")


EXPECTED = [a + b for a, b in zip(A, B, strict=True)]


def test_sagemaker_single_model(cloud: Cloud) -> None:
    assert call(cloud.sagemaker, "/ping")[0] == 200
    status, headers, body = call(cloud.sagemaker, "/invocations", json_request(),
                                 headers={"Content-Type": "application/json"})
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["model_name"] == "simple"
    assert output0(body, headers["content-type"], SM_MIME) == EXPECTED
    data, n = binary_request()
    status, headers, body = call(cloud.sagemaker, "/invocations", data, headers={"Content-Type": f"{SM_MIME}{n}"})
    assert status == 200, body
    assert headers["content-type"].startswith(SM_MIME)
    assert "inference-header-content-length" not in headers
    assert output0(body, headers["content-type"], SM_MIME) == EXPECTED
    # Every failure is a 400 with Triton's JSON error body.
    status, _, body = call(cloud.sagemaker, "/invocations", b"{not json")
    assert status == 400 and "error" in json.loads(body)
    assert call(cloud.sagemaker, "/nowhere")[0] == 400


def test_sagemaker_multi_model_flow(cloud: Cloud) -> None:
    base = os.path.join(cloud.tmp, "opt-ml-models", "abc123")
    add_sub(base, "model", 0)  # SageMaker unpacks a model archive to <hash>/model
    url = os.path.join(base, "model")
    assert call(cloud.sagemaker, "/models/abc123")[0] == 404
    assert call(cloud.sagemaker, "/models/abc123/invoke", json_request())[0] == 404
    load = json.dumps({"model_name": "abc123", "url": url}).encode()
    status, _, body = call(cloud.sagemaker, "/models", load, headers={"X-Amzn-SageMaker-Target-Model": "adder.tar.gz"})
    assert status == 200, body
    status, _, body = call(cloud.sagemaker, "/models", load, headers={"X-Amzn-SageMaker-Target-Model": "adder.tar.gz"})
    assert status == 409, body  # that repository is registered already
    status, _, body = call(cloud.sagemaker, "/models")
    assert json.loads(body) == {"models": [{"modelName": "abc123", "modelUrl": base}]}
    assert json.loads(call(cloud.sagemaker, "/models/abc123")[2]) == {"modelName": "abc123", "modelUrl": base}
    status, headers, body = call(cloud.sagemaker, "/models/abc123/invoke", json_request(),
                                 headers={"X-Amzn-SageMaker-Target-Model": "adder.tar.gz"})
    assert status == 200, body
    assert json.loads(body)["model_name"] == "adder.tar.gz"
    assert output0(body, headers["content-type"], SM_MIME) == EXPECTED
    assert call(cloud.sagemaker, "/models/abc123", method="DELETE")[0] == 200
    assert call(cloud.sagemaker, "/models/abc123", method="DELETE")[0] == 404
    assert json.loads(call(cloud.sagemaker, "/models")[2]) == {"models": []}
    status, _, body = call(cloud.sagemaker, "/models", json.dumps({"model_name": "x", "url": "/proc/1"}).encode())
    assert status == 400
    # Loaded again after the unload: the repository was unregistered.
    status, _, body = call(cloud.sagemaker, "/models", load)
    assert status == 200, body
    assert call(cloud.sagemaker, "/models/abc123", method="DELETE")[0] == 200


def test_vertex_ai(cloud: Cloud) -> None:
    assert call(cloud.vertex, HEALTH)[0] == 200
    status, headers, body = call(cloud.vertex, PREDICT, json_request())
    assert status == 200, body
    assert output0(body, headers["content-type"], VX_MIME) == EXPECTED
    data, n = binary_request()
    status, headers, body = call(cloud.vertex, PREDICT, data, headers={"Content-Type": f"{VX_MIME}{n}"})
    assert status == 200, body
    n_out = int(headers["inference-header-content-length"])  # answers are the HTTP endpoint's own
    assert np.frombuffer(body[n_out:n_out + 64], dtype=np.int32).tolist() == EXPECTED
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/simple/config"}
    status, _, body = call(cloud.vertex, PREDICT, b"", headers=redirect)
    assert status == 200 and json.loads(body)["name"] == "simple"
    redirect = {"X-Vertex-Ai-Triton-Redirect": "v2/models/simple/infer"}
    status, headers, body = call(cloud.vertex, PREDICT, json_request(), headers=redirect)
    assert status == 200 and output0(body, headers["content-type"], VX_MIME) == EXPECTED
    status, _, body = call(cloud.vertex, PREDICT, b"", headers={"X-Vertex-Ai-Triton-Redirect": "v2/models/nope/ready"})
    assert status == 400
    status, _, body = call(cloud.vertex, PREDICT, b"", headers={"X-Vertex-Ai-Triton-Redirect": "metrics"})
    assert status == 200 and b"nv_inference_request_success" in body
    assert call(cloud.vertex, PREDICT, headers=redirect)[0] == 405  # Vertex AI only sends POST
    assert call(cloud.vertex, "/v2/health/ready")[0] == 400  # only the AIP_* routes are served


def _failures(cloud: Cloud, model: str) -> tuple[int, float]:
    stats = httpclient.InferenceServerClient(cloud.server.http_url).get_inference_statistics(model)
    fail = int(stats["model_stats"][0]["inference_stats"]["fail"]["count"])
    _, _, text = call(cloud.server.metrics_port, "/metrics")
    key = f'nv_inference_request_failure{{model="{model}",reason="REJECTED",version="1"}} '
    line = next(line for line in text.decode().splitlines() if line.startswith(key))
    return fail, float(line.split()[-1])


def test_refused_requests_count_as_rejected(cloud: Cloud) -> None:
    before = _failures(cloud, "simple")
    http = httpclient.InferenceServerClient(cloud.server.http_url)
    wrong_shape = [httpclient.InferInput("INPUT0", [8], "INT32"), httpclient.InferInput("INPUT1", [8], "INT32")]
    for inp in wrong_shape:
        inp.set_data_from_numpy(np.zeros(8, dtype=np.int32))
    with pytest.raises(InferenceServerException):
        http.infer("simple", wrong_shape)
    grpc = grpcclient.InferenceServerClient(cloud.server.grpc_url)
    wrong_type = [grpcclient.InferInput("INPUT0", [16], "FP32"), grpcclient.InferInput("INPUT1", [16], "FP32")]
    for ginp in wrong_type:
        ginp.set_data_from_numpy(np.zeros(16, dtype=np.float32))
    with pytest.raises(InferenceServerException):
        grpc.infer("simple", wrong_type)
    status, _, _ = call(cloud.server.http_port, "/v2/models/simple/infer", b"{bad json")
    assert status == 400
    status, _, _ = call(cloud.server.http_port, "/v2/models/nope/infer", b"{bad json")  # no model to count on
    assert status == 404  # looked up first, as Triton
    # The descriptors are fire and forget: the statistics call after them sees them counted.
    after = _failures(cloud, "simple")
    assert after == (before[0] + 3, before[1] + 3)
    ok = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
    for inp in ok:
        inp.set_data_from_numpy(np.ones(16, dtype=np.int32))
    http.infer("simple", ok)
    assert _failures(cloud, "simple") == after  # a success counts nothing


def test_a_binary_mime_type_not_first_in_the_content_type_is_refused_in_tritons_words(cloud: Cloud) -> None:
    # qa/L0_sagemaker test_malformed_binary_header: Triton's GetInferenceHeaderLength wants the type first.
    data, n = binary_request()
    for port, path, mime in ((cloud.sagemaker, "/invocations", SM_MIME), (cloud.vertex, PREDICT, VX_MIME)):
        content_type = f"additional-string/{mime}{n}"
        status, _, body = call(port, path, data, headers={"Content-Type": content_type})
        assert status == 400, body
        assert json.loads(body) == {"error": f"expect MIME type for binary data starts with '{mime}', got: "
                                             f"{content_type}"}


def test_a_body_that_cannot_be_read_for_a_model_not_there_is_answered_as_the_unknown_model(cloud: Cloud) -> None:
    # Triton looks the model up before it reads the body (qa/L0_sagemaker greps this answer to b'dummy').
    unknown = "Request for unknown model: 'nope' is not found"
    http = cloud.server.http_port
    status, _, body = call(http, "/v2/models/nope/infer", json_request())
    assert json.loads(body) == {"error": unknown}
    for port, path, headers in ((http, "/v2/models/nope/infer", {}),
                                (cloud.vertex, PREDICT, {"X-Vertex-Ai-Triton-Redirect": "v2/models/nope/infer"})):
        got, _, body = call(port, path, b"dummy", headers=headers)
        assert (got, json.loads(body)) == (status, {"error": unknown})
    # A model that is there still gets the body's refusal.
    status, _, body = call(http, "/v2/models/simple/infer", b"dummy")
    assert status == 400 and json.loads(body)["error"].startswith("failed to parse the request JSON")


def test_generate_reads_a_request_as_tritons_generate_endpoint(cloud: Cloud) -> None:
    # Fixed dimensions take their share of the elements, the innermost -1 the rest (Triton's two passes).
    generate = "/v2/models/shaped/generate"
    client = httpclient.InferenceServerClient(cloud.server.http_url)
    # ``shaped``: a Python model whose input has a fixed and a variable dimension, answering its shape; loaded
    # from the request alone, so that the cloud endpoints' default model stays the repository's only one.
    client.load_model("shaped", config=SHAPED_CONFIG, files={"file:1/model.py": SHAPED_MODEL.encode()})
    try:
        status, _, body = call(cloud.server.http_port, generate, json.dumps({"X": [1, 2, 3, 4]}).encode())
        assert status == 200, body
        assert json.loads(body)["DIMS"] == [2, 2]
        status, _, body = call(cloud.server.http_port, generate, json.dumps({"X": [1, 2, 3]}).encode())
        assert status == 400
        assert json.loads(body) == {"error": "The schema can not convert input 'X' to tensor with proper shape"}
        # A key that names no input is a request parameter (qa/L0_sagemaker's REPETITION), unless not a scalar.
        doc = {"X": [1, 2], "REPETITION": 3, "STREAM": True, "parameters": {"p": "q"}}
        status, _, body = call(cloud.server.http_port, generate, json.dumps(doc).encode())
        assert status == 200, body
        assert json.loads(json.loads(body)["PARAMS"]) == {"REPETITION": 3, "STREAM": True, "p": "q"}
        status, _, body = call(cloud.server.http_port, generate, json.dumps({"X": [1, 2], "R": [3]}).encode())
        assert status == 400
        assert json.loads(body) == {"error": "parameter 'R' has invalid type. It should be either 'int', 'bool', "
                                             "or 'string'."}
    finally:
        client.unload_model("shaped")


ENSEMBLE_CONFIG = """name: "pipeline"
platform: "ensemble"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }]
ensemble_scheduling { step [{
  model_name: "adder" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" }
}] }
"""


def test_sagemaker_multi_model_loads_an_ensemble_archive_with_its_steps(cloud: Cloud) -> None:
    # qa/L0_sagemaker test_sm_6_ensemble_model: the archive holds the ensemble and its steps; the ensemble is
    # served under the target name, its steps by their own (the registered repository is a repository).
    url = os.path.join(cloud.tmp, "opt-ml-models", "ens1", "model")
    add_sub(url, "adder", 0)
    os.makedirs(os.path.join(url, "pipeline", "1"))
    with open(os.path.join(url, "pipeline", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE_CONFIG)
    load = json.dumps({"model_name": "ens1", "url": url}).encode()
    status, _, body = call(cloud.sagemaker, "/models", load, headers={"X-Amzn-SageMaker-Target-Model": "ens1"})
    assert status == 200, body
    try:
        status, headers, body = call(cloud.sagemaker, "/models/ens1/invoke", json_request(),
                                     headers={"X-Amzn-SageMaker-Target-Model": "ens1"})
        assert status == 200, body
        assert output0(body, headers["content-type"], SM_MIME) == EXPECTED
    finally:
        assert call(cloud.sagemaker, "/models/ens1", method="DELETE")[0] == 200


def test_a_multi_model_load_that_is_not_json_is_refused_in_rapidjsons_words(cloud: Cloud) -> None:
    # qa/L0_sagemaker test_chunked_at_max_chunks: Triton's parser (RapidJSON) names the error and its offset.
    for body, words in ((b"A" * 100, "Invalid value. at 0"), (b"  \n x", "Invalid value. at 4")):
        status, _, answer = call(cloud.sagemaker, "/models", body)
        assert (status, json.loads(answer)) == (400, {"error": f"failed to parse the request JSON buffer: {words}"})
