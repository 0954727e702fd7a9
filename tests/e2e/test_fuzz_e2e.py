"""A subset of the fuzz cases against the real process group: every malformed
request gets the protocol's error, the server stays healthy, and a well-behaved
client running alongside gets correct answers throughout."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fuzz import CLIENT_MISTAKES_500, bounded, tried
from tests.support.fuzz_grpc_requests import infer_requests
from tests.support.fuzz_http_requests import binary_requests, dumps, infer_docs
from tests.support.group import Server

LEVEL = "e2e"

ALLOWED_GRPC = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE}


class WellBehavedClient:
    """Infers on 'simple' over HTTP in a loop and checks every answer."""

    def __init__(self, server: Server) -> None:
        self._client = th.InferenceServerClient(server.http_url)
        self._stop = threading.Event()
        self.answers = 0
        self.wrong: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        while not self._stop.is_set():
            inputs = [th.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(a),
                      th.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(np.ones_like(a))]
            try:
                result = self._client.infer("simple", inputs)
                if result.as_numpy("OUTPUT0").tolist() != (a + 1).tolist():
                    self.wrong.append("wrong OUTPUT0")
            except Exception as err:
                self.wrong.append(repr(err))
            self.answers += 1

    def __enter__(self) -> WellBehavedClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(30)
        self._client.close()


@pytest.fixture(scope="module")
def bystander(server: Server) -> Iterator[WellBehavedClient]:
    with WellBehavedClient(server) as client:
        yield client
    assert client.answers > 0 and client.wrong == []


def post(server: Server, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@bounded(60)
@given(st.one_of(infer_docs().map(lambda d: (dumps(d), None)), binary_requests(), st.binary(max_size=48).map(
    lambda b: (b, None))), st.sampled_from(["simple", "simple_string", "identity_fp32", "nope"]))
def test_http_infer_fuzz_against_the_server(
    server: Server, bystander: WellBehavedClient, case: tuple[bytes, int | None], model: str
) -> None:
    tried("e2e http infer")
    body, length = case
    headers = {"Content-Type": "application/json"}
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(length)
    status, content = post(server, f"/v2/models/{model}/infer", body, headers)
    assert status in (200, 400, 404, 500, 503), content
    if status != 200:
        error = orjson.loads(content)
        assert set(error) == {"error"}
        assert status != 500 or error["error"].startswith(CLIENT_MISTAKES_500), content


@pytest.fixture(scope="module")
def grpc_channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield channel


@bounded(60)
@given(infer_requests() | st.binary(max_size=48), st.sampled_from(["ModelInfer", "ModelMetadata", "ModelConfig"]))
def test_grpc_fuzz_against_the_server(
    server: Server, bystander: WellBehavedClient, grpc_channel: grpc.Channel, buf: bytes, method: str
) -> None:
    tried("e2e grpc rpc")
    rpc = grpc_channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    try:
        rpc(buf, timeout=30)
    except grpc.RpcError as err:
        assert err.code() in ALLOWED_GRPC, (err.code(), err.details())


def test_the_server_is_healthy_after_the_fuzzing(server: Server, bystander: WellBehavedClient) -> None:
    assert th.InferenceServerClient(server.http_url).is_server_ready()
    client = tg.InferenceServerClient(server.grpc_url)
    assert client.is_server_ready()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [tg.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(a),
              tg.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(a)]
    assert client.infer("simple", inputs).as_numpy("OUTPUT0").tolist() == (2 * a).tolist()
    assert bystander.answers > 0 and bystander.wrong == []
