"""What the server sends on one connection, through its HTTP/2 engine: each call's answer
(headers, messages, trailers; trailers-only when a call fails before its first message),
kept within the client's flow-control windows (so the engine queues no more than they allow),
and the engine's output written once per loop turn
(one ``transport.write``, as ``ingress/http/corked_transport.py``)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from conveyor.ingress.grpc.h2_server.engine import NO_ERROR, Engine
from conveyor.ingress.grpc.h2_server.metadata import RESPONSE_HEAD, Headers, trailers
from conveyor.ingress.grpc.h2_server.stream import Stream

OK = 0
# A message up to this size is joined to its 5-byte prefix (copied) rather than sent as two pieces.
JOIN_BYTES = 1 << 16
# A streaming call's replies waiting for the client past this make its writer wait.
STREAM_BACKLOG_BYTES = 1 << 20


class Outbound:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop, closed: Callable[[Stream], None]) -> None:
        self._engine = engine
        self._loop = loop
        self._closed = closed  # told when a stream's answer is complete
        self.transport: asyncio.Transport | None = None
        self.blocked: dict[int, Stream] = {}  # streams waiting for the client's window, by id
        self._flush_pending = False
        self.paused: asyncio.Future[None] | None = None  # the transport's buffer is full
        self._collected = b""  # the engine's output taken by collect(), written first at the next flush
        self.extra = b""  # bytes the engine does not know of, written after its own (a graceful GOAWAY)
        # Headers, a message or trailers were written since the connection last looked (its ping policies).
        self.data_sent = False

    # --- the write buffer ---------------------------------------------------------------

    def soon(self) -> None:
        """Flush at the end of this loop turn: what calls answer in one turn leaves in one write."""
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self.flush)

    def collect(self) -> None:
        """Take what the engine queued now (it may end the connection only as its GOAWAY is taken: ``alive``), to be
        written at the end of this loop turn with what the calls answer meanwhile: one write, not two."""
        data = self._engine.data_to_send()
        if data:
            self._collected += data
        self.soon()

    def flush(self) -> None:
        self._flush_pending = False
        data = self._engine.data_to_send()
        if self._collected:
            data, self._collected = self._collected + data, b""
        if self.extra:
            data, self.extra = data + self.extra, b""
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def pause(self) -> None:
        if self.paused is None or self.paused.done():
            self.paused = self._loop.create_future()

    def resume(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    # --- flow control ------------------------------------------------------------------

    def window_opened(self, stream_id: int) -> None:
        """The client's WINDOW_UPDATE (``stream_id`` 0: the connection's) or a larger
        SETTINGS_INITIAL_WINDOW_SIZE (-1: every stream's)."""
        if stream_id > 0:
            stream = self.blocked.pop(stream_id, None)
            if stream is not None:
                self.pump(stream)
            return
        blocked, self.blocked = self.blocked, {}
        for stream in blocked.values():
            self.pump(stream)

    def forget(self, stream: Stream) -> None:
        self.blocked.pop(stream.id, None)

    async def drained(self, stream: Stream) -> None:
        """Wait while a streaming call has too much queued for the client."""
        if stream.backlog_bytes > STREAM_BACKLOG_BYTES and not stream.local_closed:
            stream.drained = self._loop.create_future()
            await stream.drained
        if self.paused is not None and not self.paused.done():
            await self.paused

    def must_wait(self, stream: Stream) -> bool:
        return stream.backlog_bytes > STREAM_BACKLOG_BYTES or (self.paused is not None and not self.paused.done())

    # --- answers ---------------------------------------------------------------------------

    def reply(self, stream: Stream, body: bytes) -> None:
        """A unary call's whole answer: headers, the message, trailers."""
        if stream.local_closed:
            return
        size = len(body) + 5
        engine = self._engine
        sid = stream.id
        self.data_sent = True
        try:
            if size <= JOIN_BYTES and engine.answer(sid, b"\0" + (size - 5).to_bytes(4, "big") + body):
                self.soon()
                self.closed_locally(stream)
                return
        except engine.gone:  # the stream ended in the engine, its event not handled yet: the answer is dropped
            self.closed_locally(stream)
            return
        self.send_message(stream, body)
        self.finish(stream, OK, "")

    def send_message(self, stream: Stream, body: bytes) -> None:
        if stream.local_closed:
            return
        if not stream.headers_sent:
            stream.headers_sent = True
            self._engine.respond(stream.id, RESPONSE_HEAD)
        prefix = b"\0" + len(body).to_bytes(4, "big")
        self.data_sent = True
        backlog = stream.backlog
        if backlog is None:
            backlog = stream.backlog = deque()
        if len(body) <= JOIN_BYTES:  # one piece, so that it leaves in one frame
            backlog.append(memoryview(prefix + body))
        else:  # large: not copied here
            backlog.append(memoryview(prefix))
            backlog.append(memoryview(body))
        stream.backlog_bytes += len(body) + 5
        self.pump(stream)

    def pump(self, stream: Stream) -> None:
        """Send what the windows allow of the stream's backlog, then its trailers."""
        if stream.local_closed:
            return
        engine = self._engine
        sid = stream.id
        backlog = stream.backlog
        if backlog is None:  # nothing was ever queued (send_message makes it)
            return
        try:
            while backlog:
                allowed = engine.window(sid)
                if allowed <= 0:
                    self.blocked[sid] = stream
                    break
                chunk = backlog[0]
                if len(chunk) <= allowed:
                    backlog.popleft()
                else:
                    backlog[0] = chunk[allowed:]
                    chunk = chunk[:allowed]
                stream.backlog_bytes -= len(chunk)
                engine.send(sid, chunk)
        except engine.gone:  # the stream ended in the engine, its event not handled yet: the answer is dropped
            backlog.clear()
            stream.backlog_bytes = 0
            self.closed_locally(stream)
            return
        self.soon()
        if backlog:
            return
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)
        if stream.trailer is not None:
            block, stream.trailer = stream.trailer, None
            engine.trailers(sid, block)
            self.data_sent = True
            self.closed_locally(stream)

    def finish(self, stream: Stream, code: int, message: str) -> None:
        """End the call with its status (trailers-only when nothing was sent yet)."""
        if stream.local_closed or stream.trailer is not None:
            return
        block = trailers(code, message)
        if not stream.headers_sent:
            stream.headers_sent = self.data_sent = True
            self._engine.respond(stream.id, RESPONSE_HEAD + block, end_stream=True)
            self.soon()
            self.closed_locally(stream)
        elif stream.backlog:
            stream.trailer = block  # written by pump, after the backlog
        else:
            self._engine.trailers(stream.id, block)
            self.data_sent = True
            self.soon()
            self.closed_locally(stream)

    def reject(self, stream_id: int, head: Headers, end_stream: bool) -> None:
        """Answer a stream that never became a call (HTTP 415)."""
        self.data_sent = True
        self._engine.respond(stream_id, head, end_stream=True)
        if not end_stream:
            self._engine.reset(stream_id, NO_ERROR)
        self.soon()

    def closed_locally(self, stream: Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # The answer is complete: the client need not send the rest (gRPC over HTTP/2).
            self._engine.reset(stream.id, NO_ERROR)
        self._closed(stream)
