"""Triton Python models (model.py) served by the real process group, called
with tritonclient over HTTP and gRPC."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server

LEVEL = "e2e"

Client = Any  # httpclient or grpcclient InferenceServerClient


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


@pytest.fixture()
def client(server: Server, protocol: Any) -> Client:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def infer_input(protocol: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    inp = protocol.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return inp


def test_triton_add_sub_example_runs_unchanged(client: Client, protocol: Any) -> None:
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)
    result = client.infer("add_sub", [infer_input(protocol, "INPUT0", a, "FP32"),
                                      infer_input(protocol, "INPUT1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.is_model_ready("add_sub")


def test_identity_sees_its_own_request(client: Client, protocol: Any) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outputs = [protocol.InferRequestedOutput("OUTPUT0"), protocol.InferRequestedOutput("INFO")]
    result = client.infer("py_identity", [infer_input(protocol, "INPUT0", x, "FP32")], outputs=outputs,
                          request_id="req-42", parameters={"temperature": "hot", "steps": 3})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    seen = json.loads(result.as_numpy("INFO").reshape(-1)[0])
    assert seen["request_id"] == "req-42"
    assert seen["parameters"] == {"temperature": "hot", "steps": 3}
    assert seen["requested"] == ["INFO", "OUTPUT0"]
    assert seen["shape"] == [2, 3]  # its own batch dimension, unpadded
    args = seen["args"]
    assert args["model_name"] == "py_identity" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_name"].startswith("py_identity_")
    assert args["model_repository"].endswith("py_identity")


def test_output_subset(client: Client, protocol: Any) -> None:
    x = np.ones((1, 2), dtype=np.float32)
    result = client.infer("py_identity", [infer_input(protocol, "INPUT0", x, "FP32")],
                          outputs=[protocol.InferRequestedOutput("OUTPUT0")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert result.as_numpy("INFO") is None


def test_error_response_fails_only_that_request(client: Client, protocol: Any) -> None:
    good = np.array([1, 2, 3], dtype=np.int32)
    np.testing.assert_array_equal(
        client.infer("py_errors", [infer_input(protocol, "INPUT0", good, "INT32")]).as_numpy("OUTPUT0"), good * 2
    )
    bad = np.array([1, -2], dtype=np.int32)
    with pytest.raises(InferenceServerException, match="negative input is not allowed") as info:
        client.infer("py_errors", [infer_input(protocol, "INPUT0", bad, "INT32")])
    # TritonError.INVALID_ARG reaches the client as Triton renders it.
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert client.is_model_ready("py_errors")


def test_exception_in_execute_fails_the_batch_with_its_message(client: Client, protocol: Any) -> None:
    x = np.array([13], dtype=np.int32)
    with pytest.raises(InferenceServerException,
                       match=r"Failed to process the request\(s\) for model instance 'py_errors_\d+', "
                             r"message: ValueError: thirteen is unlucky"):
        client.infer("py_errors", [infer_input(protocol, "INPUT0", x, "INT32")])
    ok = np.array([4], dtype=np.int32)
    np.testing.assert_array_equal(
        client.infer("py_errors", [infer_input(protocol, "INPUT0", ok, "INT32")]).as_numpy("OUTPUT0"), ok * 2
    )


def test_bytes_tensors(client: Client, protocol: Any) -> None:
    text = np.array([b"hello", b"", b"conveyor \xc3\xa9"], dtype=np.object_)
    result = client.infer("py_bytes", [infer_input(protocol, "INPUT0", text, "BYTES")])
    assert list(result.as_numpy("OUTPUT0")) == [b"HELLO", b"", b"CONVEYOR \xc3\xa9"]


def test_auto_complete_config(client: Client, protocol: Any) -> None:
    if protocol is grpcclient:
        config = client.get_model_config("py_autocomplete", as_json=True)["config"]
    else:
        config = client.get_model_config("py_autocomplete")
    assert int(config["max_batch_size"]) == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        ("INPUT0", "TYPE_INT64", [3])
    ]
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    result = client.infer("py_autocomplete", [infer_input(protocol, "INPUT0", x, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + 1)


@pytest.mark.parametrize("model,reason", [
    ("py_import_fails", "ModuleNotFoundError: No module named 'conveyor_no_such_module'"),
    ("py_init_fails", "RuntimeError: weights are missing"),
])
def test_broken_python_models_say_why_and_others_serve(client: Client, protocol: Any, model: str,
                                                        reason: str) -> None:
    assert not client.is_model_ready(model)
    x = np.ones(1, dtype=np.float32)
    with pytest.raises(InferenceServerException, match=reason):
        client.infer(model, [infer_input(protocol, "INPUT0", x, "FP32")])
    assert client.is_server_ready() and client.is_model_ready("add_sub")


def test_concurrent_requests_get_their_own_rows(server: Server) -> None:
    errors: list[str] = []

    def run(worker: int) -> None:
        c = httpclient.InferenceServerClient(server.http_url)
        for i in range(6):
            x = np.full((1 + (worker + i) % 3, 2), worker * 100 + i, dtype=np.float32)
            out = c.infer("py_identity", [infer_input(httpclient, "INPUT0", x, "FP32")],
                          outputs=[httpclient.InferRequestedOutput("OUTPUT0")]).as_numpy("OUTPUT0")
            if not np.array_equal(out, x):
                errors.append(f"client {worker} request {i} got {out.tolist()}")

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
