"""Property-based test of the h2 gRPC server's frame handling: any sequence of
frames after the preface, valid or not, is served or refused (a stream reset,
GOAWAY), and never raises out of the protocol or from a task it started."""

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

from conveyor.ingress.grpc.h2 import frames as f
from conveyor.ingress.grpc.h2.connection import H2Connection
from conveyor.ingress.grpc.h2.server import H2Server
from tests.support.fuzz import bounded, tried

PATHS = ["/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/Echo", "/nope"]


class Transport:
    def __init__(self) -> None:
        self.written = 0
        self.closed = False

    def writelines(self, parts: list[Any]) -> None:
        self.written += sum(len(p) for p in parts)

    def close(self) -> None:
        self.closed = True


async def _live(request: bytes, context: Any) -> bytes:
    return b"\x08\x01"


async def _echo(requests: Any, context: Any) -> Any:
    async for message in requests:
        yield message


SERVER = H2Server({
    PATHS[0]: grpc.unary_unary_rpc_method_handler(_live),
    PATHS[1]: grpc.stream_stream_rpc_method_handler(_echo),
})


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    sid = draw(st.sampled_from([0, 1, 3, 5, 2]))
    kind = draw(st.integers(0, 10))
    flags = draw(st.sampled_from([0, f.END_STREAM, f.END_HEADERS, f.END_STREAM | f.END_HEADERS, f.PADDED,
                                  f.PRIORITY_FLAG | f.END_HEADERS, 0xFF]))
    if kind == f.HEADERS and draw(st.booleans()):
        fields = [(":method", "POST"), (":path", draw(st.sampled_from(PATHS))),
                  ("content-type", draw(st.sampled_from(["application/grpc", "text/plain"]))),
                  ("grpc-timeout", draw(st.sampled_from(["1S", "10m", "bad"])))]
        payload = bytes(hpack.Encoder().encode(fields))
    elif kind == f.DATA and draw(st.booleans()):
        body = draw(st.binary(max_size=32))
        payload = draw(st.sampled_from([b"\0", b"\1"])) + len(body).to_bytes(4, "big") + body
    else:
        payload = draw(st.binary(max_size=24))
    return f.frame(kind, flags, sid, payload)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@bounded(300)
@given(st.lists(frames(), max_size=12), st.integers(1, 64))
def test_any_frames_are_served_or_refused(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture, sent: list[bytes], chunk: int
) -> None:
    tried("h2 frames")
    caplog.clear()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def feed() -> None:
        conn = H2Connection(SERVER)
        transport = Transport()
        conn.connection_made(transport)  # type: ignore[arg-type]
        wire = f.PREFACE + b"".join(sent)
        for pos in range(0, len(wire), chunk):  # any split into reads
            conn.data_received(wire[pos:pos + chunk])
            await asyncio.sleep(0)
        for _ in range(3):
            await asyncio.sleep(0)
        conn.connection_lost(None)
        await asyncio.sleep(0)

    loop.run_until_complete(feed())
    assert not errors, errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
