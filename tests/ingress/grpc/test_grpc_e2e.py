"""tritonclient.grpc (sync, aio and streaming) against the real process group,
through each gRPC server (``--grpc-server``): the group's own ingress (ngh2, the
default) and extra ingresses joined to the same group (grpcio; h2)."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Iterator
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.options import AUTO_GRPC_SERVER
from tests.support.extra_ingress import extra_grpc_ingress
from tests.support.group import Server

LEVEL = "e2e"


@pytest.fixture(scope="module", params=["grpcio", "h2", "ngh2"])
def grpc_url(request: pytest.FixtureRequest, server: Server) -> Iterator[str]:
    if request.param == AUTO_GRPC_SERVER:  # the group's own ingress (--grpc-server auto)
        yield server.grpc_url
        return
    with extra_grpc_ingress(server, "--grpc-server", request.param) as url:
        yield url


@pytest.fixture()
def client(grpc_url: str) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(grpc_url)


def simple_inputs(mod: object, a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [mod.InferInput("INPUT0", list(a.shape), "INT32"), mod.InferInput("INPUT1", list(b.shape), "INT32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_health_metadata_config_stats(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert "statistics" in client.get_server_metadata().extensions
    assert client.is_model_ready("simple") and not client.is_model_ready("bad_config")
    meta = client.get_model_metadata("simple", as_json=True)
    assert meta["versions"] == ["1"] and meta["inputs"][0]["shape"] == ["-1", "16"]
    cfg = client.get_model_config("simple", as_json=True)["config"]
    assert cfg["max_batch_size"] == 8 and cfg["input"][0]["data_type"] == "TYPE_INT32"
    a = np.ones((1, 16), dtype=np.int32)
    client.infer("simple", simple_inputs(grpcclient, a, a))
    stats = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 1


def test_infer_sync(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 5, dtype=np.int32)
    r = client.infer("simple", simple_inputs(grpcclient, a, b), request_id="g1")
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r.get_response().id == "g1"


def test_bytes_and_large_fp32(client: grpcclient.InferenceServerClient) -> None:
    s = np.array([[f"s{i}".encode() for i in range(16)]], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
    inp.set_data_from_numpy(s)
    assert list(client.infer("simple_string", [inp]).as_numpy("OUTPUT0").reshape(-1)) == list(s.reshape(-1))
    x = np.random.default_rng(1).random(256 * 1024, dtype=np.float32)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)


def test_errors_have_grpc_status(client: grpcclient.InferenceServerClient) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("nope", simple_inputs(grpcclient, a, a))
    assert exc.value.status() == "StatusCode.NOT_FOUND"
    f = np.ones((1, 16), dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(f)
    inputs[1].set_data_from_numpy(f)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "expects 'INT32'" in exc.value.message()
    assert client.is_server_ready()


def test_stream_stays_open_and_reports_errors_in_band(client: grpcclient.InferenceServerClient) -> None:
    replies: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    try:
        for i in range(10):
            a = np.full((1, 16), i, dtype=np.int32)
            model = "nope" if i == 5 else "simple"
            client.async_stream_infer(model, simple_inputs(grpcclient, a, a), request_id=str(i))
        got = [replies.get(timeout=20) for _ in range(10)]
    finally:
        client.stop_stream()
    errors = [e for _, e in got if e is not None]
    assert len(errors) == 1 and "nope" in str(errors[0])
    for result, error in got:
        if error is None:
            i = int(result.get_response().id)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2 * i, np.int32))  # type: ignore[attr-defined]


def test_async_infer_callbacks(client: grpcclient.InferenceServerClient) -> None:
    done: queue.Queue[tuple[int, object, object]] = queue.Queue()
    for i in range(20):
        a = np.full((1, 16), i, dtype=np.int32)
        client.async_infer("simple", simple_inputs(grpcclient, a, a),
                           partial(lambda k, result, error: done.put((k, result, error)), i))
    for _ in range(20):
        k, r, e = done.get(timeout=20)
        assert e is None
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full((1, 16), 2 * k, np.int32))  # type: ignore[attr-defined]


def test_aio_client_concurrent(grpc_url: str) -> None:
    async def main() -> None:
        c = aioclient.InferenceServerClient(grpc_url)
        try:
            assert await c.is_server_ready()

            async def one(i: int) -> None:
                a = np.full((1 + i % 4, 16), i, dtype=np.int32)
                r = await c.infer("simple", simple_inputs(aioclient, a, a))
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), 2 * a)

            await asyncio.gather(*(one(i) for i in range(40)))
        finally:
            await c.close()

    asyncio.run(main())


def test_standard_health_service(grpc_url: str) -> None:
    from conveyor.proto import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(grpc_url) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
