"""Triton's keepalive and connection-age flags on the event loop's gRPC server, on both HTTP/2 engines, as a
raw HTTP/2 client sees them: the server's keepalive PINGs and their timeout, the ping abuse policy (GOAWAY
ENHANCE_YOUR_CALM "too_many_pings"), and max connection age (GOAWAY, the running call finishes, then close)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import pytest
from hyperframe.frame import DataFrame, GoAwayFrame, HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from conveyor.ingress.grpc.h2_server.limits import CONNECTION_WINDOW, MAX_FRAME_SIZE, STREAM_WINDOW, Keepalive
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from tests.ingress.grpc.test_h2_protocol import (
    ENHANCE_YOUR_CALM,
    INITIAL_WINDOW_SIZE,
    NO_ERROR,
    PREFACE,
    TIMEOUT_S,
    RawClient,
    message,
    start_slow_call,
)
from tests.support.fake_grpc import FakeDataPlane, FakeLink

LEVEL = "unit"

# The ping policy under test: 2 strikes allowed, every PING within the minute after another one is a strike.
STRICT = [("grpc.http2.min_ping_interval_without_data_ms", 60000), ("grpc.http2.max_ping_strikes", 2),
          ("grpc.keepalive_permit_without_calls", 1)]

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


def ping(client: RawClient) -> None:
    client.send(PingFrame(0, opaque_data=b"12345678"))


async def acks_or_goaway(client: RawClient, acks: int, streams_ended: int = 0) -> GoAwayFrame | None:
    """Read until ``acks`` PING ACKs and ``streams_ended`` trailers came, or a GOAWAY (returned). (The engines
    acknowledge every PING of a read before the connection judges them: a call answered after the PINGs tells
    that the connection lives.)"""
    ended: set[int] = set()
    while acks or len(ended) < streams_ended:
        f = await client.next()
        if isinstance(f, GoAwayFrame):
            return f
        acks -= isinstance(f, PingFrame) and "ACK" in f.flags
        if isinstance(f, HeadersFrame) and "END_STREAM" in f.flags:
            ended.add(f.stream_id)
    return None


def open_call(client: RawClient, stream: int) -> None:
    """A ModelInfer's HEADERS, its message to come."""
    client.send(HeadersFrame(stream, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))


# gRPC core resets the strikes when the server writes headers, a message, trailers or a connection
# WINDOW_UPDATE (chttp2's grpc_chttp2_reset_ping_clock), never for what the client sends.

async def test_calls_the_client_opens_do_not_reset_the_strikes(serve: Serve) -> None:
    served = await serve(STRICT)
    client = await served.connect()
    ping(client)
    for stream in (1, 3, 5):  # calls the server does not answer before the PINGs (held a minute)
        request = pb.ModelInferRequest(model_name="echo")
        request.parameters["delay_ms"].int64_param = 60000
        client.call(stream, "ModelInfer", request.SerializeToString())
        ping(client)  # strikes 1, 2, 3: one too many
    client.call(7, "NoSuchMethod")  # answered at once, unless the connection has ended
    goaway = await acks_or_goaway(client, 4, streams_ended=1)
    assert goaway is not None and (goaway.error_code, goaway.additional_data) == (ENHANCE_YOUR_CALM, b"too_many_pings")


async def test_an_error_only_answer_resets_the_strikes(serve: Serve) -> None:
    served = await serve(STRICT)
    client = await served.connect()
    for stream in (1, 3, 5):
        open_call(client, stream)
    ping(client)
    ping(client)  # a strike
    for stream in (1, 3, 5):
        # A compressed message without grpc-encoding: INTERNAL, trailers-only, written between the PINGs.
        client.send(DataFrame(stream, data=message(b"x", flag=1), flags=["END_STREAM"]))
        ping(client)  # the first since the server wrote: no strike
        ping(client)  # a strike (one, again)
    assert await acks_or_goaway(client, 8, streams_ended=3) is None
    assert len(served.server.connections) == 1


async def test_a_connection_window_update_resets_the_strikes(serve: Serve) -> None:
    served = await serve(STRICT)
    client = await served.connect()
    # Unary calls whose messages never end (the server answers none), each sent its stream's whole window:
    # past half the connection's window the server credits the connection (a WINDOW_UPDATE on stream 0).
    streams = range(1, 2 * (CONNECTION_WINDOW // 2 // STREAM_WINDOW + 1) + 1, 2)
    for stream in streams:
        open_call(client, stream)
    ping(client)
    ping(client)  # a strike
    chunk = b"\0" * MAX_FRAME_SIZE
    for stream in streams:
        wire = (b"\0" + (2 * STREAM_WINDOW).to_bytes(4, "big") + chunk)[:MAX_FRAME_SIZE]  # a message cut short
        client.send(DataFrame(stream, data=wire))
        for _ in range(STREAM_WINDOW // MAX_FRAME_SIZE - 1):
            client.send(DataFrame(stream, data=chunk))
    for _ in range(3):  # the first since the WINDOW_UPDATE, then two strikes: allowed
        ping(client)
    client.call(2 * len(streams) + 1, "NoSuchMethod")  # answered, unless the connection has ended
    assert await acks_or_goaway(client, 5, streams_ended=1) is None
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
