"""The h2 gRPC server at the HTTP/2 level, with a client written on raw frames:
what grpc's own clients rarely do (a tiny flow-control window, CONTINUATION,
a message over the size limit, RST_STREAM, PING) and a user still relies on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace

import hpack
import pytest

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc.h2 import frames as f
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from tests.support.fake_grpc import FakeDataPlane, FakeLink

SERVICE = "/inference.GRPCInferenceService/"
TIMEOUT_S = 10


class RawClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.writer.write(f.frame(kind, flags, stream, payload))

    def headers_block(self, method: str) -> bytes:
        return bytes(self.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", "test"),
            ("content-type", "application/grpc"), ("te", "trailers"),
        ]))

    async def frame(self) -> tuple[int, int, int, bytes]:
        """The next frame that is not connection housekeeping."""
        while True:
            hi, lo, kind, flags, stream = f.HEAD.unpack(await self.reader.readexactly(9))
            payload = await self.reader.readexactly(hi << 8 | lo)
            if kind not in (f.SETTINGS, f.WINDOW_UPDATE):
                return kind, flags, stream, payload

    async def until_trailers(self, stream: int) -> tuple[bytes, dict[str, str]]:
        """The DATA and the trailers of ``stream``."""
        data = b""
        while True:
            kind, flags, sid, payload = await asyncio.wait_for(self.frame(), TIMEOUT_S)
            assert sid == stream, (kind, sid)
            if kind == f.DATA:
                data += payload
            elif kind == f.HEADERS:
                fields = {k.decode(): v.decode() for k, v in self.decoder.decode(payload, raw=True)}
                if flags & f.END_STREAM:
                    return data, fields


def message(body: bytes) -> bytes:
    return b"\0" + len(body).to_bytes(4, "big") + body


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
    client.send(f.HEADERS, f.END_HEADERS, stream, client.headers_block("ModelInfer"))
    client.send(f.DATA, f.END_STREAM, stream, message(request.SerializeToString()))
    await until(lambda: served.dataplane.calls)


@pytest.fixture
async def served() -> AsyncIterator[SimpleNamespace]:
    dataplane = FakeDataPlane()
    ctx = SimpleNamespace(link=FakeLink(), dataplane=dataplane, drain=IngressDrain())
    server, port = await start_server(ctx, "127.0.0.1", 0, implementation="h2")  # type: ignore[arg-type]
    clients: list[RawClient] = []

    async def connect(settings: dict[int, int] | None = None) -> RawClient:
        """A connection whose windows are large unless ``settings`` say otherwise."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        settings = {f.INITIAL_WINDOW_SIZE: 1 << 24} if settings is None else settings
        writer.write(f.PREFACE + f.settings(settings) + f.window_update(0, 1 << 24))
        clients.append(RawClient(reader, writer))
        return clients[-1]

    try:
        yield SimpleNamespace(connect=connect, dataplane=dataplane, server=server)
    finally:
        for client in clients:
            client.writer.close()
        await server.stop(None)


async def test_replies_wait_for_the_clients_flow_control_window(served: SimpleNamespace) -> None:
    client = await served.connect({f.INITIAL_WINDOW_SIZE: 16})
    client.send(f.HEADERS, f.END_HEADERS, 1, client.headers_block("ServerMetadata"))
    client.send(f.DATA, f.END_STREAM, 1, message(b""))
    kind, _, _, _ = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert kind == f.HEADERS
    kind, _, _, first = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert kind == f.DATA and len(first) == 16
    with pytest.raises(asyncio.TimeoutError):  # nothing more until the window opens
        await asyncio.wait_for(client.frame(), 0.3)
    client.send(f.WINDOW_UPDATE, 0, 1, f.U32.pack(1 << 20))
    rest, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0"
    body = (first + rest)[5:]
    assert "statistics" in pb.ServerMetadataResponse.FromString(body).extensions


async def test_a_header_block_split_over_continuation_frames(served: SimpleNamespace) -> None:
    client = await served.connect()
    block = client.headers_block("ServerLive")
    client.send(f.HEADERS, 0, 1, block[:3])
    client.send(f.CONTINUATION, 0, 1, block[3:6])
    client.send(f.CONTINUATION, f.END_HEADERS, 1, block[6:])
    client.send(f.DATA, f.END_STREAM, 1, message(b""))
    data, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0"
    assert pb.ServerLiveResponse.FromString(data[5:]).live


async def test_a_message_over_the_size_limit_is_resource_exhausted(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.send(f.HEADERS, f.END_HEADERS, 1, client.headers_block("ModelInfer"))
    client.send(f.DATA, 0, 1, b"\0" + (1 << 31).to_bytes(4, "big") + b"x" * 100)
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "8"
    assert trailers["grpc-message"] == "Received message larger than max (2147483648 vs. 2147483647)"
    kind, _, sid, payload = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert (kind, sid, payload) == (f.RST_STREAM, 1, f.U32.pack(f.NO_ERROR))  # no need to send the rest


async def test_unknown_method_ping_and_reset(served: SimpleNamespace) -> None:
    client = await served.connect()
    client.send(f.PING, 0, 0, b"12345678")
    kind, flags, _, payload = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert (kind, flags, payload) == (f.PING, f.ACK, b"12345678")

    client.send(f.HEADERS, f.END_HEADERS, 1, client.headers_block("NoSuchMethod"))
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "12"

    # A call the client resets stops running in the server.
    await start_slow_call(served, client, 3, 5000)
    client.send(f.RST_STREAM, 0, 3, f.U32.pack(f.CANCEL))
    await until(lambda: served.dataplane.cancelled)
    assert served.dataplane.cancelled == 1


async def test_a_message_split_over_frames_and_reads(served: SimpleNamespace) -> None:
    client = await served.connect()
    raw = bytes(range(256)) * 512  # 128 KiB
    request = pb.ModelInferRequest(model_name="echo", raw_input_contents=[raw])
    request.inputs.add(name="x", datatype="FP32", shape=[len(raw) // 4])
    body = message(request.SerializeToString())
    client.send(f.HEADERS, f.END_HEADERS, 1, client.headers_block("ModelInfer"))
    client.send(f.DATA, 0, 1, body[:3])  # the length prefix cut in two
    frame = f.frame(f.DATA, f.END_STREAM, 1, body[3:])
    for piece in (frame[:5], frame[5:1000], frame[1000:70_000], frame[70_000:]):  # one frame, several reads
        client.writer.write(piece)
        await client.writer.drain()
        await asyncio.sleep(0.02)
    data, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0", trailers
    assert pb.ModelInferResponse.FromString(data[5:]).raw_output_contents == [raw]


async def test_a_request_that_is_not_grpc_gets_http_415(served: SimpleNamespace) -> None:
    client = await served.connect()
    block = bytes(client.encoder.encode([
        (":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ServerLive"), (":authority", "test"),
        ("content-type", "application/json"),
    ]))
    client.send(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, block)
    kind, flags, sid, payload = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert (kind, sid) == (f.HEADERS, 1) and flags & f.END_STREAM
    assert dict(client.decoder.decode(payload)) == {":status": "415"}
    # The connection still serves gRPC.
    client.send(f.HEADERS, f.END_HEADERS, 3, client.headers_block("ServerLive"))
    client.send(f.DATA, f.END_STREAM, 3, message(b""))
    _, trailers = await client.until_trailers(3)
    assert trailers["grpc-status"] == "0"


async def test_a_graceful_stop_sends_goaway_and_lets_running_calls_finish(served: SimpleNamespace) -> None:
    client = await served.connect()
    await start_slow_call(served, client, 1, 300)
    stopping = asyncio.create_task(served.server.stop(10))
    kind, _, _, payload = await asyncio.wait_for(client.frame(), TIMEOUT_S)
    assert kind == f.GOAWAY and f.GOAWAY_BODY.unpack(payload[:8]) == (1, f.NO_ERROR)
    _, trailers = await client.until_trailers(1)
    assert trailers["grpc-status"] == "0" and served.dataplane.cancelled == 0
    await asyncio.wait_for(stopping, TIMEOUT_S)
