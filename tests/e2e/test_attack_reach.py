"""A restriction bypassed through another endpoint (CVE-2026-24207's class), attacked on a real group.

One group serves HTTP, gRPC, metrics, OpenAI, SageMaker and Vertex AI on loopback ports, with
``--http-restricted-api inference,metadata:admin-key=s3cret``, Triton's OpenAI frontend's
``--openai-restricted-api model-repository,metrics ops-key ops-value`` (its three words) and
``--grpc-restricted-protocol inference:admin-key=s3cret``. A category either flag restricts needs its
header on every HTTP-family port that serves it (docs: ingress/restricted.py): the attacks are the
OpenAI routes without it, every spelling of a path that reaches a restricted route, the cloud routes,
and the gRPC metadata's spellings.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import openai
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_ports
from tests.support import openai_models
from tests.support.cloud_http import A, B, call
from tests.support.group import Server, _listening, start_server
from tests.support.h2_attacks import Attacker, data_frame, headers_frame, message, request_headers, simple_request

LEVEL = "e2e"

ADMIN = {"admin-key": "s3cret"}  # --http-restricted-api inference,metadata
OPS = {"ops-key": "ops-value"}  # --openai-restricted-api model-repository,metrics
MODEL = "fake_llm"
PREDICT = "/v1/endpoints/e/deployedModels/m:predict"
HEALTH = "/v1/endpoints/e/deployedModels/m"
INFER_BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": A},
    {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": B},
]}).encode()
COMPLETION = json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2}).encode()


def openai_refusal(header: str) -> dict[str, object]:
    """Triton's OpenAI frontend's refusal body (python/openai/.../middleware/api_restriction.py)."""
    return {"error": {"message": f"This API is restricted, expecting header '{header}' with valid value",
                      "type": "authentication_error", "code": "invalid_auth"}}


def http_refusal(header: str) -> dict[str, str]:
    return {"error": f"This API is restricted, expecting header '{header}'"}


@dataclass
class Reach:
    server: Server
    openai: int
    sagemaker: int
    vertex: int


@pytest.fixture(scope="module")
def reach(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reach]:
    repo = str(tmp_path_factory.mktemp("reach"))
    add_sub(repo, "simple", 8)
    openai_models.build(repo, MODEL)
    openai_port, sagemaker_port, vertex_port = free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "SAGEMAKER_"))}
    env.update(AIP_PREDICT_ROUTE=PREDICT, AIP_HEALTH_ROUTE=HEALTH, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="simple")
    srv = start_server(
        repo, f"reach{os.getpid()}", "--workers", "1", "--model-control-mode", "explicit",
        "--load-model", "simple", "--load-model", MODEL,
        "--http-restricted-api", "inference,metadata:admin-key=s3cret",
        "--openai-restricted-api", "model-repository,metrics", "ops-key", "ops-value",
        "--grpc-restricted-protocol", "inference:admin-key=s3cret",
        "--openai-port", str(openai_port), "--openai-address", "127.0.0.1",
        "--allow-sagemaker", "true", "--sagemaker-port", str(sagemaker_port),
        "--allow-vertex-ai", "true", "--vertex-ai-port", str(vertex_port), "--vertex-ai-default-model", "simple",
        env=env)
    try:
        deadline = time.monotonic() + 30
        while not all(_listening(p) for p in (openai_port, sagemaker_port, vertex_port)):
            assert time.monotonic() < deadline, "the OpenAI and cloud ingress did not listen"
            time.sleep(0.1)
        yield Reach(srv, openai_port, sagemaker_port, vertex_port)
    finally:
        assert srv.stop() == 0
    assert srv.shm_segments() == []


def raw(port: int, head: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request exactly as written (``head``: request line and headers, no final blank line): the
    path is sent unnormalised, headers may repeat. Returns the status and the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        extra = f"Content-Length: {len(body)}\r\n" if body else ""
        sock.sendall(f"{head}\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode() + body)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, payload = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), payload


def client(reach: Reach, headers: dict[str, str] | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{reach.openai}/v1", api_key="none", max_retries=0,
                         timeout=30, default_headers=headers or {})


def test_the_openai_port_needs_the_http_flags_header(reach: Reach) -> None:
    # Restricted on HTTP (inference, metadata): restricted on the OpenAI port too, with Triton's
    # OpenAI frontend's 401 and words.
    bare = client(reach)
    for call_it in (lambda: bare.completions.create(model=MODEL, prompt="a b", max_tokens=2),
                    lambda: bare.chat.completions.create(model=MODEL, max_tokens=2,
                                                         messages=[{"role": "user", "content": "hi"}]),
                    lambda: bare.embeddings.create(model=MODEL, input="a b")):
        with pytest.raises(openai.AuthenticationError) as err:
            call_it()
        assert err.value.status_code == 401
        assert err.value.body == openai_refusal("admin-key")["error"]
    status, body = raw(reach.openai, "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json", COMPLETION)
    assert (status, json.loads(body)) == (401, openai_refusal("admin-key"))
    # The model list is metadata (HTTP's flag) and model-repository (the OpenAI flag's): both headers.
    for headers in ({}, ADMIN, OPS):
        with pytest.raises(openai.AuthenticationError):
            client(reach, headers).models.list()
    assert [m.id for m in client(reach, ADMIN | OPS).models.list()] == [MODEL, "simple"]  # every ready model
    with pytest.raises(openai.AuthenticationError):
        client(reach, {"admin-key": "S3CRET"}).completions.create(model=MODEL, prompt="a", max_tokens=1)
    out = client(reach, {"ADMIN-KEY": "s3cret"}).completions.create(model=MODEL, prompt="a b", max_tokens=2)
    assert out.choices[0].text  # a header's name is case-insensitive, its value is not
    # Neither restricted: vLLM's /health answers without a header.
    assert raw(reach.openai, "GET /health HTTP/1.1")[0] == 200


# Every spelling of a restricted route: none may reach the model without the header. A spelling falcon
# routes to a restricted resource is refused (401); one it routes nowhere is a 404.
SPELLINGS = [
    ("POST", "/v1/completions/"),  # the trailing slash is stripped: the same route
    ("POST", "/v1/completions?x=1"),
    ("POST", "/v1%2Fcompletions"),  # falcon unescapes the path before routing
    ("POST", "/v1/%63ompletions"),
    ("POST", "//v1/completions"),
    ("POST", "/v1//completions"),
    ("POST", "/v1/./completions"),
    ("POST", "/v1/chat/../completions"),
    ("POST", "/V1/COMPLETIONS"),
    ("HEAD", "/v1/completions"),
    ("OPTIONS", "/v1/completions"),
    ("GET", "/v1/completions"),
    ("PUT", "/v1/completions"),
    ("OPTIONS", "/v1/models"),
    ("HEAD", "/v1/models"),
    ("GET", "/v1/models/fake_llm/"),
    ("GET", "/v1/models/fake%5Fllm"),
    ("POST", "/tokenize"),
    ("POST", "/v1/load_lora_adapter"),
]


@pytest.mark.parametrize(("method", "path"), SPELLINGS)
def test_spellings_of_a_restricted_openai_route(reach: Reach, method: str, path: str) -> None:
    got, body = raw(reach.openai, f"{method} {path} HTTP/1.1\r\nContent-Type: application/json", COMPLETION)
    assert got in (401, 404), body
    assert b"choices" not in body and MODEL.encode() not in body
    if got == 401 and method != "HEAD":
        assert json.loads(body)["error"]["type"] == "authentication_error"
    print(method, path, got)


def test_the_header_cannot_be_smuggled(reach: Reach) -> None:
    for headers in ("admin-key: wrong\r\nadmin-key: s3cret", "admin-key: s3cret\r\nadmin-key: wrong",
                    "admin-key:  wrong", "admin_key: s3cret", "admin-key : s3cret", "x-admin-key: s3cret"):
        status, body = raw(reach.openai, f"POST /v1/completions HTTP/1.1\r\n{headers}\r\n"
                                         "Content-Type: application/json", COMPLETION)
        assert status in (400, 401), (headers, body)  # a space before the colon is a malformed request
        assert b"choices" not in body
    status, body = raw(reach.openai, "POST /v1/completions HTTP/1.1\r\nadmin-key: s3cret\r\n"
                                     "Content-Type: application/json", COMPLETION)
    assert status == 200 and b"choices" in body


def test_the_openai_flag_restricts_the_http_family(reach: Reach) -> None:
    # model-repository and metrics come from --openai-restricted-api alone: the KServe HTTP port, the
    # metrics port, SageMaker's model management and Vertex AI's redirect to metrics need ops-key too.
    http = th.InferenceServerClient(reach.server.http_url)
    with pytest.raises(InferenceServerException) as err:
        http.get_model_repository_index()
    assert err.value.status() == "403"
    assert err.value.message() == "This API is restricted, expecting header 'ops-key'"
    assert http.get_model_repository_index(headers=OPS)
    assert call(reach.server.metrics_port, "/metrics")[0] == 403
    status, _, text = call(reach.server.metrics_port, "/metrics", headers=OPS)
    assert status == 200 and b"nv_inference_request_success" in text
    status, _, body = call(reach.sagemaker, "/models")
    assert (status, json.loads(body)) == (403, http_refusal("ops-key"))
    assert call(reach.sagemaker, "/models", headers=OPS)[0] == 200
    redirect = {"X-Vertex-Ai-Triton-Redirect": "metrics"}
    assert call(reach.vertex, PREDICT, b"", headers=redirect)[0] == 403
    assert call(reach.vertex, PREDICT, b"", headers=redirect | OPS)[0] == 200
    # What neither flag restricts stays open: health on every port.
    assert http.is_server_ready()
    assert call(reach.sagemaker, "/ping")[0] == 200 and call(reach.vertex, HEALTH)[0] == 200


def test_cloud_routes_to_restricted_apis(reach: Reach) -> None:
    # SageMaker: Triton's 403 before anything else of the inference (not its 400 for a failed one),
    # whether or not the multi-model name is loaded.
    for path in ("/invocations", "/models/nothing-loaded/invoke"):
        status, _, body = call(reach.sagemaker, path, INFER_BODY, headers={"Content-Type": "application/json"})
        assert (status, json.loads(body)) == (403, http_refusal("admin-key")), path
    status, _, body = call(reach.sagemaker, "/invocations", INFER_BODY,
                           headers={"Content-Type": "application/json"} | ADMIN)
    assert status == 200 and json.loads(body)["model_name"] == "simple"
    # Vertex AI: its predict route, and every redirect to a restricted KServe route.
    for redirect in ("", "v2/models/simple/infer", "v2/models/simple", "v2", "v2/models/simple/versions/1/infer",
                     "v2/models/simple/infer/", "v2/models/simple%2Finfer"):
        headers = {"X-Vertex-Ai-Triton-Redirect": redirect} if redirect else {}
        status, _, body = call(reach.vertex, PREDICT, INFER_BODY, headers=headers)
        assert status in (403, 404), (redirect, body)
        assert b"outputs" not in body and b"simple" not in body
    status, _, body = call(reach.vertex, PREDICT, INFER_BODY, headers={"X-Vertex-Ai-Triton-Redirect": "v2"})
    assert (status, json.loads(body)) == (403, http_refusal("admin-key"))
    assert call(reach.vertex, PREDICT, INFER_BODY, headers=ADMIN)[0] == 200
    # The KServe HTTP port's own spellings, for comparison: the same verdicts.
    for method, path in (("POST", "/v2/models/simple/infer"), ("POST", "/v2/models/simple/infer/"),
                         ("POST", "/v2/models/simple%2Finfer"), ("OPTIONS", "/v2/models/simple/infer"),
                         ("HEAD", "/v2/models/simple"), ("GET", "/v2")):
        status, body = raw(reach.server.http_port, f"{method} {path} HTTP/1.1\r\nContent-Type: application/json",
                           INFER_BODY)
        assert status in (403, 404), (method, path, body)
        assert b"outputs" not in body


def simple_inputs() -> list[tg.InferInput]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return [tg.InferInput("INPUT0", [1, 16], "INT32").set_data_from_numpy(a),
            tg.InferInput("INPUT1", [1, 16], "INT32").set_data_from_numpy(np.ones_like(a))]


def _grpc_infer(port: int, metadata: list[tuple[str, str]]) -> tuple[str, str]:
    """A raw ModelInfer of ``simple`` with ``metadata`` exactly as given (upper case allowed):
    its grpc-status and message, or ('reset', '') when the server refused the stream or connection."""
    attacker = Attacker(port, "metadata")
    try:
        block = attacker.block(request_headers("ModelInfer") + metadata)
        attacker.send(headers_frame(1, block) + data_frame(1, message(simple_request()), end_stream=True))
        outcome = attacker.outcome
        for _ in range(300):  # bounded: 30 s at most
            if outcome.statuses or outcome.closed or outcome.resets or outcome.goaway is not None:
                break
            time.sleep(0.1)
        return (outcome.statuses[0], outcome.messages[0]) if outcome.statuses else ("reset", "")
    finally:
        attacker.close()


def test_grpc_metadata_spellings(reach: Reach) -> None:
    port = reach.server.grpc_port
    key = "triton-grpc-protocol-admin-key"
    assert _grpc_infer(port, [(key, "s3cret")])[0] == "0"
    for metadata in ([], [(key, "S3CRET")], [(key.upper(), "s3cret")], [("Triton-Grpc-Protocol-Admin-Key", "s3cret")],
                     [("admin-key", "s3cret")], [(key + "-bin", "s3cret")], [(key, "s3cret ")]):
        status, _ = _grpc_infer(port, metadata)
        assert status != "0", metadata
    grpc = tg.InferenceServerClient(reach.server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("simple", simple_inputs())
    assert err.value.status() == "StatusCode.UNAVAILABLE"
    assert grpc.infer("simple", simple_inputs(), headers={key: "s3cret"}).as_numpy("OUTPUT0") is not None
