"""Triton's keepalive and connection-age flags on the event loop's gRPC server, on both HTTP/2 engines, as a
raw HTTP/2 client sees them: the server's keepalive PINGs and their timeout, the ping abuse policy (GOAWAY
ENHANCE_YOUR_CALM "too_many_pings"), and max connection age (GOAWAY, the running call finishes, then close)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import pytest
from hyperframe.frame import GoAwayFrame, PingFrame, SettingsFrame, WindowUpdateFrame

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from conveyor.ingress.grpc.h2_server.limits import Keepalive
from conveyor.ingress.grpc.server import start_server
from tests.ingress.grpc.test_h2_protocol import (
    ENHANCE_YOUR_CALM,
    INITIAL_WINDOW_SIZE,
    NO_ERROR,
    PREFACE,
    TIMEOUT_S,
    RawClient,
    start_slow_call,
)
from tests.support.fake_grpc import FakeDataPlane, FakeLink

Serve = Callable[[list[tuple[str, int]]], Awaitable[SimpleNamespace]]


@pytest.fixture(params=ENGINES)
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Serve]:
    """Start the server on each engine with these grpc options (the flags' channel arguments)."""
    servers: list[object] = []
    clients: list[RawClient] = []

    async def start(options: list[tuple[str, int]]) -> SimpleNamespace:
        dataplane = FakeDataPlane()
        ctx = SimpleNamespace(link=FakeLink(), dataplane=dataplane, drain=IngressDrain())
        server, port = await start_server(ctx, "127.0.0.1", 0,  # type: ignore[arg-type]
                                          implementation=request.param, options=options)
        servers.append(server)

        async def connect() -> RawClient:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(PREFACE + bytes(SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 1 << 24}).serialize())
                         + bytes(WindowUpdateFrame(0, window_increment=1 << 24).serialize()))
            client = RawClient(reader, writer)
            await asyncio.wait_for(client.server_settings(), TIMEOUT_S)
            writer.write(bytes(SettingsFrame(0, flags=["ACK"]).serialize()))
            clients.append(client)
            return client

        return SimpleNamespace(connect=connect, dataplane=dataplane, server=server)

    try:
        yield start
    finally:
        for client in clients:
            client.writer.close()
        for server in servers:
            await server.stop(None)  # type: ignore[attr-defined]


async def next_ping(client: RawClient) -> PingFrame:
    while True:
        f = await client.next()
        if isinstance(f, PingFrame) and "ACK" not in f.flags:
            return f


async def test_the_server_pings_and_closes_a_connection_that_does_not_answer(serve: Serve) -> None:
    served = await serve([("grpc.keepalive_time_ms", 200), ("grpc.keepalive_timeout_ms", 200),
                          ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)])
    client = await served.connect()
    ping = await next_ping(client)  # after keepalive_time
    client.send(PingFrame(0, opaque_data=ping.opaque_data, flags=["ACK"]))
    await next_ping(client)  # answered: the connection stays, and is pinged again
    assert len(served.server.connections) == 1
    # Not answered: closed after keepalive_timeout.
    assert await client.closed()


async def test_without_calls_or_permission_the_server_does_not_ping(serve: Serve) -> None:
    served = await serve([("grpc.keepalive_time_ms", 100), ("grpc.keepalive_timeout_ms", 100)])
    client = await served.connect()
    await asyncio.sleep(0.5)  # several keepalive times
    client.send(PingFrame(0, opaque_data=b"probe..."))
    f = await client.next()  # the first frame after the server's SETTINGS ACK is our PING's ACK, none of its own
    while isinstance(f, SettingsFrame):
        f = await client.next()
    assert isinstance(f, PingFrame) and "ACK" in f.flags and f.opaque_data == b"probe..."
    assert len(served.server.connections) == 1


async def test_a_client_pinging_too_often_gets_enhance_your_calm(serve: Serve) -> None:
    served = await serve([("grpc.http2.min_ping_interval_without_data_ms", 60000),
                          ("grpc.http2.max_ping_strikes", 2), ("grpc.keepalive_permit_without_calls", 1)])
    client = await served.connect()
    for _ in range(4):  # the first is allowed, the next two are strikes, the fourth is one too many
        client.send(PingFrame(0, opaque_data=b"12345678"))
    goaway = await client.until_goaway()
    assert (goaway.error_code, goaway.additional_data) == (ENHANCE_YOUR_CALM, b"too_many_pings")
    assert await client.closed()


async def test_pings_within_the_strikes_keep_the_connection(serve: Serve) -> None:
    served = await serve([("grpc.http2.min_ping_interval_without_data_ms", 60000),
                          ("grpc.http2.max_ping_strikes", 2), ("grpc.keepalive_permit_without_calls", 1)])
    client = await served.connect()
    for _ in range(3):
        client.send(PingFrame(0, opaque_data=b"12345678"))
    acks = 0
    while acks < 3:
        f = await client.next()
        assert not isinstance(f, GoAwayFrame)
        acks += isinstance(f, PingFrame) and "ACK" in f.flags
    assert len(served.server.connections) == 1


async def test_max_connection_age_sends_goaway_and_the_running_call_finishes(serve: Serve) -> None:
    served = await serve([("grpc.max_connection_age_ms", 200), ("grpc.max_connection_age_grace_ms", 5000)])
    client = await served.connect()
    await start_slow_call(served, client, 1, 600)
    goaway = await client.until_goaway()  # after the age (200 ms +-10%), while the call runs
    assert (goaway.last_stream_id, goaway.error_code) == (1, NO_ERROR)
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0" and served.dataplane.cancelled == 0
    assert await client.closed()  # once the call is done


async def test_past_the_grace_the_connection_is_closed_and_its_call_cancelled(serve: Serve) -> None:
    served = await serve([("grpc.max_connection_age_ms", 200), ("grpc.max_connection_age_grace_ms", 200)])
    client = await served.connect()
    await start_slow_call(served, client, 1, 60000)
    goaway = await client.until_goaway()
    assert goaway.error_code == NO_ERROR
    assert await client.closed()  # after the grace, well before the call's minute
    assert served.dataplane.cancelled == 1


def test_options_map_onto_the_keepalive_settings() -> None:
    k = Keepalive.from_options([("grpc.keepalive_time_ms", 1000), ("grpc.max_connection_age_ms", 30000),
                                ("grpc.http2.max_ping_strikes", 0), ("grpc.max_pending_requests", 5)])
    assert (k.time_s, k.max_age_s, k.max_ping_strikes, k.max_age_grace_s) == (1.0, 30.0, 0, None)
    assert Keepalive.from_options([]) == Keepalive()
