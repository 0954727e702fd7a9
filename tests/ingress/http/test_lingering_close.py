"""The lingering close of the HTTP ingress's protocol (``protocol.py``): a request refused while its body
still arrives (``BodyLimit``, at its Content-Length) is answered, and the client, which sends its whole body
before it reads, reads that answer instead of a reset connection; over TLS, which has no half-close, the
connection just closes after the answer. A real uvicorn server over loopback, no group."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from conveyor.ingress.http.body import BodyLimit
from tests.support.certs import Certs, make_certs
from tests.support.threaded_server import serve

LEVEL = "unit"

LIMIT = 1 << 20
SENT = 32 << 20  # past what the two sockets' buffers hold: closed at once, the connection would be reset


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _serve(**tls: Any) -> Iterator[int]:
    yield from serve(BodyLimit(_app, LIMIT), **tls)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    yield from _serve()


@pytest.fixture(scope="module")
def tls_port(certs: Certs) -> Iterator[int]:
    yield from _serve(ssl_certfile=certs.server_cert, ssl_keyfile=certs.server_key)


def _head(length: int) -> bytes:
    return b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length


def _read_all(conn: socket.socket) -> bytes:
    reply = b""
    while chunk := conn.recv(1 << 16):
        reply += chunk
    return reply


def test_a_client_that_sends_its_whole_refused_body_reads_the_answer(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(_head(SENT) + b"x" * SENT)
        reply = _read_all(conn)  # then the server's end: it closed once the rest was dropped
    assert reply.startswith(b"HTTP/1.1 400 ") and b"exceeds the maximum allowed input size" in reply


def test_over_tls_the_connection_closes_after_the_answer(tls_port: int, certs: Certs,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    context = ssl.create_default_context(cafile=certs.ca)
    with socket.create_connection(("127.0.0.1", tls_port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            conn.sendall(_head(1 << 40) + b"{")
            reply = _read_all(conn)
    assert reply.startswith(b"HTTP/1.1 400 ") and b"exceeds the maximum allowed input size" in reply
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # not a failed half-close, closed anyway
