"""Property-based test of the event loop's gRPC server's frame handling, on each HTTP/2
engine: any sequence of frames after the preface, valid or not, is served or refused
(a stream reset, GOAWAY), and never raises out of the protocol or from a task it started."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import grpc
import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.ingress.grpc.h2_server.connection import GrpcConnection
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from conveyor.ingress.grpc.h2_server.server import H2Server
from tests.support.fuzz import bounded, tried

LEVEL = "unit"

PATHS = ["/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/Echo", "/nope"]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
DATA, HEADERS = 0x0, 0x1


class Transport:
    def __init__(self) -> None:
        self.written = 0
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True


async def _live(request: bytes, context: Any) -> bytes:
    return b"\x08\x01"


async def _echo(requests: Any, context: Any) -> Any:
    async for message in requests:
        yield message


HANDLERS = {
    PATHS[0]: grpc.unary_unary_rpc_method_handler(_live),
    PATHS[1]: grpc.stream_stream_rpc_method_handler(_echo),
}
SERVERS = {engine: H2Server(HANDLERS, engine=engine) for engine in ENGINES}


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    """Any frame, well-formed or not (the fuzz target is the server's reading of them)."""
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    sid = draw(st.sampled_from([0, 1, 3, 5, 2]))
    kind = draw(st.integers(0, 10))
    flags = draw(st.sampled_from([0, END_STREAM, END_HEADERS, END_STREAM | END_HEADERS, PADDED,
                                  PRIORITY | END_HEADERS, 0xFF]))
    if kind == HEADERS and draw(st.booleans()):
        fields = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                  (":path", draw(st.sampled_from(PATHS))),
                  ("content-type", draw(st.sampled_from(["application/grpc", "text/plain"]))),
                  ("grpc-timeout", draw(st.sampled_from(["1S", "10m", "bad"])))]
        payload = bytes(hpack.Encoder().encode(fields))
    elif kind == DATA and draw(st.booleans()):
        body = draw(st.binary(max_size=32))
        payload = draw(st.sampled_from([b"\0", b"\1"])) + len(body).to_bytes(4, "big") + body
    else:
        payload = draw(st.binary(max_size=24))
    return frame(kind, flags, sid, payload)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("engine", ENGINES)
@bounded(300)
@given(st.lists(frames(), max_size=12), st.integers(1, 64))
def test_any_frames_are_served_or_refused(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, engine: str, sent: list[bytes], chunk: int
) -> None:
    tried(f"{engine} frames")
    server = SERVERS[engine]
    caplog.clear()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def feed() -> None:
        conn = GrpcConnection(server)
        transport = Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        wire = PREFACE + b"".join(sent)
        for pos in range(0, len(wire), chunk):  # any split into reads
            conn.data_received(wire[pos:pos + chunk])
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        await asyncio.sleep(0)
        assert server.budget.used == 0  # whatever the calls held is given back

    loop.run_until_complete(feed())
    assert not errors, errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
