"""The falcon app over a fake router link and data plane: routes, status codes,
the one error shape, body limits and compression, without sockets."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from types import SimpleNamespace
from typing import Any

import falcon.testing
import numpy as np
import orjson
import pytest
import tritonclient.http as th

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.body import BodyLimit
from conveyor.ingress.server_metadata import server_metadata
from conveyor.proto.errors import ConveyorError, Status, not_found, unavailable
from tests.support.fake_http import ANSWERS, EchoPlane, FakeLink

LEVEL = "unit"

Client = th.InferenceServerClient


@pytest.fixture
def link() -> FakeLink:
    return FakeLink(dict(ANSWERS))


@pytest.fixture
def plane() -> EchoPlane:
    return EchoPlane()


@pytest.fixture
def client(link: FakeLink, plane: EchoPlane) -> falcon.testing.TestClient:
    ctx = SimpleNamespace(link=link, dataplane=plane, drain=IngressDrain())
    return falcon.testing.TestClient(build_app(ctx, max_body_bytes=4096))  # type: ignore[arg-type]


def test_health(client: falcon.testing.TestClient, link: FakeLink) -> None:
    assert client.simulate_get("/v2/health/live").status_code == 200
    assert client.simulate_get("/v2/health/ready").status_code == 200
    link.answers["server_ready"] = False
    assert client.simulate_get("/v2/health/ready").status_code == 400
    link.answers["server_ready"] = unavailable("router gone")
    r = client.simulate_get("/v2/health/ready")
    assert (r.status_code, r.json) == (503, {"error": "router gone"})
    assert r.headers["Retry-After"] == "1"  # a momentary refusal: clients that honour it back off


def test_server_metadata(client: falcon.testing.TestClient) -> None:
    r = client.simulate_get("/v2")
    assert r.status_code == 200 and r.json == server_metadata()


@pytest.mark.parametrize(
    ("path", "op", "args"),
    [
        ("/v2/models/simple", "model_metadata", {"model": "simple", "version": ""}),
        ("/v2/models/simple/versions/2", "model_metadata", {"model": "simple", "version": "2"}),
        ("/v2/models/simple/config", "model_config", {"model": "simple", "version": ""}),
        ("/v2/models/simple/versions/3/config", "model_config", {"model": "simple", "version": "3"}),
        ("/v2/models/stats", "model_stats", {"model": "", "version": ""}),
        ("/v2/models/simple/stats", "model_stats", {"model": "simple", "version": ""}),
        ("/v2/models/simple/versions/1/stats", "model_stats", {"model": "simple", "version": "1"}),
    ],
)
def test_control_routes(
    client: falcon.testing.TestClient, link: FakeLink, path: str, op: str, args: dict[str, str]
) -> None:
    r = client.simulate_get(path)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json == ANSWERS[op]
    assert link.calls == [(op, args)]


def test_model_ready(client: falcon.testing.TestClient, link: FakeLink) -> None:
    assert client.simulate_get("/v2/models/simple/ready").status_code == 200
    link.answers["model_ready"] = False
    assert client.simulate_get("/v2/models/simple/versions/2/ready").status_code == 400
    assert link.calls[-1] == ("model_ready", {"model": "simple", "version": "2"})


def test_errors_have_one_shape(client: falcon.testing.TestClient, link: FakeLink) -> None:
    link.answers["model_metadata"] = not_found("Request for unknown model: 'nope' is not found")
    r = client.simulate_get("/v2/models/nope")
    assert (r.status_code, r.json) == (404, {"error": "Request for unknown model: 'nope' is not found"})
    link.answers["model_config"] = ConveyorError(Status.UNSUPPORTED, "no")
    assert client.simulate_get("/v2/models/x/config").status_code == 501

    r = client.simulate_get("/v2/no/such/route")
    assert (r.status_code, r.json) == (404, {"error": "Not Found"})
    r = client.simulate_post("/v2/health/live")
    assert (r.status_code, r.json) == (405, {"error": "Method Not Allowed"})
    assert "GET" in r.headers["allow"]

    link.answers["model_stats"] = RuntimeError("boom")
    r = client.simulate_get("/v2/models/stats")
    assert (r.status_code, r.json) == (500, {"error": "internal error: RuntimeError: boom"})


def infer_body(binary_out: bool = True, request_id: str = "") -> tuple[bytes, dict[str, str], np.ndarray]:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = th.InferInput("A", [3, 4], "FP32").set_data_from_numpy(x)
    s = th.InferInput("S", [2], "BYTES").set_data_from_numpy(np.array(["a", "bc"], dtype=object), binary_data=False)
    outputs = [
        th.InferRequestedOutput("A_OUT", binary_data=binary_out),
        th.InferRequestedOutput("S_OUT", False),
    ]
    body, length = Client.generate_request_body([a, s], outputs=outputs, request_id=request_id)
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    return body, headers, x


def parse(r: Any) -> Any:
    return Client.parse_response_body(
        r.content,
        header_length=r.headers.get("inference-header-content-length"),
        content_encoding=r.headers.get("content-encoding"),
    )


def test_infer_binary_round_trip(client: falcon.testing.TestClient, plane: EchoPlane) -> None:
    body, headers, x = infer_body(request_id="abc")
    r = client.simulate_post("/v2/models/simple/versions/2/infer", body=body, headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    result = parse(r)
    np.testing.assert_array_equal(result.as_numpy("A_OUT"), x)
    assert result.as_numpy("S_OUT").tolist() == ["a", "bc"]
    doc = result.get_response()
    assert (doc["model_name"], doc["model_version"], doc["id"]) == ("simple", "2", "abc")
    assert plane.calls[0].model == "simple" and plane.calls[0].version == "2"
    assert plane.regions.released == 1


def test_infer_json_only(client: falcon.testing.TestClient) -> None:
    body, headers, x = infer_body(binary_out=False)
    r = client.simulate_post("/v2/models/simple/infer", body=body, headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in r.headers
    assert "id" not in r.json
    assert r.json["outputs"][0]["data"] == x.reshape(-1).tolist()


@pytest.mark.parametrize(("coding", "encode"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_infer_compressed_both_ways(client: falcon.testing.TestClient, coding: str, encode: Any) -> None:
    body, headers, x = infer_body()
    headers = {**headers, "Content-Encoding": coding, "Accept-Encoding": coding}
    r = client.simulate_post("/v2/models/simple/infer", body=encode(body), headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-encoding"] == coding
    header_length = int(r.headers["inference-header-content-length"])
    # The header length counts the uncompressed JSON.
    plain = {"gzip": gzip.decompress, "deflate": zlib.decompress}[coding](r.content)  # type: ignore[operator]
    orjson.loads(plain[:header_length])
    np.testing.assert_array_equal(parse(r).as_numpy("A_OUT"), x)


def test_infer_errors(client: falcon.testing.TestClient, plane: EchoPlane) -> None:
    r = client.simulate_post("/v2/models/simple/infer", body=b"{not json")
    assert r.status_code == 400 and r.json["error"].startswith("failed to parse the request JSON")
    r = client.simulate_post("/v2/models/simple/infer", body=b"garbage", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "failed to decompress the gzip request body" in r.json["error"]
    r = client.simulate_post("/v2/models/simple/infer", body=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 501 and "unsupported Content-Encoding" in r.json["error"]
    body, headers, _ = infer_body()
    r = client.simulate_post("/v2/models/simple/infer", body=body[:-3], headers=headers)
    assert r.status_code == 400
    assert "unexpected size for input 'A', expecting 3 additional bytes" in r.json["error"]
    plane.error = not_found("Request for unknown model: 'simple' is not found")
    r = client.simulate_post("/v2/models/simple/infer", body=body, headers=headers)
    assert (r.status_code, r.json) == (404, {"error": "Request for unknown model: 'simple' is not found"})
    assert "inference-header-content-length" not in r.headers


def test_body_limit(client: falcon.testing.TestClient, plane: EchoPlane) -> None:
    r = client.simulate_post("/v2/models/simple/infer", body=b" " * 5000)
    assert r.status_code == 400
    assert r.json["error"].startswith("request size of 5000 bytes exceeds the maximum allowed input size of 4096 bytes")
    assert r.headers["connection"] == "close"
    bomb = gzip.compress(b'{"inputs": []}' + b" " * 10_000)
    r = client.simulate_post("/v2/models/simple/infer", body=bomb, headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400
    assert r.json["error"].startswith("Decompressed data size exceeds the maximum allowed value of 4096 bytes")
    assert plane.calls == []


def test_body_limit_answers_before_the_body_is_read(client: falcon.testing.TestClient) -> None:
    app = BodyLimit(client.app, 4096)  # type: ignore[arg-type]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        raise AssertionError("the body must not be read")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": [(b"content-length", b"5000")]}
    asyncio.run(app(scope, receive, send))
    start, body = sent
    assert start["status"] == 400 and (b"connection", b"close") in start["headers"]
    assert orjson.loads(body["body"])["error"].startswith(
        "request JSON size of 5000 bytes exceeds the maximum allowed input size of 4096 bytes"
    )

    # Within the limit, the request goes through to the app.
    ok = falcon.testing.TestClient(app).simulate_get("/v2/health/live", headers={"Content-Length": "0"})
    assert ok.status_code == 200


def test_binary_inputs_past_the_arena_are_refused_in_tritons_pool_words(client: falcon.testing.TestClient) -> None:
    # Triton's python-backend QA (test_growth_error) sends 1 GiB and expects its pool-growth error.
    app = BodyLimit(client.app, 4096, 2048)  # type: ignore[arg-type]

    def refusal(length: int, header_length: int) -> tuple[int, str]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            raise AssertionError("the body must not be read")

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        headers = [(b"content-length", str(length).encode()),
                   (b"inference-header-content-length", str(header_length).encode())]
        asyncio.run(app({"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": headers},
                         receive, send))
        start, body = sent
        return start["status"], orjson.loads(body["body"])["error"]

    status, error = refusal(5000, 100)  # 4,900 bytes of tensors: more than the arena holds
    assert status == 503 and error.startswith("Failed to increase the shared memory pool size")
    status, error = refusal(5000, 3500)  # 1,500 bytes of tensors would fit: the body limit speaks
    assert status == 400 and error.startswith("request size of 5000 bytes exceeds the maximum allowed input size")
