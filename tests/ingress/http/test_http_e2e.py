"""tritonclient.http against the real process group: what a Triton user does."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support.group import Server
from tests.support.metrics import metrics_text
from tests.support.models import LABELS

LEVEL = "e2e"


@pytest.fixture()
def client(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url, concurrency=4)


def simple_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
              httpclient.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def raw_post(server: Server, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.request("POST", path, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_health_and_metadata(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"] and "statistics" in meta["extensions"]
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    m = client.get_model_metadata("simple")
    assert m["name"] == "simple" and m["versions"] == ["1"]
    assert {i["name"]: i["shape"] for i in m["inputs"]} == {"INPUT0": [-1, 16], "INPUT1": [-1, 16]}
    cfg = client.get_model_config("simple")
    assert cfg["max_batch_size"] == 8 and cfg["input"][0]["dims"] == [16]
    assert cfg["input"][0]["data_type"] == "TYPE_INT32"


@pytest.mark.parametrize("binary", [True, False])
def test_add_sub(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    result = client.infer("simple", simple_inputs(a, b, binary), outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "req-7"


def test_output_subset(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((2, 16), dtype=np.int32)
    result = client.infer("simple", simple_inputs(a, a), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((2, 16), np.int32))


def test_unbatched_model(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32)
    result = client.infer("simple_nobatch", simple_inputs(a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_fp32_identity_one_mebibyte(client: httpclient.InferenceServerClient) -> None:
    x = np.random.default_rng(0).random(256 * 1024, dtype=np.float32)  # 1 MiB
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("identity_fp32", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("model,dtype", [("identity_fp16", np.float16), ("identity_bool", np.bool_)])
def test_other_datatypes(client: httpclient.InferenceServerClient, model: str, dtype: type) -> None:
    x = (np.arange(10) % 3).astype(dtype)  # type: ignore[var-annotated]
    inp = httpclient.InferInput("INPUT0", [10], np_to_triton_dtype(x.dtype))
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer(model, [inp]).as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_model(client: httpclient.InferenceServerClient, binary: bool) -> None:
    x = np.array([[f"str-{i}".encode() for i in range(16)]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT0", [1, 16], "BYTES")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = client.infer("simple_string", [inp],
                       outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]).as_numpy("OUTPUT0")
    assert [v if isinstance(v, bytes) else v.encode() for v in out.reshape(-1)] == list(x.reshape(-1))


def test_concurrent_clients_get_their_own_rows(server: Server) -> None:
    errors: list[str] = []

    def run(worker: int) -> None:
        c = httpclient.InferenceServerClient(server.http_url)
        for i in range(15):
            a = np.full((1 + (worker + i) % 3, 16), worker * 1000 + i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32)[None, :].repeat(a.shape[0], 0)
            r = c.infer("simple", simple_inputs(a, b))
            if not np.array_equal(r.as_numpy("OUTPUT0"), a + b):
                errors.append(f"client {worker} request {i} got someone else's rows")

    threads = [threading.Thread(target=run, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_statistics(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    client.infer("simple", simple_inputs(a, a))
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    assert stats["name"] == "simple" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert stats["execution_count"] >= 1 and stats["inference_count"] >= stats["execution_count"]
    assert stats["batch_stats"] and stats["last_inference"] > 0
    everything = client.get_inference_statistics()["model_stats"]
    assert "identity_fp32" in {s["name"] for s in everything}


def test_classification(client: httpclient.InferenceServerClient) -> None:
    x = np.array([[0.1, 0.9, 0.3, 0.0, 0.5, 0.2, 0.6, 0.7, 0.05, 0.8]], dtype=np.float32)
    inp = httpclient.InferInput("INPUT0", [1, 10], "FP32")
    inp.set_data_from_numpy(x)
    out = client.infer("classifier", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    top = [v.decode() for v in out.as_numpy("OUTPUT0").reshape(-1)]
    assert top == [f"0.900000:1:{LABELS[1]}", f"0.800000:9:{LABELS[9]}", f"0.700000:7:{LABELS[7]}"]


@pytest.mark.parametrize(("model", "data", "words"), [
    ("simple_string", np.array([[b"x"] * 16], dtype=object),
     "class result not available for output due to unsupported type 'BYTES'"),
    ("identity_fp16", np.ones(4, np.float16), "class result not available for output due to unsupported type 'FP16'"),
    ("identity_fp32", np.ones(1_000_001, np.float32), "classification output tensor too large"),
])
def test_classification_refused_as_triton(client: httpclient.InferenceServerClient, model: str, data: np.ndarray,
                                          words: str) -> None:
    """Triton ranks integers, FP32 and FP64 outputs of at most 1,000,000 elements (L0_parameters' class_count)."""
    inp = httpclient.InferInput("INPUT0", list(data.shape), np_to_triton_dtype(data.dtype))
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(model, [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=5)])
    assert words in refused.value.message() and refused.value.status() == "400"


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression(server: Server, algorithm: str) -> None:
    c = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    r = c.infer("simple", simple_inputs(a, a), request_compression_algorithm=algorithm,
                response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * a)


# --- bad input: a clear error in Triton's form, and the server stays healthy ---------------

def expect_error(client: httpclient.InferenceServerClient, fn: object, match: str) -> None:
    with pytest.raises(InferenceServerException, match=match):
        fn()  # type: ignore[operator]
    assert client.is_server_ready()


def test_unknown_model_and_version(client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    expect_error(client, lambda: client.infer("nope", simple_inputs(a, a)), "unknown model")
    expect_error(client, lambda: client.infer("simple", simple_inputs(a, a), model_version="9"), "version 9")
    expect_error(client, lambda: client.get_model_metadata("nope"), "unknown model")
    assert not client.is_model_ready("nope")


def test_wrong_dtype_and_shape(client: httpclient.InferenceServerClient) -> None:
    f = np.ones((1, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(f)
    inputs[1].set_data_from_numpy(f)
    expect_error(client, lambda: client.infer("simple", inputs), "data-type is 'FP32'.*expects 'INT32'")
    a = np.ones((1, 8), dtype=np.int32)
    expect_error(client, lambda: client.infer("simple", simple_inputs(a, a)), "unexpected shape")
    big = np.ones((9, 16), dtype=np.int32)
    expect_error(client, lambda: client.infer("simple", simple_inputs(big, big)), "batch-size must be <= 8")


def test_broken_models_say_why_and_others_serve(client: httpclient.InferenceServerClient) -> None:
    assert not client.is_model_ready("bad_config")
    assert not client.is_model_ready("missing_file")
    # A config Triton cannot read adds no model (its poll failure); the index says why.
    expect_error(client, lambda: client.get_model_metadata("bad_config"),
                 "Request for unknown model: 'bad_config' is not found")
    bad = [r for r in client.get_model_repository_index() if r["name"] == "bad_config"]
    assert bad[0]["state"] == "UNAVAILABLE" and "failed to parse" in bad[0]["reason"]
    expect_error(client, lambda: client.get_model_metadata("missing_file"), "does not exist")
    assert client.is_model_ready("simple")


def test_gpu_model_without_gpu_worker_says_why(client: httpclient.InferenceServerClient) -> None:
    if client.is_model_ready("gpu_only"):
        pytest.skip("a worker on this host has a GPU")
    expect_error(client, lambda: client.get_model_metadata("gpu_only"),
                 "instance group gpu_only_0 of model gpu_only has kind KIND_GPU but no GPUs are available")


def test_instance_group_count(client: httpclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(4):
        np.testing.assert_array_equal(client.infer("simple_two_instances", simple_inputs(a, a)).as_numpy("OUTPUT0"),
                                      2 * a)


def error_of(status: int, body: bytes) -> str:
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    return str(doc["error"])


def test_malformed_requests_over_raw_http(server: Server) -> None:
    path = "/v2/models/simple/infer"
    status, body = raw_post(server, path, b"{not json")
    assert status == 400 and error_of(status, body)
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
    ]}).encode()
    truncated = header + b"\0" * 100  # 128 bytes promised
    status, body = raw_post(server, path, truncated, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and error_of(status, body)
    wrong_size = json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(15))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
    ]}).encode()
    status, body = raw_post(server, path, wrong_size)
    assert status == 500 and "Shape does not match true shape" in error_of(status, body)  # Triton's INTERNAL
    status, body = raw_post(server, path, gzip.compress(b"garbage")[:5], {"Content-Encoding": "gzip"})
    assert status == 400 and error_of(status, body)
    status, body = raw_post(server, "/v2/models/nope/infer", wrong_size)
    assert status in (400, 404) and "nope" in error_of(status, body)
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.request("GET", "/v2/no/such/route")
    resp = conn.getresponse()
    assert resp.status == 404 and error_of(resp.status, resp.read())
    conn.close()


def test_oversize_request_is_refused(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    conn.putrequest("POST", "/v2/models/identity_fp32/infer")
    conn.putheader("Content-Length", str(8 << 30))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status in (400, 413) and "exceeds" in error_of(resp.status, resp.read())
    conn.close()
    assert httpclient.InferenceServerClient(server.http_url).is_server_ready()


def test_prometheus_metrics(server: Server, client: httpclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    client.infer("simple", simple_inputs(a, a))

    text = metrics_text(server)
    line = next(x for x in text.splitlines() if x.startswith('nv_inference_request_success{model="simple"'))
    assert int(line.split()[-1]) >= 1
    assert 'nv_inference_pending_request_count{model="simple",version="1"}' in text


def test_raw_binary_body_for_a_single_input_model(server: Server) -> None:
    x = np.arange(8, dtype=np.float32)
    status, body = raw_post(server, "/v2/models/identity_fp32/infer", x.tobytes(),
                            {"Inference-Header-Content-Length": "0"})
    assert status == 200
    result = httpclient.InferResult.from_response_body(body, header_length=len(body) - x.nbytes)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    status, body = raw_post(server, "/v2/models/simple/infer", b"\0" * 128, {"Inference-Header-Content-Length": "0"})
    assert status == 400 and "Raw request must only have 1 input" in error_of(status, body)


def test_model_without_config_is_completed(client: httpclient.InferenceServerClient) -> None:
    cfg = client.get_model_config("no_config")
    assert cfg["max_batch_size"] == 4 and [i["dims"] for i in cfg["input"]] == [[16], [16]]
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    np.testing.assert_array_equal(client.infer("no_config", simple_inputs(a, a)).as_numpy("OUTPUT1"), 0 * a)


def test_a_response_leaves_in_one_write(server: Server) -> None:
    """Head and body of a response arrive together (one writev), so a client wakes once for it."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                                  {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16}]})
    request = (f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(request)
            first = sock.recv(1 << 16)
            head, _, rest = first.partition(b"\r\n\r\n")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            assert head.startswith(b"HTTP/1.1 200")
            assert len(rest) == length, "the body did not come with the head"
            assert json.loads(rest)["outputs"][0]["data"] == [3] * 16
