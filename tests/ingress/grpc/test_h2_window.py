"""Receive windows that grow with the link (limits.BDP_PROBE_BYTES): a client uploading one large message
gets more than the starting stream window once the server's BDP probe shows the link holds more; the
windows never grow past the connection's buffer budget, and the budget still ends a call that goes past it.
A raw client (hyperframe) that keeps its own send windows, on both engines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import pytest
from hyperframe.frame import DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame, SettingsFrame, WindowUpdateFrame

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server import limits
from conveyor.ingress.grpc.h2_server.engine import BDP_PING, ENGINES
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from tests.ingress.grpc.test_h2_protocol import INITIAL_WINDOW_SIZE, PREFACE, TIMEOUT_S, RawClient, message
from tests.support.fake_grpc import FakeDataPlane, FakeLink

LEVEL = "unit"


class Uploader:
    """One stream's upload within the windows the server gives (its SETTINGS and WINDOW_UPDATEs), PINGs
    acknowledged only when the test says: a link whose round trip is as long as sending a window takes."""

    def __init__(self, client: RawClient, sid: int) -> None:
        self.client, self.sid = client, sid
        self.stream = client.settings[INITIAL_WINDOW_SIZE]
        self.connection = limits.CONNECTION_WINDOW
        self.advertised = [self.stream]  # every SETTINGS_INITIAL_WINDOW_SIZE the server sent
        self.pings: list[bytes] = []  # the server's PINGs not yet acknowledged
        self.goaway: GoAwayFrame | None = None
        self.trailers: dict[str, str] | None = None

    def send(self, data: bytes, end: bool = False) -> int:
        """As much of ``data`` as the windows allow, in one write; what was sent."""
        size = min(len(data), self.stream, self.connection)
        frames = b""
        for pos in range(0, size, limits.MAX_FRAME_SIZE):
            last = end and size == len(data) and pos + limits.MAX_FRAME_SIZE >= size
            piece = data[pos:min(pos + limits.MAX_FRAME_SIZE, size)]
            frames += bytes(DataFrame(self.sid, data=piece, flags=["END_STREAM"] if last else []).serialize())
        self.client.writer.write(frames)
        self.stream -= size
        self.connection -= size
        return size

    def ack_pings(self) -> None:
        for data in self.pings:
            self.client.send(PingFrame(0, opaque_data=data, flags=["ACK"]))
        self.pings = []

    async def read(self, until: Callable[[], bool]) -> None:
        """Frames, applied to the windows, until ``until()`` or the server's GOAWAY."""
        client = self.client
        while not until() and self.goaway is None:
            head = await asyncio.wait_for(client.reader.readexactly(9), TIMEOUT_S)
            f, length = Frame.parse_frame_header(memoryview(head))
            f.parse_body(memoryview(await asyncio.wait_for(client.reader.readexactly(length), TIMEOUT_S)))
            self.apply(f)

    def apply(self, f: Frame) -> None:
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            if INITIAL_WINDOW_SIZE in f.settings:  # RFC 9113 §6.9.2: open streams' windows change by the difference
                new = f.settings[INITIAL_WINDOW_SIZE]
                self.stream += new - self.advertised[-1]
                self.advertised.append(new)
            self.client.send(SettingsFrame(0, flags=["ACK"]))
        elif isinstance(f, WindowUpdateFrame):
            if f.stream_id == 0:
                self.connection += f.window_increment
            elif f.stream_id == self.sid:
                self.stream += f.window_increment
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            self.pings.append(bytes(f.opaque_data))
        elif isinstance(f, GoAwayFrame):
            self.goaway = f
        elif isinstance(f, HeadersFrame) and "END_STREAM" in f.flags:
            fields = self.client.decoder.decode(f.data, raw=True)
            self.trailers = {k.decode(): v.decode() for k, v in fields}


Serve = Callable[[int], Awaitable[SimpleNamespace]]


@pytest.fixture(params=ENGINES)
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Serve]:
    """The server on each engine, with a connection buffer budget of the test's."""
    servers, writers = [], []

    async def start(connection_budget: int) -> SimpleNamespace:
        ctx = SimpleNamespace(link=FakeLink(), dataplane=FakeDataPlane(), drain=IngressDrain())
        server, port = await start_server(ctx, "127.0.0.1", 0, implementation=request.param,  # type: ignore[arg-type]
                                          buffer_bytes=4 * connection_budget, connection_buffer_bytes=connection_budget)
        servers.append(server)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        writer.write(PREFACE + bytes(SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 1 << 24}).serialize())
                     + bytes(WindowUpdateFrame(0, window_increment=1 << 24).serialize()))
        client = RawClient(reader, writer)
        await asyncio.wait_for(client.server_settings(), TIMEOUT_S)
        writer.write(bytes(SettingsFrame(0, flags=["ACK"]).serialize()))
        return SimpleNamespace(client=client, server=server)

    yield start
    for writer in writers:
        writer.close()
    for server in servers:
        await server.stop(None)


def infer_request(size: int) -> bytes:
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(b"\7" * size)
    return message(request.SerializeToString())


async def test_the_stream_window_grows_for_a_fast_upload(serve: Serve) -> None:
    served = await serve(64 << 20)
    client = served.client
    client.send(HeadersFrame(1, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
    up = Uploader(client, 1)
    wire = infer_request(3 * limits.STREAM_WINDOW)
    # The whole starting window at once; the server's probe goes out after BDP_PROBE_BYTES of it, and its
    # ACK comes behind the rest: the link carried a whole window in one round trip.
    sent = up.send(wire)
    assert sent == limits.STREAM_WINDOW
    await up.read(lambda: bool(up.pings))
    assert up.pings == [BDP_PING]
    up.ack_pings()
    await up.read(lambda: len(up.advertised) > 1)
    assert up.goaway is None
    assert up.advertised[1] >= 2 * limits.STREAM_WINDOW  # twice the sample, at least twice the start
    # More than a fixed window could ever let this stream have open; sent at once, and taken.
    await up.read(lambda: up.stream > limits.STREAM_WINDOW)
    sent += up.send(wire[sent:])
    assert sent > 2 * limits.STREAM_WINDOW
    while sent < len(wire):
        await up.read(lambda: up.stream > 0)
        sent += up.send(wire[sent:], end=True)
    up.ack_pings()
    await up.read(lambda: up.trailers is not None)
    assert up.goaway is None and up.trailers is not None and up.trailers["grpc-status"] == "0"


async def test_the_windows_stay_within_the_connection_budget(serve: Serve) -> None:
    # A client that makes every probe look like a long fat link (it ACKs only once it has sent all it may)
    # with a message that never ends: the windows grow no further than the budget, and the budget ends the call.
    budget = 3 * limits.STREAM_WINDOW
    served = await serve(budget)
    client = served.client
    client.send(HeadersFrame(1, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
    up = Uploader(client, 1)
    # A message as large as the budget allows, then bytes past it (a unary call's second message).
    wire = b"\0" + (budget - 5).to_bytes(4, "big") + b"\1" * (2 * budget)
    (connection,) = served.server.connections
    sent = 0
    for _ in range(20):
        sent += up.send(wire[sent:])
        await up.read(lambda: bool(up.pings) or up.trailers is not None or up.stream > 0)
        up.ack_pings()
        assert connection._budget.used <= budget
        if up.trailers is not None:
            break
    assert up.goaway is None
    assert up.trailers is not None and up.trailers["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert "--grpc-max-connection-buffer-bytes" in up.trailers["grpc-message"]
    assert max(up.advertised) > limits.STREAM_WINDOW  # it grew,
    assert max(up.advertised) <= budget  # within the budget
    assert connection._budget.used == 0  # what the call held was given back
