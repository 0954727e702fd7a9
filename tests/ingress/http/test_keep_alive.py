"""The keep-alive timeout on the HTTP ingress's protocol (uvicorn's ``timeout_keep_alive``, kept by
one timer per idle spell in ``protocol.py``): a connection idle that long is closed; one that keeps
sending requests, for longer than the timeout in all, is not. A real uvicorn server over loopback."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.threaded_server import serve

LEVEL = "unit"

KEEP_ALIVE_S = 1  # short here; the ingress's is edge.KEEP_ALIVE_S
REQUEST = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"
ANSWER_END = b"\r\n\r\nok"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    yield from serve(_app, timeout_keep_alive=KEEP_ALIVE_S)


def _ask(conn: socket.socket) -> None:
    conn.sendall(REQUEST)
    got = b""
    while not got.endswith(ANSWER_END):
        chunk = conn.recv(4096)
        assert chunk, "the server closed a connection in use"
        got += chunk
    assert got.startswith(b"HTTP/1.1 200 ")


def _closed_by_server(conn: socket.socket) -> bool:
    conn.settimeout(KEEP_ALIVE_S * 10)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        _ask(conn)
        assert _closed_by_server(conn)


def test_a_connection_in_use_for_longer_than_the_timeout_stays_open(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        # Requests a quarter of the timeout apart, for three timeouts: never idle long enough.
        for _ in range(12):
            _ask(conn)
            time.sleep(KEEP_ALIVE_S / 4)
        _ask(conn)
        assert _closed_by_server(conn)  # and once idle, closed as any
