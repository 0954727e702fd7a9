"""Decompression bombs (CVE-2025-33201's class) against a real group: a body or a gRPC message
of about 128 KiB that would inflate to 128 MiB is refused once it inflates past the limit its
uncompressed form has, with that limit's error, and the ingress that took it holds no more than
that limit (plus a small margin) meanwhile; a normal client is served right after.

The group runs with small limits so the bombs are quick: HTTP bodies of 48 MiB, their JSON part
16 MiB, gRPC messages 24 MiB (the connection's buffer budget, which bounds a message). Each bomb is
made with zlib a mebibyte at a time (tests/support/bombs.py)."""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tg

from conveyor.deploy.ports import free_port
from tests.support import bombs
from tests.support.group import Server, _listening, pids_of, start_server
from tests.support.http_attacks import SIMPLE_BODY

LEVEL = "e2e"

BODY_LIMIT = 48 << 20  # --http-max-body-bytes
JSON_LIMIT = 16 << 20  # --max-json-bytes
GRPC_LIMIT = 24 << 20  # --grpc-max-connection-buffer-bytes: the largest gRPC message
INFLATED = 128 << 20  # what each bomb would inflate to: 2.7 to 8 times the limits
# What an ingress may hold past the limit while it refuses a bomb: the first inflate step (8 MiB, which
# zlib copies out of its blocks, freed but not always reused), a later step and its copy (2 MiB), the
# compressed bytes, the request's own objects. Inflating whole and then checking holds twice the limit.
MARGIN = 16 << 20

# A JSON infer request whose tensor data is padded with whitespace: valid JSON, a small bomb.
JSON_PREFIX = b'{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":['
GENERATE_PREFIX = b'{"text_input":"'
OPENAI_PREFIX = b'{"model":"none","prompt":"'

TRITON_WORDS = "Decompressed data size exceeds the maximum allowed value of {} bytes. Use --http-max-input-size to " \
               "increase the limit. (conveyor serve: {})"


@pytest.fixture(scope="module")
def group(light_repo: str) -> Iterator[tuple[Server, int]]:
    port = free_port()
    srv = start_server(light_repo, f"bomb{os.getpid()}", "--workers", "1",
                       "--http-max-body-bytes", str(BODY_LIMIT), "--max-json-bytes", str(JSON_LIMIT),
                       "--grpc-max-connection-buffer-bytes", str(GRPC_LIMIT),
                       "--openai-port", str(port), "--openai-address", "127.0.0.1")
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    yield srv, port
    assert srv.stop() == 0


def normal_infer(port: int) -> None:
    """A normal client's JSON infer, served."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/v2/models/simple/infer", SIMPLE_BODY, {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.read()
        response.read()
    finally:
        conn.close()


# (path, coding, prefix, header length given, the limit that speaks, its flag)
HTTP_BOMBS = [
    ("/v2/models/simple/infer", "gzip", JSON_PREFIX, False, JSON_LIMIT, "--max-json-bytes"),
    ("/v2/models/simple/infer", "deflate", JSON_PREFIX, False, JSON_LIMIT, "--max-json-bytes"),
    # Binary tensor data after a JSON header: the body's own limit.
    ("/v2/models/simple/infer", "gzip", JSON_PREFIX, True, BODY_LIMIT, "--http-max-body-bytes"),
    ("/v2/models/simple/versions/1/infer", "deflate", JSON_PREFIX, True, BODY_LIMIT, "--http-max-body-bytes"),
    ("/v2/models/simple/generate", "gzip", GENERATE_PREFIX, False, JSON_LIMIT, "--max-json-bytes"),
    ("/v2/models/simple/generate_stream", "deflate", GENERATE_PREFIX, False, JSON_LIMIT, "--max-json-bytes"),
]


@pytest.mark.parametrize(("path", "coding", "prefix", "binary", "limit", "flag"), HTTP_BOMBS)
def test_an_http_bomb_stops_at_the_limit(group: tuple[Server, int], path: str, coding: str, prefix: bytes,
                                         binary: bool, limit: int, flag: str) -> None:
    server, _ = group
    body = bombs.bomb(coding, INFLATED, prefix)
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    if binary:
        headers["Inference-Header-Content-Length"] = str(len(JSON_PREFIX))
    with bombs.MemoryPeak(pids_of(server, "ingress-http")) as peak:
        status, answer, response_headers = bombs.post(server.http_port, path, body, headers)
    assert (status, answer) == (400, {"error": TRITON_WORDS.format(limit, flag)})
    assert response_headers["connection"] == "close"  # the rest of the bomb is never read
    assert peak.growth < limit + MARGIN, peak.growth
    normal_infer(server.http_port)


@pytest.mark.parametrize(("path", "coding"), [("/v1/completions", "gzip"), ("/v1/chat/completions", "deflate"),
                                              ("/v1/embeddings", "gzip"), ("/tokenize", "deflate")])
def test_an_openai_bomb_stops_at_the_body_limit(group: tuple[Server, int], path: str, coding: str) -> None:
    server, port = group
    body = bombs.bomb(coding, INFLATED, OPENAI_PREFIX)
    with bombs.MemoryPeak(pids_of(server, "ingress-openai")) as peak:
        status, answer, _ = bombs.post(port, path, body, {"Content-Type": "application/json",
                                                          "Content-Encoding": coding})
    # The OpenAI ingress's error shape, with the same words; an OpenAI body is JSON whole: the JSON limit.
    assert (status, answer["error"]["message"], answer["error"]["code"]) == (
        400, TRITON_WORDS.format(JSON_LIMIT, "--max-json-bytes"), 400)
    assert peak.growth < JSON_LIMIT + MARGIN, peak.growth
    normal_infer(server.http_port)


def test_a_plain_openai_body_past_the_json_limit_is_refused_unread(group: tuple[Server, int]) -> None:
    server, port = group
    size = JSON_LIMIT + (1 << 20)  # under the body limit, over the JSON one
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    with sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % size + OPENAI_PREFIX)
        head = sock.recv(65536)  # answered before the body comes
    assert head.startswith(b"HTTP/1.1 400"), head[:200]
    assert f"request JSON size of {size} bytes exceeds the maximum allowed input size of {JSON_LIMIT}".encode() in head
    normal_infer(server.http_port)


def test_a_bomb_is_refused_before_the_rest_of_it_arrives(group: tuple[Server, int]) -> None:
    # A body that declares a MiB more than is sent: the bomb, then a MiB of anything (past what the
    # ingress gathers before it starts to inflate). The answer comes without the rest.
    server, _ = group
    body = bombs.bomb("gzip", INFLATED, JSON_PREFIX) + bytes(1 << 20)
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    try:
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: bomb\r\nContent-Encoding: gzip\r\n"
                     b"Content-Length: %d\r\n\r\n" % (len(body) + (1 << 20)) + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert response.status == 400
        assert response.read().startswith(b'{"error":"Decompressed data size exceeds')
    finally:
        sock.close()
    normal_infer(server.http_port)


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_a_grpc_bomb_stops_at_the_message_limit(group: tuple[Server, int], coding: str) -> None:
    server, _ = group
    payload = bombs.infer_request_bomb(coding, INFLATED)
    with bombs.MemoryPeak(pids_of(server, "ingress-grpc")) as peak:
        status, message = bombs.grpc_call(server.grpc_port, "ModelInfer", payload, coding)
    # gRPC's status and words (grpc core's, which Triton's gRPC server answers with).
    assert (status, message) == ("8", "Decompressed message larger than max")
    assert peak.growth < GRPC_LIMIT + MARGIN, peak.growth
    # A normal client right after, compressed too.
    client = tg.InferenceServerClient(server.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.ones_like(a))
    result = client.infer("simple", inputs, compression_algorithm=coding)
    assert result.as_numpy("OUTPUT0").tolist() == (a + 1).tolist()
    client.close()
