"""The h2 gRPC server at the HTTP/2 level, with a client written on raw frames
(hyperframe, hpack): what grpc's own clients rarely do (a tiny flow-control window,
CONTINUATION, a message over the size limit, RST_STREAM, PING) and a user still
relies on; and each limit's answer, as the offending client reads it."""

from __future__ import annotations

import asyncio
import socket
import zlib
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2_server import limits
from conveyor.ingress.grpc.h2_server.engine import ENGINES
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from tests.support.fake_grpc import FakeDataPlane, FakeLink

LEVEL = "unit"

SERVICE = "/inference.GRPCInferenceService/"
TIMEOUT_S = 10
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = (
    0, 1, 3, 6, 7, 8, 11)
INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS = 0x4, 0x3


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.settings: dict[int, int] = {}  # the server's, as read

    def send(self, f: Frame) -> None:
        self.writer.write(bytes(f.serialize()))

    def headers_block(self, method: str, *extra: tuple[str, str]) -> bytes:
        return bytes(self.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "test"),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra,
        ]))

    def call(self, stream: int, method: str, body: bytes | None = b"", *extra: tuple[str, str]) -> None:
        """HEADERS, and unless ``body`` is None one message and END_STREAM."""
        self.send(HeadersFrame(stream, data=self.headers_block(method, *extra), flags=["END_HEADERS"]))
        if body is not None:
            wire = message(body)
            size = limits.MAX_FRAME_SIZE  # the server's SETTINGS_MAX_FRAME_SIZE
            for pos in range(0, len(wire), size):
                end = pos + size >= len(wire)
                self.send(DataFrame(stream, data=wire[pos:pos + size], flags=["END_STREAM"] if end else []))

    async def frame(self) -> Frame:
        """The next frame that is not connection housekeeping (the server's SETTINGS are kept)."""
        while True:
            head = await self.reader.readexactly(9)
            f, length = Frame.parse_frame_header(memoryview(head))
            f.parse_body(memoryview(await self.reader.readexactly(length)))
            if isinstance(f, SettingsFrame):
                self.settings.update(f.settings)
            elif not isinstance(f, WindowUpdateFrame):
                return f

    async def server_settings(self) -> None:
        """Read up to the server's SETTINGS (what comes before it is housekeeping: none is sent)."""
        while not self.settings:
            head = await self.reader.readexactly(9)
            f, length = Frame.parse_frame_header(memoryview(head))
            f.parse_body(memoryview(await self.reader.readexactly(length)))
            if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
                self.settings.update(f.settings)

    async def next(self) -> Frame:
        return await asyncio.wait_for(self.frame(), TIMEOUT_S)

    async def until_trailers(self, stream: int) -> tuple[bytes, dict[str, str]]:
        """The DATA and the trailers of ``stream``."""
        data = b""
        while True:
            f = await self.next()
            assert f.stream_id == stream, f
            if isinstance(f, DataFrame):
                data += f.data
            elif isinstance(f, HeadersFrame):
                fields = {k.decode(): v.decode() for k, v in self.decoder.decode(f.data, raw=True)}
                if "END_STREAM" in f.flags:
                    return data, fields

    async def trailers(self, count: int) -> dict[int, dict[str, str]]:
        """The trailers of the next ``count`` streams to end, by stream."""
        out: dict[int, dict[str, str]] = {}
        while len(out) < count:
            f = await self.next()
            if isinstance(f, HeadersFrame):
                fields = {k.decode(): v.decode() for k, v in self.decoder.decode(f.data, raw=True)}
                if "END_STREAM" in f.flags:
                    out[f.stream_id] = fields
        return out

    async def closed(self) -> bool:
        """Whether the server closed the connection (what it sent before is read and dropped)."""
        try:
            while await asyncio.wait_for(self.reader.read(1 << 16), TIMEOUT_S):
                pass
        except ConnectionResetError:  # closed with the client's frames unread
            pass
        return True

    async def until_goaway(self) -> GoAwayFrame:
        while True:
            f = await self.next()
            if isinstance(f, GoAwayFrame):
                return f


def message(body: bytes, flag: int = 0) -> bytes:
    return bytes([flag]) + len(body).to_bytes(4, "big") + body


async def until(check: Callable[[], object], tries: int = 200) -> None:
    """Until ``check()`` is true, for at most ``tries`` hundredths of a second."""
    for _ in range(tries):
        if check():
            return
        await asyncio.sleep(0.01)


async def start_slow_call(served: SimpleNamespace, client: RawClient, stream: int, delay_ms: int) -> None:
    """A ModelInfer on ``stream`` that the fake data plane holds for ``delay_ms``, once it runs."""
    request = pb.ModelInferRequest(model_name="echo")
    request.parameters["delay_ms"].int64_param = delay_ms
    before = len(served.dataplane.calls)
    client.call(stream, "ModelInfer", request.SerializeToString())
    await until(lambda: len(served.dataplane.calls) > before)


@pytest.fixture(params=ENGINES)
async def served(request: pytest.FixtureRequest) -> AsyncIterator[SimpleNamespace]:
    """The server on each HTTP/2 engine (``engine.ENGINES``): every limit and attack holds on both."""
    dataplane = FakeDataPlane()
    ctx = SimpleNamespace(link=FakeLink(), dataplane=dataplane, drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, implementation=request.param,  # type: ignore[arg-type]
                                      buffer_bytes=8 << 20, connection_buffer_bytes=4 << 20)
    clients: list[RawClient] = []

    async def connect(settings: dict[int, int] | None = None, rcvbuf: int | None = None) -> RawClient:
        """A connection whose windows are large unless ``settings`` say otherwise (``rcvbuf``:
        the client socket's receive buffer, set before it connects)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        settings = {INITIAL_WINDOW_SIZE: 1 << 24} if settings is None else settings
        writer.write(PREFACE + bytes(SettingsFrame(0, settings=settings).serialize())
                     + bytes(WindowUpdateFrame(0, window_increment=1 << 24).serialize()))
        client = RawClient(reader, writer)
        # The server's SETTINGS (its windows among them) are read and acknowledged before anything is
        # sent, as a client does: until then its windows are HTTP/2's 65,535 bytes (nghttp2 holds to it).
        await asyncio.wait_for(client.server_settings(), TIMEOUT_S)
        writer.write(bytes(SettingsFrame(0, flags=["ACK"]).serialize()))
        clients.append(client)
        return client

    try:
        yield SimpleNamespace(connect=connect, dataplane=dataplane, server=server, engine=request.param)
    finally:
        for client in clients:
            client.writer.close()
        await server.stop(None)


async def test_the_server_advertises_its_limits(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.send(PingFrame(0, opaque_data=b"12345678"))
    f = await client.next()  # the PING's answer comes after the server's SETTINGS
    assert isinstance(f, PingFrame) and "ACK" in f.flags and f.opaque_data == b"12345678"
    assert client.settings[MAX_CONCURRENT_STREAMS] == limits.MAX_CONCURRENT_STREAMS
    assert client.settings[0x6] == limits.MAX_HEADER_LIST_SIZE  # SETTINGS_MAX_HEADER_LIST_SIZE
    assert client.settings[0x5] == limits.MAX_FRAME_SIZE
    assert client.settings[INITIAL_WINDOW_SIZE] == limits.STREAM_WINDOW


async def test_replies_wait_for_the_clients_flow_control_window(served: SimpleNamespace) -> None:
    client = await served.connect({INITIAL_WINDOW_SIZE: 16})
    client.call(1, "ServerMetadata")
    assert isinstance(await client.next(), HeadersFrame)
    first = await client.next()
    assert isinstance(first, DataFrame) and len(first.data) == 16
    with pytest.raises(asyncio.TimeoutError):  # nothing more until the window opens
        await asyncio.wait_for(client.frame(), 0.3)
    client.send(WindowUpdateFrame(1, window_increment=1 << 20))
    rest, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0"
    body = (first.data + rest)[5:]
    assert "statistics" in pb.ServerMetadataResponse.FromString(body).extensions


async def test_a_header_block_split_over_continuation_frames(served: SimpleNamespace) -> None:
    client = await served.connect()
    block = client.headers_block("ServerLive")
    client.send(HeadersFrame(1, data=block[:3]))
    client.send(ContinuationFrame(1, data=block[3:6]))
    client.send(ContinuationFrame(1, data=block[6:], flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=message(b""), flags=["END_STREAM"]))
    data, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0"
    assert pb.ServerLiveResponse.FromString(data[5:]).live


async def test_a_message_over_the_size_limit_is_resource_exhausted(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.send(HeadersFrame(1, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=b"\0" + (1 << 31).to_bytes(4, "big") + b"x" * 100))
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "8"
    # The connection's buffer (4 MiB here) is the limit: a message larger could never arrive whole.
    assert trailers["grpc-message"] == f"Received message larger than max ({1 << 31} vs. {4 << 20})"
    f = await client.next()
    assert isinstance(f, RstStreamFrame) and (f.stream_id, f.error_code) == (1, NO_ERROR)  # no need to send the rest


async def test_unknown_method_ping_and_reset(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.call(1, "NoSuchMethod", None)
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "12"

    # A call the client resets stops running in the server.
    await start_slow_call(served, client, 3, 5000)
    client.send(RstStreamFrame(3, error_code=CANCEL))
    await until(lambda: served.dataplane.cancelled)
    assert served.dataplane.cancelled == 1


async def test_a_message_split_over_frames_and_reads(served: SimpleNamespace) -> None:
    client = await served.connect()
    raw = bytes(range(256)) * 512  # 128 KiB
    request = pb.ModelInferRequest(model_name="echo", raw_input_contents=[raw])
    request.inputs.add(name="x", datatype="FP32", shape=[len(raw) // 4])
    body = message(request.SerializeToString())
    client.send(HeadersFrame(1, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=body[:3]))  # the length prefix cut in two
    rest = body[3:]
    frames = b"".join(bytes(DataFrame(1, data=rest[i:i + 16384]).serialize()) for i in range(0, len(rest), 16384))
    frames += bytes(DataFrame(1, data=b"", flags=["END_STREAM"]).serialize())
    for piece in (frames[:5], frames[5:1000], frames[1000:70_000], frames[70_000:]):  # frames cut across reads
        client.writer.write(piece)
        await client.writer.drain()
        await asyncio.sleep(0.02)
    data, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0", trailers
    assert pb.ModelInferResponse.FromString(data[5:]).raw_output_contents == [raw]


async def test_a_compressed_message_is_inflated_within_the_limit(served: SimpleNamespace) -> None:
    client = await served.connect()
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    live = deflate.compress(b"") + deflate.flush()  # ServerLiveRequest is empty
    client.send(HeadersFrame(1, data=client.headers_block("ServerLive", ("grpc-encoding", "gzip")),
                             flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=message(live, flag=1), flags=["END_STREAM"]))
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0", trailers
    # A gzip bomb and a deflate one: 8 KiB that would inflate past the connection's 4 MiB stop there,
    # with gRPC's status and words for it.
    for sid, wbits, coding in ((3, 31, "gzip"), (5, 15, "deflate")):
        bomb = zlib.compressobj(9, zlib.DEFLATED, wbits)
        packed = bomb.compress(b"\0" * (8 << 20)) + bomb.flush()
        client.send(HeadersFrame(sid, data=client.headers_block("ModelInfer", ("grpc-encoding", coding)),
                                 flags=["END_HEADERS"]))
        client.send(DataFrame(sid, data=message(packed, flag=1), flags=["END_STREAM"]))
        _, trailers = await client.until_trailers(sid)
        assert (trailers["grpc-status"], trailers["grpc-message"]) == ("8", "Decompressed message larger than max")
    # What the bombs held is given back: a message of 3 MiB, 3 KiB compressed, inflates in many
    # steps within the same connection's 4 MiB and is served.
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="X", datatype="UINT8", shape=[3 << 20])
    request.raw_input_contents.append(bytes(3 << 20))
    packed = zlib.compress(request.SerializeToString(), 9)
    client.send(HeadersFrame(7, data=client.headers_block("ModelInfer", ("grpc-encoding", "deflate")),
                             flags=["END_HEADERS"]))
    client.send(DataFrame(7, data=message(packed, flag=1), flags=["END_STREAM"]))
    _, trailers = await client.until_trailers(7)
    assert trailers["grpc-status"] == "0", trailers
    assert bytes(served.dataplane.calls[-1].inputs[0].data) == bytes(3 << 20)
    # Corrupt and truncated streams are the server's INTERNAL, as grpc's.
    for sid, packed in ((9, b"not gzip at all"), (11, zlib.compress(b"x" * 100, wbits=31)[:-4])):
        client.send(HeadersFrame(sid, data=client.headers_block("ServerLive", ("grpc-encoding", "gzip")),
                                 flags=["END_HEADERS"]))
        client.send(DataFrame(sid, data=message(packed, flag=1), flags=["END_STREAM"]))
        _, trailers = await client.until_trailers(sid)
        assert trailers["grpc-status"] == "13", trailers
        assert trailers["grpc-message"].startswith("cannot decompress the message")
    await until(lambda: served.server.budget.used == 0)
    assert served.server.budget.used == 0


async def test_a_request_that_is_not_grpc_gets_http_415(served: SimpleNamespace) -> None:
    client = await served.connect()
    block = bytes(client.encoder.encode([
        (":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ServerLive"), (":authority", "test"),
        ("content-type", "application/json"),
    ]))
    client.send(HeadersFrame(1, data=block, flags=["END_HEADERS", "END_STREAM"]))
    f = await client.next()
    assert isinstance(f, HeadersFrame) and f.stream_id == 1 and "END_STREAM" in f.flags
    assert dict(client.decoder.decode(f.data)) == {":status": "415"}
    # The connection still serves gRPC.
    client.call(3, "ServerLive")
    _, trailers = await client.until_trailers(3)
    assert trailers["grpc-status"] == "0"


async def test_a_graceful_stop_sends_goaway_and_lets_running_calls_finish(served: SimpleNamespace) -> None:
    client = await served.connect()
    await start_slow_call(served, client, 1, 300)
    stopping = asyncio.create_task(served.server.stop(10))
    f = await client.next()
    assert isinstance(f, GoAwayFrame) and (f.last_stream_id, f.error_code) == (1, NO_ERROR)
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0" and served.dataplane.cancelled == 0
    await asyncio.wait_for(stopping, TIMEOUT_S)


# --- each limit, as the offending client sees it ---------------------------------------------------

async def test_streams_past_the_concurrency_limit_are_refused(served: SimpleNamespace) -> None:
    client = await served.connect()
    n = limits.MAX_CONCURRENT_STREAMS
    for i in range(n + 3):  # ModelStreamInfer calls that never send a message
        client.send(HeadersFrame(2 * i + 1, data=client.headers_block("ModelStreamInfer"), flags=["END_HEADERS"]))
    if served.engine == "ngh2":
        # nghttp2 treats streams past a limit the client has acknowledged as a connection error
        # (RFC 9113 §5.1.2 allows only a stream error; gRPC clients keep to the limit).
        goaway = await client.until_goaway()
        assert (goaway.error_code, goaway.last_stream_id) == (PROTOCOL_ERROR, 2 * n - 1)
        assert await client.closed()
        client = await served.connect()
        client.call(1, "ServerLive")
        _, trailers = await client.until_trailers(1)
        assert trailers["grpc-status"] == "0"
        return
    refused: list[tuple[int, int]] = []
    while len(refused) < 3:
        f = await client.next()
        assert isinstance(f, RstStreamFrame), f
        refused.append((f.stream_id, f.error_code))
    assert refused == [(2 * i + 1, REFUSED_STREAM) for i in range(n, n + 3)]
    # Once one ends, a new one is served.
    client.send(RstStreamFrame(1, error_code=CANCEL))
    client.call(2 * n + 7, "ServerLive")
    _, trailers = await client.until_trailers(2 * n + 7)
    assert trailers["grpc-status"] == "0"


async def test_rapid_reset_ends_in_enhance_your_calm(served: SimpleNamespace) -> None:
    client = await served.connect()
    for i in range(limits.RESET_BURST + 50):
        sid = 2 * i + 1
        client.send(HeadersFrame(sid, data=client.headers_block("ModelStreamInfer"), flags=["END_HEADERS"]))
        client.send(RstStreamFrame(sid, error_code=CANCEL))
    goaway = await client.until_goaway()
    assert goaway.error_code == ENHANCE_YOUR_CALM
    assert goaway.last_stream_id < 2 * (limits.RESET_BURST + 50)
    assert await client.closed()


async def test_continuation_frames_past_the_cap_end_the_connection(served: SimpleNamespace) -> None:
    client = await served.connect()
    block = client.headers_block("ModelInfer")
    client.send(HeadersFrame(1, data=block[:4]))
    for _ in range(limits.MAX_CONTINUATION_FRAMES + 1):
        client.send(ContinuationFrame(1, data=b""))
    goaway = await client.until_goaway()
    # h2 calls it a protocol error; nghttp2 a flood (CVE-2024-28182), and the GOAWAY is the server's own.
    assert goaway.error_code == {"h2": PROTOCOL_ERROR, "ngh2": ENHANCE_YOUR_CALM}[served.engine]
    assert await client.closed()


async def test_a_frame_over_the_advertised_size_ends_the_connection(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.send(HeadersFrame(1, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
    client.send(DataFrame(1, data=b"\0" * (limits.MAX_FRAME_SIZE + 1)))
    goaway = await client.until_goaway()
    assert goaway.error_code == FRAME_SIZE_ERROR
    assert await client.closed()


def send_padded_headers(client: RawClient, stream: int, size: int) -> None:
    """A ServerLive call whose header list is over ``size`` bytes (HEADERS and CONTINUATION), and its message."""
    pad = [(f"x-pad-{i}", "v" * 1000) for i in range(size // 1000 + 2)]
    block = client.headers_block("ServerLive", *pad)
    pieces = [block[i:i + limits.MAX_FRAME_SIZE] for i in range(0, len(block), limits.MAX_FRAME_SIZE)]
    client.send(HeadersFrame(stream, data=pieces[0]))
    for i, piece in enumerate(pieces[1:], 1):
        client.send(ContinuationFrame(stream, data=piece, flags=["END_HEADERS"] if i == len(pieces) - 1 else []))
    client.send(DataFrame(stream, data=message(b""), flags=["END_STREAM"]))


async def test_a_header_list_over_the_limit_ends_the_connection(served: SimpleNamespace) -> None:
    client = await served.connect()
    send_padded_headers(client, 1, limits.MAX_HEADER_LIST_SIZE)
    if served.engine == "ngh2":
        # The call over the limit gets its own error (as from gRPC core); the connection goes on.
        _, trailers = await client.until_trailers(1)
        assert trailers["grpc-status"] == "8"
        assert trailers["grpc-message"].startswith("received metadata size exceeds hard limit (")
        client.call(3, "ServerLive")
        _, trailers = await client.until_trailers(3)
        assert trailers["grpc-status"] == "0"
        # Past nghttp2's own limit (twice that), the connection ends.
        send_padded_headers(client, 5, limits.NGH2_HEADER_LIST_SIZE)
    goaway = await client.until_goaway()
    assert goaway.error_code == ENHANCE_YOUR_CALM


async def test_data_past_the_window_is_a_flow_control_error(served: SimpleNamespace) -> None:
    # The client gives the server no window to answer in: the stream's replies wait, its
    # handler stops taking requests, and the server stops crediting the stream.
    client = await served.connect({INITIAL_WINDOW_SIZE: 0})
    client.send(HeadersFrame(1, data=client.headers_block("ModelStreamInfer"), flags=["END_HEADERS"]))
    one = bytes(DataFrame(1, data=message(b"\xff" * 64)).serialize())  # each one an in-band error reply
    goaway = asyncio.create_task(client.until_goaway())  # read as the frames come: the server closes at once
    sent = 0
    while sent < limits.STREAM_WINDOW * 64:
        try:
            client.writer.write(one * 256)
            await asyncio.wait_for(client.writer.drain(), 1)
        except (OSError, asyncio.TimeoutError):  # closed (or no longer read): the GOAWAY is in
            break
        sent += 256 * 69
        if goaway.done():
            break
        await asyncio.sleep(0)
    assert (await goaway).error_code == FLOW_CONTROL_ERROR


async def test_messages_past_the_buffer_budgets_are_resource_exhausted(served: SimpleNamespace) -> None:
    def unfinished(client: RawClient, count: int) -> None:
        """``count`` ModelInfer calls that each declare 3 MiB and send 1 MiB of it."""
        for i in range(count):
            sid = 2 * i + 1
            client.send(HeadersFrame(sid, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
            client.send(DataFrame(sid, data=b"\0" + (3 << 20).to_bytes(4, "big")))
            for _ in range(64):
                client.send(DataFrame(sid, data=b"\1" * 16384))

    # The connection's 4 MiB hold three of them; the fourth and fifth go past it.
    client = await served.connect()
    unfinished(client, 5)
    ended = await client.trailers(2)
    assert sorted(ended) == [7, 9]
    assert {t["grpc-status"] for t in ended.values()} == {"8"}
    assert "--grpc-max-connection-buffer-bytes" in ended[7]["grpc-message"]
    assert served.server.budget.used == 3 * ((1 << 20) + 5)
    # The process's 8 MiB hold seven: three more on a second connection, one on a third.
    second = await served.connect()
    unfinished(second, 3)
    third = await served.connect()
    await until(lambda: served.server.budget.used == 6 * ((1 << 20) + 5))
    unfinished(third, 2)
    ended = await third.trailers(1)
    assert list(ended) == [3] and ended[3]["grpc-status"] == "8"
    assert "--grpc-max-buffer-bytes" in ended[3]["grpc-message"]
    assert served.server.budget.used == 7 * ((1 << 20) + 5)
    # A connection that closes gives back what its calls held.
    for c in (client, second, third):
        c.writer.close()
    await until(lambda: served.server.budget.used == 0)
    assert served.server.budget.used == 0


async def test_a_message_grows_with_its_bytes_not_its_declared_length(served: SimpleNamespace) -> None:
    client = await served.connect()
    for i in range(50):  # each declares 3 MiB (under the connection's 4) and sends 5 bytes
        sid = 2 * i + 1
        client.send(HeadersFrame(sid, data=client.headers_block("ModelInfer"), flags=["END_HEADERS"]))
        client.send(DataFrame(sid, data=b"\0" + (3 << 20).to_bytes(4, "big") + b"12345"))
    client.call(101, "ServerLive")
    _, trailers = await client.until_trailers(101)
    assert trailers["grpc-status"] == "0"
    assert served.server.budget.used == 50 * 10  # the bytes that came, not 50 x 3 MiB


async def test_ping_and_settings_floods_end_in_enhance_your_calm(served: SimpleNamespace) -> None:
    for flood in (PingFrame(0, opaque_data=b"12345678"), SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 1 << 20})):
        client = await served.connect()
        goaway = asyncio.create_task(client.until_goaway())
        client.writer.write(bytes(flood.serialize()) * (limits.INDUCED_BURST + 100))
        assert (await goaway).error_code == ENHANCE_YOUR_CALM
        assert await client.closed()


async def test_a_peer_that_does_not_read_is_paused(served: SimpleNamespace) -> None:
    client = await served.connect(rcvbuf=4096)
    raw = b"\1" * (256 << 10)
    request = pb.ModelInferRequest(model_name="echo", raw_input_contents=[raw])
    request.inputs.add(name="x", datatype="FP32", shape=[len(raw) // 4])
    body = request.SerializeToString()
    stalled = False
    for i in range(200):  # 50 MiB of answers at most if nothing pushed back
        client.call(2 * i + 1, "ModelInfer", body)
        try:
            await asyncio.wait_for(client.writer.drain(), 1)
        except asyncio.TimeoutError:
            stalled = True  # the server stopped reading: its answers are not read
            break
    assert stalled
    connection = next(iter(served.server.connections))
    transport = connection._transport
    assert transport is not None and not transport.is_reading()
    # What was read before the pause is answered; nothing more is taken in.
    assert transport.get_write_buffer_size() < limits.WRITE_BUFFER_HIGH + (4 << 20)
