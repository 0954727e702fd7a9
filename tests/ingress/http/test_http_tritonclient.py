"""tritonclient.http against the whole process group: the HTTP details that
test_http_e2e.py does not reach (mixed binary/JSON outputs, request ids, FP16
as JSON, readiness and config routes, the aio client)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as th
import tritonclient.http.aio as tha

from tests.support.group import Server

LEVEL = "e2e"


@pytest.fixture
def client(server: Server) -> th.InferenceServerClient:
    return th.InferenceServerClient(server.http_url)


def simple_inputs() -> tuple[list[th.InferInput], np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, np.int32)
    inputs = [
        th.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(a),
        th.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(b, binary_data=False),
    ]
    return inputs, a, b


def test_model_routes(client: th.InferenceServerClient) -> None:
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("no_such_model")
    assert client.get_model_config("simple")["max_batch_size"] == 8
    assert client.get_model_metadata("simple", "1")["versions"] == ["1"]
    assert client.get_inference_statistics("simple", "1")["model_stats"][0]["version"] == "1"


def test_mixed_outputs_and_request_id(client: th.InferenceServerClient) -> None:
    inputs, a, b = simple_inputs()
    outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=False), th.InferRequestedOutput("OUTPUT1")]
    r = client.infer("simple", inputs, outputs=outputs, request_id="req-1")
    doc = r.get_response()
    assert doc["id"] == "req-1"
    by_name = {o["name"]: o for o in doc["outputs"]}
    assert by_name["OUTPUT0"]["data"] == (a + b).reshape(-1).tolist()
    assert by_name["OUTPUT1"]["parameters"]["binary_data_size"] == 64
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)


def test_fp16_as_json(client: th.InferenceServerClient) -> None:
    h = np.array([0.1, 1.5, -2.0, 65504], np.float16)
    inp = th.InferInput("INPUT0", [4], "FP16").set_data_from_numpy(h)
    r = client.infer("identity_fp16", [inp], outputs=[th.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), h)


def test_aio_client(server: Server) -> None:
    # aiohttp sends "Accept-Encoding: gzip, deflate" by default: the response comes back gzip'd.
    inputs, a, b = simple_inputs()

    async def run() -> np.ndarray:
        aio = tha.InferenceServerClient(server.http_url)
        try:
            r = await aio.infer("simple", inputs)
            return r.as_numpy("OUTPUT0")
        finally:
            await aio.close()

    np.testing.assert_array_equal(asyncio.run(run()), a + b)
