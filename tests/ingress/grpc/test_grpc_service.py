"""The gRPC servicer end to end over loopback, with tritonclient.grpc (aio and
sync) as the client and a fake router link and data plane behind it.

The real router/worker path is covered by the e2e suite; this pins the gRPC
adapter itself: status codes, deadlines, stream ordering, in-band errors and
cancellation.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.grpc.aio as tga
from tritonclient.utils import InferenceServerException

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import health_pb2, health_pb2_grpc
from tests.support.fake_grpc import FakeDataPlane, FakeLink

LEVEL = "unit"


@pytest.fixture(params=["grpcio", "h2", "ngh2"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[SimpleNamespace]:
    link, dataplane = FakeLink(), FakeDataPlane()
    ctx = SimpleNamespace(link=link, dataplane=dataplane, drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, implementation=request.param)  # type: ignore[arg-type]
    client = tga.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield SimpleNamespace(url=f"127.0.0.1:{port}", link=link, dataplane=dataplane, client=client)
    finally:
        await client.close()
        await server.stop(None)


def fp32_input(values: list[float], name: str = "x", module: Any = tga) -> Any:
    return module.InferInput(name, [len(values)], "FP32").set_data_from_numpy(np.array(values, np.float32))


async def status_of(coro: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as err:
        await coro
    return err.value.status(), err.value.message()


async def test_health_and_metadata(served: SimpleNamespace) -> None:
    c = served.client
    assert await c.is_server_live()
    assert await c.is_server_ready()
    served.link.ready = False
    assert not await c.is_server_ready()
    served.link.ready = None
    assert not await c.is_server_ready()
    assert await c.is_model_ready("echo")
    assert not await c.is_model_ready("other")
    meta = await c.get_server_metadata()
    assert meta.name == "triton"
    assert "classification" in meta.extensions
    model = await c.get_model_metadata("echo", as_json=True)
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1"]}]  # int64 as JSON strings
    config = await c.get_model_config("echo", as_json=True)
    assert config["config"]["max_batch_size"] == 4
    stats = await c.get_inference_statistics()
    assert stats.model_stats[0].inference_count == 3
    assert await status_of(c.get_model_metadata("nope")) == (
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'nope' is not found",
    )


async def test_infer(served: SimpleNamespace) -> None:
    s = tga.InferInput("s", [2], "BYTES").set_data_from_numpy(np.array([b"a", b"bc"], dtype=object))
    result = await served.client.infer("echo", [fp32_input([1.5, -2.0]), s], request_id="r1", client_timeout=30)
    assert result.as_numpy("OUT_x").tolist() == [1.5, -2.0]
    assert result.as_numpy("OUT_s").tolist() == [b"a", b"bc"]
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("r1", "echo", "1")
    (call,) = served.dataplane.calls
    assert 0 < call.timeout_s <= 31  # grpc rounds the deadline it reports
    assert served.dataplane.released == 1


async def test_infer_without_deadline(served: SimpleNamespace) -> None:
    await served.client.infer("echo", [fp32_input([1.0])])
    assert served.dataplane.calls[0].timeout_s is None


async def test_infer_errors_become_grpc_statuses(served: SimpleNamespace) -> None:
    c = served.client
    assert await status_of(c.infer("fail", [fp32_input([1])], request_id="q")) == (
        "StatusCode.INVALID_ARGUMENT",
        "bad request q",
    )
    status, message = await status_of(c.infer("crash", [fp32_input([1])]))
    assert status == "StatusCode.INTERNAL"
    assert "kaboom" in message


async def test_client_deadline_cancels_the_request(served: SimpleNamespace) -> None:
    status, _ = await status_of(
        served.client.infer("echo", [fp32_input([1])], parameters={"delay_ms": 5000}, client_timeout=0.2)
    )
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    for _ in range(100):
        if served.dataplane.cancelled:
            break
        await asyncio.sleep(0.02)
    assert served.dataplane.cancelled == 1


async def test_stream_replies_in_order_with_in_band_errors(served: SimpleNamespace) -> None:
    delays = [300, 0, 200, 0, 100]

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i, delay in enumerate(delays):
            model = "fail" if i == 3 else "echo"
            yield {
                "model_name": model,
                "inputs": [fp32_input([float(i)])],
                "request_id": str(i),
                "parameters": {"delay_ms": delay},
            }

    replies = []
    async for result, error in served.client.stream_infer(requests()):
        replies.append((result, error))
        if len(replies) == len(delays):
            break
    assert [r.get_response().id if r else None for r, _ in replies] == ["0", "1", "2", None, "4"]
    assert str(replies[3][1]) == "bad request 3"
    assert [r.as_numpy("OUT_x").tolist() for r, _ in replies if r] == [[0.0], [1.0], [2.0], [4.0]]


async def test_stream_requests_run_concurrently(served: SimpleNamespace) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(8):
            yield {"model_name": "echo", "inputs": [fp32_input([i])], "parameters": {"delay_ms": 300}}

    loop = asyncio.get_running_loop()
    start = loop.time()
    count = 0
    async for _result, error in served.client.stream_infer(requests()):
        assert error is None
        count += 1
        if count == 8:
            break
    assert loop.time() - start < 8 * 0.3 / 2


async def test_cancelling_a_stream_cancels_its_requests(served: SimpleNamespace) -> None:
    sent = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": "echo", "inputs": [fp32_input([1])], "parameters": {"delay_ms": 10000}}
        sent.set()
        await asyncio.sleep(3600)

    replies = served.client.stream_infer(requests())
    reader = asyncio.ensure_future(replies.__anext__())
    await sent.wait()
    for _ in range(100):
        if served.dataplane.calls:
            break
        await asyncio.sleep(0.02)
    replies.cancel()
    with pytest.raises(BaseException):  # noqa: B017  (grpc's cancellation error)
        await reader
    for _ in range(100):
        if served.dataplane.cancelled:
            break
        await asyncio.sleep(0.02)
    assert served.dataplane.cancelled == 1


async def test_sync_client_infer_and_stream(served: SimpleNamespace) -> None:
    def run() -> None:
        client = tg.InferenceServerClient(served.url)
        try:
            result = client.infer("echo", [fp32_input([3.0], module=tg)])
            assert result.as_numpy("OUT_x").tolist() == [3.0]
            replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
            client.start_stream(callback=lambda result, error: replies.put((result, error)))
            for i, model in enumerate(["echo", "fail", "echo"]):
                client.async_stream_infer(model, [fp32_input([float(i)], module=tg)], request_id=str(i))
            got = [replies.get(timeout=10) for _ in range(3)]
            client.stop_stream()
        finally:
            client.close()
        assert got[0][0].as_numpy("OUT_x").tolist() == [0.0]
        assert got[1][0] is None
        assert "bad request 1" in str(got[1][1])
        assert got[2][0].get_response().id == "2"

    await asyncio.to_thread(run)


async def test_trace_and_log_settings_rpcs_convert_values(served: SimpleNamespace) -> None:
    # The router keeps the settings (tests/ingress/http/test_observe_e2e.py); here only the conversion.
    c = served.client
    logs = (await c.update_log_settings({"log_verbose_level": 2}, as_json=True))["settings"]
    assert logs["log_verbose_level"] == {"uint32_param": 2} and logs["log_info"] == {"bool_param": True}
    assert logs["log_file"] == {"string_param": ""}
    trace = (await c.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]}, as_json=True))["settings"]
    assert trace["trace_level"]["value"] == ["TIMESTAMPS"] and trace["trace_rate"]["value"] == ["1000"]


async def test_grpc_health_check(served: SimpleNamespace) -> None:
    async with grpc.aio.insecure_channel(served.url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert (await stub.Check(health_pb2.HealthCheckRequest())).status == serving
        check = health_pb2.HealthCheckRequest(service="inference.GRPCInferenceService")
        assert (await stub.Check(check)).status == serving
        served.link.ready = False
        assert (await stub.Check(check)).status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service="other"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(check)
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()


async def test_compressed_requests_and_non_ascii_error_messages(served: SimpleNamespace) -> None:
    c = served.client
    for algorithm in ("gzip", "deflate"):
        result = await c.infer("echo", [fp32_input([1.5, 2.0] * 64)], compression_algorithm=algorithm)
        assert result.as_numpy("OUT_x").tolist() == [1.5, 2.0] * 64
    # grpc-message is percent-encoded on the wire; the client sees the text.
    status, message = await status_of(c.get_model_metadata("mödel %20"))
    assert status == "StatusCode.NOT_FOUND" and "'mödel %20'" in message
