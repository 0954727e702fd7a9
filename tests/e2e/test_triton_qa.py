"""What Triton's own QA tests (qa/L0_http/http_test.py) check, against a running group,
and Triton's exact error wording, HTTP and gRPC, as a table.

Triton's test file is not vendored: these tests reproduce its behaviours with raw
HTTP and tritonclient. docs/COMPATIBILITY.md says how to run Triton's files too.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub, identity, write_model
from tests.support.group import Server, start_server
from tests.support.sequence_models import controls

LEVEL = "e2e"


@pytest.fixture(scope="module")
def qa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("qa_models"))
    identity(repo, "zero_1_float32", "FP32", 8, "-1")  # Triton's onnx_zero_1_float32
    identity(repo, "zero_1_float16", "FP16", 8, "-1,-1")  # two variable dimensions
    identity(repo, "zero_1_object", "BYTES", 8, "-1")
    identity(repo, "zero_1_object_1_element", "BYTES", 8, "1")
    identity(repo, "identity_int64", "INT64", 8, "-1")
    identity(repo, "nobatch_float32", "FP32", 0, "-1")
    add_sub(repo, "simple", 8)  # two inputs
    controls(repo, "seq", "TYPE_UINT64")  # sequence batching, an integer CORRID
    _labelled_ensemble(repo)
    srv = start_server(repo, f"qa{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
                       "--allow-client-shm", "true",
                       "--load-model", "*")
    yield srv
    assert srv.stop() == 0


LABELS = ["CAT", "DOG", "SPORTS CAR", "TRUCK"]


def _labelled_ensemble(repo: str) -> None:
    """An ensemble whose output has labels that the model making it does not have."""
    write_model(repo, "classify_ens", """name: "classify_ens"
platform: "ensemble"
max_batch_size: 8
input [{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] label_filename: "labels.txt" }]
ensemble_scheduling { step [{ model_name: "zero_1_float32" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } }] }
""", model_files={"labels.txt": "\n".join(LABELS) + "\n"})


def _infer_url(srv: Server, model: str) -> str:
    return f"http://{srv.http_url}/v2/models/{model}/infer"


def _raw(srv: Server, model: str, body: bytes, **headers: str) -> requests.Response:
    return requests.post(_infer_url(srv, model), data=body, headers={"Inference-Header-Content-Length": "0", **headers},
                         timeout=30)


def _binary_output(r: requests.Response) -> bytes:
    r.raise_for_status()
    return r.content[int(r.headers["Inference-Header-Content-Length"]):]


# --- raw binary requests: the shape from the body's size ----------------------------------------


@pytest.mark.parametrize("count", [8, 32])
def test_raw_body_gets_its_variable_dimension_from_its_size(qa: Server, count: int) -> None:
    data = np.arange(count, dtype=np.float32).tobytes()
    r = _raw(qa, "zero_1_float32", data)
    assert _binary_output(r) == data
    header = json.loads(r.content[: int(r.headers["Inference-Header-Content-Length"])])
    assert header["outputs"][0]["shape"] == [1, count]
    # Without a batch dimension too.
    assert _binary_output(_raw(qa, "nobatch_float32", data)) == data


def test_raw_body_chunked(qa: Server) -> None:
    data = np.arange(8, dtype=np.float32).tobytes()
    # Chunked by the client library (no Content-Length) ...
    r = requests.post(_infer_url(qa, "zero_1_float32"), data=iter([data[:12], data[12:]]),
                      headers={"Inference-Header-Content-Length": "0"}, timeout=30)
    assert _binary_output(r) == data
    # ... and by hand with a Content-Length beside it, as Triton's QA test sends it: the chunks win.
    chunked = f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n"
    r = _raw(qa, "zero_1_float32", chunked, **{"Transfer-Encoding": "chunked"})
    assert _binary_output(r) == data
    assert r.headers.get("connection") == "close"  # both framings: this connection ends


def test_raw_body_for_a_bytes_input_of_shape_1(qa: Server) -> None:
    r = _raw(qa, "zero_1_object_1_element", b"427")
    assert _binary_output(r) == (3).to_bytes(4, "little") + b"427"


@pytest.mark.parametrize(("model", "message"), [
    ("zero_1_object", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
    ("zero_1_float16", "The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
                       "variable-sized dimension"),
    ("simple", "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'simple' model "
               "configuration"),
])
def test_raw_body_refused_in_tritons_words(qa: Server, model: str, message: str) -> None:
    r = _raw(qa, model, np.ones(4, np.float16).tobytes())
    # A raw body has no JSON header, so no request id: Triton's <id_unknown>.
    assert (r.status_code, r.json()) == (400, {"error": "[request id: <id_unknown>] " + message})


# --- JSON requests ---------------------------------------------------------------------------


def test_a_repeated_output_is_refused(qa: Server) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 8], "data": [list(range(8))]}],
           "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]}
    r = requests.post(_infer_url(qa, "zero_1_float32"), json=doc, timeout=30)  # type: ignore[arg-type]
    assert (r.status_code, r.json()) == (
        400, {"error": "[request id: <id_unknown>] output 'OUTPUT0' already exists in request"})
    client = tg.InferenceServerClient(qa.grpc_url)
    x = tg.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    outputs = [tg.InferRequestedOutput("OUTPUT0"), tg.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as err:
        client.infer("zero_1_float32", [x], outputs=outputs)
    assert (err.value.status(), err.value.message()) == (
        "StatusCode.INVALID_ARGUMENT", "[request id: <id_unknown>] output 'OUTPUT0' already exists in request")


def _nested(depth: int, value: Any) -> Any:
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("datatype", "value", "model"), [("BYTES", "hello", "zero_1_object"),
                                                          ("INT64", 123, "identity_int64")])
def test_json_nesting_limit(qa: Server, datatype: str, value: Any, model: str) -> None:
    def post(depth: int) -> requests.Response:
        doc = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 1], "data": _nested(depth, value)}]}
        return requests.post(_infer_url(qa, model), json=doc, timeout=30)

    assert post(50).status_code == 200
    assert post(99).status_code == 200
    for depth in (100, 120):
        r = post(depth)
        assert r.status_code == 400
        assert "JSON nesting depth exceeds maximum allowed limit (100)" in r.json()["error"]


def test_repository_index_with_a_deeply_nested_member(qa: Server) -> None:
    depth = 250_000
    body = '{"ready":' + "[" * depth + "true" + "]" * depth + "}"
    r = requests.post(f"http://{qa.http_url}/v2/repository/index", data=body, timeout=60)
    assert (r.status_code, r.json()) == (400, {"error": "Invalid value for 'ready': expected a boolean"})


def test_header_length_out_of_range(qa: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", qa.http_port, timeout=30)
    conn.request("POST", "/v2/models/zero_1_float32/infer", body=b'{"inputs":[]}',
                 headers={"Inference-Header-Content-Length": "99999999999"})
    r = conn.getresponse()
    assert r.status == 400
    assert json.loads(r.read())["error"] == (
        "Unable to parse Inference-Header-Content-Length, value is out of range [ -2147483648, 2147483647 ], "
        "got: 99999999999")
    conn.close()


# --- Triton's wording, HTTP and gRPC -----------------------------------------------------------

FP32_8 = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 8], "data": list(range(8))}
_NOT_NUMERIC = ("failed to get model version from specified version string 'one' (details: stol), version "
                "should be an integral value > 0")

# (id, model, version, the request's inputs and outputs, HTTP status, gRPC code, exact message). "{P}"
# is Triton's "[request id: <id>] ", which the messages of its core's request checks start with.
_INT32_16 = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
INFER_ERRORS: list[tuple[str, str, str, dict[str, Any], int, str, str]] = [
    ("version not a number", "zero_1_float32", "one", {"inputs": [FP32_8]}, 400, "INVALID_ARGUMENT", _NOT_NUMERIC),
    ("version missing", "zero_1_float32", "7", {"inputs": [FP32_8]}, 404, "NOT_FOUND",
     "Request for unknown model: 'zero_1_float32' version 7 is not found"),
    ("unknown model", "no_such_model", "", {"inputs": [FP32_8]}, 404, "NOT_FOUND",
     "Request for unknown model: 'no_such_model' is not found"),
    ("unknown input", "zero_1_float32", "", {"inputs": [{**FP32_8, "name": "X"}]}, 400, "INVALID_ARGUMENT",
     "unexpected inference input 'X' for model 'zero_1_float32'"),
    ("input twice", "zero_1_float32", "", {"inputs": [FP32_8, FP32_8]}, 400, "INVALID_ARGUMENT",
     "{P}input 'INPUT0' already exists in request"),
    ("unknown output", "zero_1_float32", "", {"inputs": [FP32_8], "outputs": [{"name": "Y"}]}, 400,
     "INVALID_ARGUMENT", "unexpected inference output 'Y' for model 'zero_1_float32'"),
    ("datatype", "zero_1_float32", "", {"inputs": [{**FP32_8, "datatype": "INT32"}]}, 400, "INVALID_ARGUMENT",
     "{P}inference input 'INPUT0' data-type is 'INT32', but model 'zero_1_float32' expects 'FP32'"),
    ("batch too large", "zero_1_float32", "",
     {"inputs": [{**FP32_8, "shape": [9, 1], "data": list(range(9))}]}, 400, "INVALID_ARGUMENT",
     "{P}inference request batch-size must be <= 8 for 'zero_1_float32'"),
    ("batch sizes differ", "simple", "",
     {"inputs": [_INT32_16, {**_INT32_16, "name": "INPUT1", "shape": [2, 16], "data": list(range(32))}]}, 400,
     "INVALID_ARGUMENT", "{P}input 'INPUT0' batch size does not match other inputs for 'simple'"),
    ("shape", "simple", "",
     {"inputs": [_INT32_16, {**_INT32_16, "name": "INPUT1", "shape": [1, 4], "data": [1, 2, 3, 4]}]}, 400,
     "INVALID_ARGUMENT", "{P}unexpected shape for input 'INPUT1' for model 'simple'. Expected [-1,16], "
     "got [1,4]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
     "prepended to each input shape. If you want to specify the full shape including the batch dim in your input "
     "dims config, try setting max_batch_size to zero. See the model configuration docs for more info on "
     "max_batch_size."),
    ("shape, no batching", "nobatch_float32", "",
     {"inputs": [{**FP32_8, "shape": [1, 8]}]}, 400, "INVALID_ARGUMENT",
     "{P}unexpected shape for input 'INPUT0' for model 'nobatch_float32'. Expected [-1], got [1,8]. "),
    ("missing input", "simple", "", {"inputs": [_INT32_16]}, 400,
     "INVALID_ARGUMENT", "{P}expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but "
     "missing required input(s) ['INPUT1']. Please provide all required input(s)."),
    # Triton writes an empty missing list as "]" (it drops the last character of "[" + names + ","),
    # and walks the inputs in its hash map's order, the reverse of the request's (as tritonserver 2.51).
    ("too many inputs", "simple", "",
     {"inputs": [_INT32_16, {**_INT32_16, "name": "INPUT1"}, {**_INT32_16, "name": "X"}]}, 400,
     "INVALID_ARGUMENT", "{P}expected 2 inputs but got 3 inputs for model 'simple'. Got input(s) "
     "['X','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all required input(s)."),
]


def test_json_data_that_does_not_fill_its_shape(qa: Server) -> None:
    # Triton's words and status (500, INTERNAL; 400 with --client-mistakes-as-400).
    for data in (list(range(9)), list(range(7))):
        r = requests.post(_infer_url(qa, "zero_1_float32"), json={"inputs": [{**FP32_8, "data": data}]},  # type: ignore[dict-item]
                          timeout=30)
        assert (r.status_code, r.json()) == (
            500, {"error": "Unable to parse 'data': Shape does not match true shape of 'data' field"})


def _grpc_inputs(doc: dict[str, Any]) -> tuple[list[tg.InferInput], list[tg.InferRequestedOutput] | None]:
    inputs = []
    for t in doc["inputs"]:
        x = tg.InferInput(t["name"], t["shape"], t["datatype"])
        dtype = {"FP32": np.float32, "FP16": np.float16, "INT32": np.int32}[t["datatype"]]
        x.set_data_from_numpy(np.array(t["data"], dtype=dtype).reshape(t["shape"]))
        inputs.append(x)
    outputs = [tg.InferRequestedOutput(o["name"]) for o in doc["outputs"]] if "outputs" in doc else None
    return inputs, outputs


@pytest.mark.parametrize("request_id", ["", "req-7"], ids=["no id", "with id"])
@pytest.mark.parametrize(("model", "version", "doc", "status", "code", "message"),
                         [case[1:] for case in INFER_ERRORS], ids=[case[0] for case in INFER_ERRORS])
def test_infer_errors_in_tritons_words(qa: Server, model: str, version: str, doc: dict[str, Any], status: int,
                                       code: str, message: str, request_id: str) -> None:
    message = message.replace("{P}", f"[request id: {request_id or '<id_unknown>'}] ")
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    r = requests.post(f"http://{qa.http_url}{path}", json={**doc, "id": request_id} if request_id else doc,
                      timeout=30)
    assert (r.status_code, r.json()) == (status, {"error": message})
    inputs, outputs = _grpc_inputs(doc)
    with pytest.raises(InferenceServerException) as err:
        tg.InferenceServerClient(qa.grpc_url).infer(model, inputs, model_version=version, outputs=outputs,
                                                    request_id=request_id)
    assert (err.value.status(), err.value.message()) == (f"StatusCode.{code}", message)


def test_version_string_on_every_model_endpoint(qa: Server) -> None:
    for suffix in ("", "/config", "/stats", "/ready"):
        r = requests.get(f"http://{qa.http_url}/v2/models/zero_1_float32/versions/one{suffix}", timeout=30)
        assert r.status_code == 400, suffix
        if suffix != "/ready":  # Triton answers readiness with an empty body
            assert r.json() == {"error": _NOT_NUMERIC}, suffix
    with pytest.raises(InferenceServerException, match="failed to get model version from specified version string"):
        tg.InferenceServerClient(qa.grpc_url).get_model_metadata("zero_1_float32", "one")


@pytest.mark.parametrize(("model", "config", "files", "message"), [
    ("zero_1_float32", "{not json", {}, "failed to load 'zero_1_float32', failed to poll from model repository"),
    ("no_such_model", "", {}, "failed to load 'no_such_model', failed to poll from model repository"),
    ("zero_1_float32", "{}", {"file:" + "A" * 256: b"a"},
     "failed to load 'zero_1_float32', failed to poll from model repository"),
])
def test_load_errors_in_tritons_words(qa: Server, model: str, config: str, files: dict[str, bytes],
                                      message: str) -> None:
    # Triton answers these with 500 (its poll failure is INTERNAL), and so does Conveyor by default.
    http = th.InferenceServerClient(qa.http_url)
    with pytest.raises(InferenceServerException) as err:
        http.load_model(model, config=config or None, files=files or None)
    assert (err.value.status(), err.value.message()) == ("500", message)
    with pytest.raises(InferenceServerException) as err:
        tg.InferenceServerClient(qa.grpc_url).load_model(model, config=config or None, files=files or None)
    assert (err.value.status(), err.value.message()) == ("StatusCode.INTERNAL", message)
    assert http.is_server_ready()


@pytest.mark.parametrize(("model", "message"), [
    ("..", "invalid model name '..', model name must not contain path traversal characters"),
    ("a/../b", "invalid model name 'a/../b', model name must not contain path traversal characters"),
    (" \t", "Model name cannot be empty. Please enter a valid name to deploy."),
])
def test_load_refuses_names_that_are_not_model_names(qa: Server, model: str, message: str) -> None:
    # gRPC: over HTTP such names do not reach the load route (Triton's own test uses gRPC too).
    with pytest.raises(InferenceServerException) as err:
        tg.InferenceServerClient(qa.grpc_url).load_model(model)
    assert (err.value.status(), err.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


# --- classification: the labels of the model that answers --------------------------------------


@pytest.mark.parametrize("protocol", [th, tg])
def test_ensemble_output_classified_with_the_ensembles_labels(qa: Server, protocol: Any) -> None:
    client = protocol.InferenceServerClient(qa.http_url if protocol is th else qa.grpc_url)
    x = protocol.InferInput("IN", [1, 4], "FP32")
    x.set_data_from_numpy(np.array([[0.5, 0.25, 9.8, 1.0]], np.float32))
    result = client.infer("classify_ens", [x], outputs=[protocol.InferRequestedOutput("OUT", class_count=2)])
    top = [s.decode() for s in result.as_numpy("OUT").reshape(-1)]
    assert top == ["9.800000:2:SPORTS CAR", "1.000000:3:TRUCK"]
    # The composing model has no labels of its own: asked directly, it answers without them.
    x2 = protocol.InferInput("INPUT0", [1, 4], "FP32")
    x2.set_data_from_numpy(np.array([[0.5, 0.25, 9.8, 1.0]], np.float32))
    plain = client.infer("zero_1_float32", [x2], outputs=[protocol.InferRequestedOutput("OUTPUT0", class_count=1)])
    assert [s.decode() for s in plain.as_numpy("OUTPUT0").reshape(-1)] == ["9.800000:2"]


# --- shared memory and sequences: Triton's words, HTTP and gRPC ----------------------------------

SHM_BYTES = 64  # simple's two INT32 [1, 16] inputs and outputs


@pytest.fixture
def segment() -> Iterator[str]:
    import tritonclient.utils.shared_memory as shm

    key = f"/cv_qa_{os.getpid()}"
    handle = shm.create_shared_memory_region("qa", key, SHM_BYTES)
    yield key
    shm.destroy_shared_memory_region(handle)


def _shm_call(client: Any, op: str, *args: Any) -> tuple[str, str] | None:
    """``op`` on the client; None if it worked, else the error's (status, message)."""
    try:
        getattr(client, op)(*args)
    except InferenceServerException as err:
        return str(err.status()), str(err.message())
    return None


RESERVED = "triton_python_backend_shm_region_"


def _registration_errors(key: str) -> list[tuple[str, tuple[Any, ...], int, str, str]]:
    # (client call, its arguments, HTTP status, gRPC code, exact message), after "r" was registered
    return [
        ("register_system_shared_memory", ("r", key, SHM_BYTES), 400, "ALREADY_EXISTS",
         "shared memory region 'r' already in manager"),
        ("register_system_shared_memory", ("x", "/cv_qa_no_such_segment", SHM_BYTES), 500, "INTERNAL",
         "Unable to open shared memory region: '/cv_qa_no_such_segment'"),
        ("register_system_shared_memory", ("y", key, SHM_BYTES + 1), 400, "INVALID_ARGUMENT",
         "failed to register shared memory region 'y': invalid args"),
        ("register_system_shared_memory", ("y", key, 1, SHM_BYTES), 400, "INVALID_ARGUMENT",
         "failed to register shared memory region 'y': invalid args"),
        ("register_system_shared_memory", ("y", "///", 8), 400, "INVALID_ARGUMENT",
         "cannot register shared memory region 'y' - invalid shm key '///'"),
        ("register_system_shared_memory", ("y", f"/{RESERVED}a", 8), 400, "INVALID_ARGUMENT",
         f"cannot register shared memory region 'y' with key '/{RESERVED}a' as the key contains the reserved "
         f"prefix '{RESERVED}'"),
        ("get_system_shared_memory_status", ("nope",), 404, "NOT_FOUND",
         "Unable to find system shared memory region: 'nope'"),
        ("get_cuda_shared_memory_status", ("r",), 404, "NOT_FOUND",
         "The region named 'r' is registered as system shared memory, not CUDA shared memory"),
    ]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_registration_errors_in_tritons_words(qa: Server, segment: str, protocol: str) -> None:
    client = th.InferenceServerClient(qa.http_url) if protocol == "http" else tg.InferenceServerClient(qa.grpc_url)
    client.register_system_shared_memory("r", segment, SHM_BYTES)
    try:
        for op, args, status, code, message in _registration_errors(segment):
            expected = (str(status), message) if protocol == "http" else (f"StatusCode.{code}", message)
            assert _shm_call(client, op, *args) == expected, (op, args)
        assert _shm_call(client, "unregister_system_shared_memory", "nope") is None  # as Triton: no error
    finally:
        client.unregister_system_shared_memory()


def _shm_infer_doc(region: str, offset: int, byte_size: int) -> dict[str, Any]:
    out = {"shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": byte_size}
    return {"inputs": [{"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                       for name in ("INPUT0", "INPUT1")],
            "outputs": [{"name": "OUTPUT0", "parameters": out}]}


@pytest.mark.parametrize(("region", "offset", "byte_size", "status", "code", "message"), [
    ("nope", 0, SHM_BYTES, 404, "NOT_FOUND", "Unable to find shared memory region: 'nope'"),
    ("r", SHM_BYTES, SHM_BYTES, 400, "INVALID_ARGUMENT", "Invalid offset for shared memory region: 'r'"),
    ("r", 1, SHM_BYTES, 400, "INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'r'"),
    ("r", 32, (1 << 64) - 32, 400, "", "Integer overflow detected: byte_size (18446744073709551584) + offset (32) "
     "exceeds maximum value (18446744073709551615) for region 'r'"),
], ids=["unknown region", "offset", "offset + byte size", "overflow"])
def test_shared_memory_infer_errors_in_tritons_words(qa: Server, segment: str, region: str, offset: int,
                                                     byte_size: int, status: int, code: str, message: str) -> None:
    http = th.InferenceServerClient(qa.http_url)
    http.register_system_shared_memory("r", segment, SHM_BYTES)
    try:
        r = requests.post(_infer_url(qa, "simple"), json=_shm_infer_doc(region, offset, byte_size), timeout=30)
        assert (r.status_code, r.json()) == (status, {"error": message})
        if not code:  # gRPC's int64 parameter cannot carry that byte size
            return
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            x = tg.InferInput(name, [1, 16], "INT32")
            x.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
            inputs.append(x)
        out = tg.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(region, byte_size, offset=offset)
        with pytest.raises(InferenceServerException) as err:
            tg.InferenceServerClient(qa.grpc_url).infer("simple", inputs, outputs=[out])
        assert (err.value.status(), err.value.message()) == (f"StatusCode.{code}", message)
    finally:
        http.unregister_system_shared_memory()


_SEQ_START = ("inference request for sequence 5 to model 'seq' must specify the START flag on the first request "
              "of the sequence")


@pytest.mark.parametrize(("sequence", "rows", "message"), [
    ({}, 1, "inference request to model 'seq' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 5}, 1, _SEQ_START),
    ({"sequence_id": "abc", "sequence_start": True}, 1,
     "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', but model 'seq' "
     "expects 'UINT64'"),
    ({"sequence_id": 6, "sequence_start": True}, 2,
     "inference request to model 'seq' must specify batch-size 1 due to requirements of sequence batcher"),
], ids=["no sequence id", "no START", "string id", "batch of 2"])
@pytest.mark.parametrize("protocol", [th, tg])
def test_sequence_errors_in_tritons_words(qa: Server, protocol: Any, sequence: dict[str, Any], rows: int,
                                          message: str) -> None:
    client = protocol.InferenceServerClient(qa.http_url if protocol is th else qa.grpc_url)
    x = protocol.InferInput("INPUT", [rows, 1], "INT32")
    x.set_data_from_numpy(np.ones((rows, 1), np.int32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("seq", [x], **sequence)
    status = "400" if protocol is th else "StatusCode.INVALID_ARGUMENT"
    assert (err.value.status(), err.value.message()) == (status, message)
