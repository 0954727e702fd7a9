"""Plain infer requests served by the protocol itself (``ingress/http/fast_protocol.py``), over raw
sockets against a running group: keep-alive, pipelining, ``Connection: close``, HTTP/1.0, the
requests it leaves to falcon, and a client that leaves mid-request."""

from __future__ import annotations

import gzip
import json
import socket
import time

import numpy as np
import tritonclient.http as th

from tests.support.group import Server

LEVEL = "e2e"

A = list(range(16))
B = [1] * 16
BODY = json.dumps({"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": A},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B},
]}).encode()


def _request(path: str = "/v2/models/simple/infer", body: bytes = BODY, version: str = "1.1",
             extra: str = "") -> bytes:
    head = f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


def _read_response(sock: socket.socket, buffered: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response off ``sock`` (``buffered``: what was read past the previous one)."""
    while b"\r\n\r\n" not in buffered:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a response"
        buffered += chunk
    head, _, rest = bytes(buffered).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed inside a body"
        rest += chunk
    buffered[:] = rest[length:]
    return status, headers, rest[:length]


def _outputs(body: bytes) -> dict[str, list[int]]:
    return {o["name"]: o["data"] for o in json.loads(body)["outputs"]}


_BINARY_HEADER = json.dumps({
    "inputs": [{"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
               for i in range(2)],
    "outputs": [{"name": f"OUTPUT{i}", "parameters": {"binary_data": True}} for i in range(2)],
}).encode()


def _binary_request(path: str, a: np.ndarray, b: np.ndarray, extra: str = "") -> bytes:
    """perf_analyzer's request: the same JSON header every time, binary inputs and outputs."""
    return _request(path, _BINARY_HEADER + a.tobytes() + b.tobytes(),
                    extra=f"Inference-Header-Content-Length: {len(_BINARY_HEADER)}\r\n{extra}")


def _connect(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    return sock


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: Server) -> None:
    other = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [5] * 16},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": B},
    ]}).encode()
    with _connect(server) as sock:
        buffered = bytearray()
        # Three in one write: the second and third wait behind the first (pipelining).
        sock.sendall(_request() + _request(body=other) + _request("/v2/models/simple/versions/1/infer"))
        answers = [_read_response(sock, buffered) for _ in range(3)]
        sock.sendall(_request(body=other))  # the connection is still usable afterwards
        answers.append(_read_response(sock, buffered))
    assert [status for status, _, _ in answers] == [200, 200, 200, 200]
    sums = [_outputs(body)["OUTPUT0"] for _, _, body in answers]
    assert sums == [[a + b for a, b in zip(A, B, strict=True)], [6] * 16,
                    [a + b for a, b in zip(A, B, strict=True)], [6] * 16]
    assert all("connection" not in headers for _, headers, _ in answers)
    assert answers[0][1]["content-type"] == "application/json"


def test_connection_close_and_http_1_0_end_the_connection(server: Server) -> None:
    for request in (_request(extra="Connection: close\r\n"), _request(version="1.0")):
        with _connect(server) as sock:
            sock.sendall(request)
            buffered = bytearray()
            status, headers, body = _read_response(sock, buffered)
            assert status == 200 and headers["connection"] == "close"
            assert _outputs(body)["OUTPUT1"] == [a - b for a, b in zip(A, B, strict=True)]
            assert sock.recv(1) == b""  # closed by the server


def test_errors_keep_tritons_wording_and_the_connection(server: Server) -> None:
    with _connect(server) as sock:
        buffered = bytearray()
        sock.sendall(_request("/v2/models/nosuchmodel/infer"))
        status, _, body = _read_response(sock, buffered)
        assert status == 404  # Triton's NOT_FOUND
        assert json.loads(body)["error"].startswith("Request for unknown model: 'nosuchmodel'")
        sock.sendall(_request(body=b"{not json"))
        status, _, body = _read_response(sock, buffered)
        assert status == 400 and json.loads(body)["error"]
        sock.sendall(_request())
        assert _read_response(sock, buffered)[0] == 200


def test_requests_left_to_falcon_still_work(server: Server) -> None:
    with _connect(server) as sock:
        buffered = bytearray()
        # Expect: 100-continue: the interim response, then the answer.
        head = (f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(BODY)}\r\n"
                "Expect: 100-continue\r\n\r\n").encode()
        sock.sendall(head)
        interim = sock.recv(64)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        sock.sendall(BODY)
        status, _, body = _read_response(sock, buffered)
        assert status == 200 and _outputs(body)["OUTPUT0"][0] == 1
        # Chunked body.
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
        sock.sendall(b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + chunked)
        status, _, body = _read_response(sock, buffered)
        assert status == 200 and _outputs(body)["OUTPUT0"][0] == 1


def test_a_client_that_leaves_mid_request_harms_no_one(server: Server) -> None:
    for _ in range(20):
        sock = _connect(server)
        sock.sendall(_request())  # and go away before the answer
        sock.close()
        sock = _connect(server)
        sock.sendall(_request()[:40])  # half a head
        sock.close()
    time.sleep(0.2)
    with _connect(server) as sock:
        sock.sendall(_request())
        assert _read_response(sock, bytearray())[0] == 200


def test_binary_answers_of_one_request_template_are_alike_but_their_own(server: Server) -> None:
    """The answers to requests with one JSON header reuse the last one's JSON header and head lines
    (``codec.AnswerLayout``): each still carries its own bytes, model and version, and the same
    head and body as the first one's."""
    a, b = np.arange(16, dtype=np.int32), np.full(16, 3, np.int32)
    with _connect(server) as sock:
        buffered = bytearray()
        same = []
        for _ in range(3):  # the first may wait for the signature, the second is kept, the third reuses it
            sock.sendall(_binary_request("/v2/models/simple/infer", a, b))
            same.append(_read_response(sock, buffered))
        for status, headers, body in same:
            headers.pop("date")
            assert (status, headers, body) == same[0]
        status, headers, body = same[0]
        assert headers["content-type"] == "application/octet-stream"
        header_length = int(headers["inference-header-content-length"])
        parsed = th.InferenceServerClient.parse_response_body(body, header_length=header_length)
        assert parsed.get_response()["model_name"] == "simple"
        assert parsed.as_numpy("OUTPUT0").tolist() == [(a + b).tolist()]
        for i, path, model in ((1, "/v2/models/simple/infer", "simple"),
                               (2, "/v2/models/simple_two_instances/infer", "simple_two_instances"),
                               (3, "/v2/models/simple/versions/1/infer", "simple"),
                               (4, "/v2/models/simple_two_instances/infer", "simple_two_instances")):
            c = np.full(16, i, np.int32)
            sock.sendall(_binary_request(path, a, c))
            status, headers, body = _read_response(sock, buffered)
            assert status == 200
            parsed = th.InferenceServerClient.parse_response_body(
                body, header_length=int(headers["inference-header-content-length"]))
            assert parsed.get_response()["model_name"] == model
            assert parsed.as_numpy("OUTPUT1").tolist() == [(a - c).tolist()]
        sock.sendall(_binary_request("/v2/models/simple/infer", a, b, "Accept-Encoding: gzip\r\n"))
        status, headers, zipped = _read_response(sock, buffered)
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert gzip.decompress(zipped) == same[0][2]
