"""A client that leaves takes its request with it, on every HTTP route: KServe infer (the fast path's
task-free way and its task, falcon's), generate and generate_stream, the OpenAI routes (streamed or
not, and embeddings), SageMaker's ``/invocations`` and Vertex AI's predict route.

One group serves them all, with one Python model of the ``text_input`` / ``text_output`` contract, so
every route reaches it, twice: ``waiter`` answers from ``execute``, ``waiter_decoupled`` through its
response sender. Each has one instance and dynamic batching, so a request waits in the router's queue
while another runs. It records each request it starts and, for a prompt holding ``hold``, waits in small
steps until ``request.is_cancelled()`` (a bound far above any test's wait), then records that it saw it
and answers CANCELLED. For each route: client A's ``hold`` request runs; client B's request queues
behind it and B closes its socket: B never reaches ``execute`` and counts as CANCELED; A closes its
socket: the model sees ``is_cancelled()`` (its CANCELLED answer counts as CANCELED too); client C is
served.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from conveyor.deploy.example_repo import write_model
from conveyor.deploy.ports import free_ports
from tests.support.group import Server, _listening, start_server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

WAIT_S = 30.0  # a bound, only reached when something is broken
PREDICT = "/v1/endpoints/e/deployedModels/m:predict"

MODEL = '''
import json
import os
import re
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HOLD_S = 120  # a request held and never cancelled ends after this (the test fails long before)
TAG = re.compile(r"(?:hold|pass)-[0-9a-f]{12}")


def _text(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return "" if t is None else t.as_numpy().reshape(-1)[0].decode()


class TritonPythonModel:
    def initialize(self, args):
        self.record = os.path.join(args["model_repository"], args["model_version"], "record")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

    def _note(self, line):
        with open(self.record, "a") as f:
            f.write(line + "\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            embedding = _text(request, "embedding_request")
            found = TAG.search(embedding or _text(request, "text_input"))
            tag = found.group(0) if found else "?"
            self._note("start " + tag)
            if tag.startswith("hold"):
                deadline = time.monotonic() + HOLD_S
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.01)
                if request.is_cancelled():
                    self._note("cancelled " + tag)
                    responses.append(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
                    continue
            text = "[1.5]" if embedding else "echo:" + tag
            out = pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object))
            responses.append(pb_utils.InferenceResponse([out]))
        if not self.decoupled:
            return responses
        for request, response in zip(requests, responses):
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

CONFIG = '''
name: "{name}"
backend: "python"
max_batch_size: 4
dynamic_batching {{ }}
{policy}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "embedding_request" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''
MODEL_NAME = "waiter"
DECOUPLED = "waiter_decoupled"  # the same model, answering through its response sender


@dataclass
class Group:
    server: Server
    ports: dict[str, int]  # "http", "openai", "sagemaker", "vertex"

    def seen(self, model: str) -> list[str]:
        """What ``model`` recorded: ``start <tag>``, ``cancelled <tag>``."""
        try:
            with open(os.path.join(self.server.repo, model, "1", "record")) as f:
                return f.read().split("\n")
        except FileNotFoundError:
            return []


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    repo = str(tmp_path_factory.mktemp("waiter"))
    write_model(repo, MODEL_NAME, CONFIG.format(name=MODEL_NAME, policy=""), {"model.py": MODEL})
    write_model(repo, DECOUPLED, CONFIG.format(name=DECOUPLED, policy="model_transaction_policy { decoupled: true }"),
                {"model.py": MODEL})
    openai, sagemaker, vertex = free_ports(3)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIP_", "SAGEMAKER_"))}
    env.update(AIP_PREDICT_ROUTE=PREDICT, AIP_HEALTH_ROUTE="/health", SAGEMAKER_TRITON_DEFAULT_MODEL_NAME=MODEL_NAME)
    srv = start_server(repo, f"cl{os.getpid()}", "--workers", "1", "--http-ingress", "1",
                       "--openai-port", str(openai), "--openai-address", "127.0.0.1",
                       "--allow-sagemaker", "true", "--sagemaker-port", str(sagemaker),
                       "--allow-vertex-ai", "true", "--vertex-ai-port", str(vertex),
                       "--vertex-ai-default-model", MODEL_NAME, env=env)
    try:
        deadline = time.monotonic() + WAIT_S
        while not all(_listening(p) for p in (openai, sagemaker, vertex)):
            assert time.monotonic() < deadline, "an ingress did not listen"
            time.sleep(0.1)
        yield Group(srv, {"http": srv.http_port, "openai": openai, "sagemaker": sagemaker, "vertex": vertex})
    finally:
        assert srv.stop() == 0
    assert srv.shm_segments() == []


# --- the routes: each makes the request bytes for a model and a prompt, and says where they go -------------


def _http(path: str, body: bytes, extra: str = "", *, chunked: bool = False) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n{extra}"
    if chunked:  # falcon's way: the fast path takes only a Content-Length
        return f"{head}Transfer-Encoding: chunked\r\n\r\n{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


def _kserve(text: str) -> bytes:
    return json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1],
                                   "data": [text]}]}).encode()


def _binary(model: str, text: str) -> bytes:
    """perf_analyzer's form: the same JSON header every time (every prompt is as long), the bytes behind it.
    The header seen once, such a request goes from the parser's callback, without a task."""
    data = text.encode()
    header = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1, 1],
                                     "parameters": {"binary_data_size": 4 + len(data)}}]}).encode()
    return _http(f"/v2/models/{model}/infer", header + struct.pack("<I", len(data)) + data,
                 f"Inference-Header-Content-Length: {len(header)}\r\n")


def _generate(suffix: str) -> Callable[[str, str], bytes]:
    return lambda model, text: _http(f"/v2/models/{model}/{suffix}", json.dumps({"text_input": text}).encode())


def _openai(path: str, **fields: object) -> Callable[[str, str], bytes]:
    def make(model: str, text: str) -> bytes:
        doc = {"model": model, **fields}
        if path.endswith(("chat/completions", "/v1/messages")):
            doc["messages"] = [{"role": "user", "content": text}]
        elif path.endswith("embeddings"):
            doc["input"] = text
        else:
            doc["prompt"] = text
        return _http(path, json.dumps(doc).encode())
    return make


@dataclass
class Route:
    port: str  # which ingress
    make: Callable[[str, str], bytes]  # (model, prompt) -> the request
    model: str = MODEL_NAME


ROUTES = {
    "infer (task-free)": Route("http", _binary),
    "infer (task)": Route("http", lambda model, t: _http(f"/v2/models/{model}/infer", _kserve(t))),
    "infer (falcon)": Route("http", lambda model, t: _http(f"/v2/models/{model}/versions/1/infer", _kserve(t),
                                                           chunked=True)),
    "generate": Route("http", _generate("generate")),
    "generate_stream": Route("http", _generate("generate_stream")),
    "generate (decoupled)": Route("http", _generate("generate"), DECOUPLED),
    "generate_stream (decoupled)": Route("http", _generate("generate_stream"), DECOUPLED),
    "completions": Route("openai", _openai("/v1/completions", max_tokens=4)),
    "completions (stream)": Route("openai", _openai("/v1/completions", max_tokens=4, stream=True)),
    "completions (decoupled)": Route("openai", _openai("/v1/completions", max_tokens=4), DECOUPLED),
    "chat": Route("openai", _openai("/v1/chat/completions", max_tokens=4)),
    "chat (stream, decoupled)": Route("openai", _openai("/v1/chat/completions", max_tokens=4, stream=True), DECOUPLED),
    "embeddings": Route("openai", _openai("/v1/embeddings")),
    "anthropic messages": Route("openai", _openai("/v1/messages", max_tokens=4)),
    "anthropic messages (stream, decoupled)": Route("openai", _openai("/v1/messages", max_tokens=4, stream=True),
                                                    DECOUPLED),
    "sagemaker": Route("sagemaker", lambda model, t: _http("/invocations", _kserve(t))),
    "vertex": Route("vertex", lambda model, t: _http(PREDICT, _kserve(t))),
}


def _tag(word: str) -> str:
    return f"{word}-{secrets.token_hex(6)}"  # always as long: the binary route's header stays the same


def _send(group: Group, route: str, text: str) -> socket.socket:
    r = ROUTES[route]
    sock = socket.create_connection(("127.0.0.1", group.ports[r.port]), timeout=WAIT_S)
    sock.sendall(r.make(r.model, text))
    return sock


def _served(group: Group, route: str) -> str:
    """One request of a client that stays: 200, the model's answer in it; its tag."""
    tag = _tag("pass")
    with _send(group, route, tag) as sock:
        answer = b""
        while chunk := sock.recv(65536):  # ``Connection: close``: the answer ends with the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert (b"1.5" if route == "embeddings" else f"echo:{tag}".encode()) in answer, answer[:600]
    return tag


def _metric(group: Group, name: str, labels: str) -> int:
    found = re.search(rf"^{name}{{{labels}}} (\d+)$", metrics_text(group.server), re.M)
    return int(found.group(1)) if found else 0


def _pending(group: Group, model: str) -> int:
    return _metric(group, "nv_inference_pending_request_count", f'model="{model}",version="1"')


def _cancelled(group: Group, model: str) -> int:
    return _metric(group, "nv_inference_request_failure", f'model="{model}",reason="CANCELED",version="1"')


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_client_that_leaves_takes_its_request_with_it(group: Group, route: str) -> None:
    model = ROUTES[route].model
    _served(group, route)  # the ingress knows the model (and the binary route's header) from here on
    before = _cancelled(group, model)
    held = _tag("hold")
    running = _send(group, route, held)
    _until(lambda: f"start {held}" in group.seen(model), f"{route}: the held request never started")

    queued_tag = _tag("pass")
    queued = _send(group, route, queued_tag)
    _until(lambda: _pending(group, model) == 1, f"{route}: the second request never queued")
    queued.close()  # B leaves while queued
    _until(lambda: _pending(group, model) == 0, f"{route}: the queued request stayed queued")
    assert _cancelled(group, model) == before + 1

    running.close()  # A leaves while its model runs it
    _until(lambda: f"cancelled {held}" in group.seen(model), f"{route}: the model never saw is_cancelled()")
    _until(lambda: _cancelled(group, model) == before + 2, f"{route}: the running request's cancellation not counted")

    served = _served(group, route)  # the next client is served, by the same instance
    seen = group.seen(model)
    assert f"start {served}" in seen and f"start {queued_tag}" not in seen
