"""Triton's restricted APIs (--http-restricted-api, --grpc-restricted-protocol) in the
HTTP app and the gRPC server, without the process group: every route and RPC is
in the right category, and refused with Triton's status and words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace

import falcon.testing
import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as tga
from tritonclient.utils import InferenceServerException

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.restricted import METHOD_CATEGORIES
from conveyor.ingress.grpc.server import start_server
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.restricted import CategorizedApp
from conveyor.ingress.restricted import CATEGORIES, GRPC_HEADER_PREFIX, parse_group, restrictions
from conveyor.proto import grpc_service_pb2
from tests.support.fake_grpc import FakeDataPlane
from tests.support.fake_grpc import FakeLink as GrpcFakeLink
from tests.support.fake_http import ANSWERS, EchoPlane, FakeLink

LEVEL = "unit"

# Every HTTP route the app serves, by Triton category.
HTTP_ROUTES = [
    ("GET", "/v2/health/live", "health"),
    ("GET", "/v2/health/ready", "health"),
    ("GET", "/v2/models/simple/ready", "health"),
    ("GET", "/v2", "metadata"),
    ("GET", "/v2/models/simple", "metadata"),
    ("GET", "/v2/models/simple/versions/1", "metadata"),
    ("POST", "/v2/models/simple/infer", "inference"),
    ("POST", "/v2/models/simple/generate", "inference"),
    ("POST", "/v2/models/simple/versions/1/generate_stream", "inference"),
    ("GET", "/v2/models/simple/config", "model-config"),
    ("GET", "/v2/models/stats", "statistics"),
    ("GET", "/v2/models/simple/versions/1/stats", "statistics"),
    ("POST", "/v2/repository/index", "model-repository"),
    ("POST", "/v2/repository/models/simple/load", "model-repository"),
    ("POST", "/v2/systemsharedmemory/status", "shared-memory"),
    ("GET", "/v2/systemsharedmemory/status", "shared-memory"),
    ("POST", "/v2/cudasharedmemory/region/r/register", "shared-memory"),
    ("POST", "/v2/cudasharedmemory/region/r/unregister", "shared-memory"),
    ("GET", "/v2/trace/setting", "trace"),
    ("POST", "/v2/trace/setting", "trace"),
    ("POST", "/v2/models/simple/trace/setting", "trace"),
    ("GET", "/v2/logging", "logging"),
    ("POST", "/v2/logging", "logging"),
]


def app_client(*specs: str) -> falcon.testing.TestClient:
    link = FakeLink(dict(ANSWERS, repository_index=[], repository_load=None, shm_status=[], shm_register=None,
                         shm_unregister=None, trace_settings={}, log_settings={}))
    ctx = SimpleNamespace(link=link, dataplane=EchoPlane(), drain=IngressDrain())
    rules = restrictions([parse_group(s) for s in specs])
    return falcon.testing.TestClient(build_app(ctx, restricted=rules))  # type: ignore[arg-type]


@pytest.mark.parametrize("category", CATEGORIES)
def test_http_routes_of_a_restricted_category_need_the_header(category: str) -> None:
    client = app_client(f"{category}:admin-key=s3cret")
    for method, path, route_category in HTTP_ROUTES:
        refused = client.simulate_request(method, path, headers={"admin-key": "wrong"})
        if route_category == category:
            assert refused.status_code == 403, path
            assert refused.json == {"error": "This API is restricted, expecting header 'admin-key'"}
            allowed = client.simulate_request(method, path, headers={"Admin-Key": "s3cret"})  # any header case
            assert allowed.status_code != 403, path
        else:
            assert refused.status_code != 403, path


def test_http_groups_with_different_keys() -> None:
    client = app_client("inference:infer-key=a", "model-repository,statistics:admin-key=b")
    assert client.simulate_get("/v2/models/stats", headers={"infer-key": "a"}).status_code == 403
    assert client.simulate_get("/v2/models/stats", headers={"admin-key": "b"}).status_code == 200
    assert client.simulate_get("/v2/health/ready").status_code == 200  # not restricted
    assert client.simulate_get("/v2/nope").status_code == 404  # unknown routes stay 404


def test_every_http_route_names_a_category() -> None:
    # The app refuses, when it is built, a route whose resource names no category: one would
    # escape --http-restricted-api whatever is restricted.
    app = CategorizedApp()

    class Uncategorized:
        async def on_get(self, req: object, resp: object) -> None:
            pass

    with pytest.raises(TypeError, match="'/v2/logging': Uncategorized names no API category"):
        app.add_route("/v2/logging", Uncategorized())
    Uncategorized.api = "loging"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="names no API category"):
        app.add_route("/v2/logging", Uncategorized())
    Uncategorized.api = "logging"  # type: ignore[attr-defined]
    app.add_route("/v2/logging", Uncategorized())


def test_every_grpc_method_has_a_category() -> None:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    rpcs = {f"/inference.GRPCInferenceService/{m.name}" for m in service.methods}
    assert rpcs <= set(METHOD_CATEGORIES)
    assert set(METHOD_CATEGORIES.values()) <= set(CATEGORIES)


@pytest.fixture
async def grpc_served() -> AsyncIterator[str]:
    rules = restrictions([parse_group("health,inference:infer-key=infer-value"),
                          parse_group("model-repository,statistics:admin-key=admin-value")], GRPC_HEADER_PREFIX)
    ctx = SimpleNamespace(link=GrpcFakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, restricted=rules)  # type: ignore[arg-type]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


def _echo_input() -> tga.InferInput:
    return tga.InferInput("x", [2], "FP32").set_data_from_numpy(np.array([1.0, 2.0], np.float32))


async def test_grpc_restricted_protocols_with_tritonclient_headers(grpc_served: str) -> None:
    infer_key = {"triton-grpc-protocol-infer-key": "infer-value"}
    admin_key = {"triton-grpc-protocol-admin-key": "admin-value"}
    async with tga.InferenceServerClient(grpc_served) as client:
        for call in (client.is_server_live(), client.infer("echo", [_echo_input()], headers=admin_key),
                     client.get_inference_statistics(headers=infer_key)):
            with pytest.raises(InferenceServerException) as err:
                await call
            assert err.value.status() == "StatusCode.UNAVAILABLE"
            refusal = "This protocol is restricted, expecting header 'triton-grpc-protocol-"
            assert err.value.message().startswith(refusal)
        assert await client.is_server_live(headers=infer_key)
        result = await client.infer("echo", [_echo_input()], headers=infer_key)
        assert result.as_numpy("OUT_x").tolist() == [1.0, 2.0]
        await client.get_inference_statistics(headers=admin_key)
        await client.get_model_metadata("echo")  # metadata is not restricted


async def test_grpc_restricted_stream_and_health_service(grpc_served: str) -> None:
    async with grpc.aio.insecure_channel(grpc_served) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        call = stream(iter([]))  # no message to send: the refusal cannot race a send (grpc.aio: INTERNAL)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(b"")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await check(b"", metadata=(("triton-grpc-protocol-infer-key", "infer-value"),)) is not None


async def test_grpc_trace_and_logging_are_restricted_categories() -> None:
    rules = restrictions([parse_group("trace,logging:tk=v")], GRPC_HEADER_PREFIX)
    ctx = SimpleNamespace(link=GrpcFakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, restricted=rules)  # type: ignore[arg-type]
    key = {"triton-grpc-protocol-tk": "v"}
    try:
        async with tga.InferenceServerClient(f"127.0.0.1:{port}") as client:
            for call in (client.get_log_settings(), client.update_log_settings({"log_verbose_level": 1}),
                         client.get_trace_settings(), client.update_trace_settings("echo", {"trace_rate": "1"}),
                         client.get_log_settings(headers={"triton-grpc-protocol-tk": "w"})):
                with pytest.raises(InferenceServerException) as err:
                    await call
                assert (err.value.status(), err.value.message()) == (
                    "StatusCode.UNAVAILABLE", "This protocol is restricted, expecting header 'triton-grpc-protocol-tk'")
            assert (await client.update_log_settings({"log_verbose_level": 1}, headers=key, as_json=True))[
                "settings"]["log_verbose_level"] == {"uint32_param": 1}
            await client.get_trace_settings(headers=key)
            assert await client.is_server_live()  # the other categories are not restricted
    finally:
        await server.stop(None)
