"""What the server sends on one connection: a write buffer that leaves once per
loop turn (one ``writelines``, as ``ingress/http/corked_transport.py``), the
client's flow-control windows, and each call's answer: headers, messages,
trailers (trailers-only when a call fails before its first message)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from conveyor.ingress.grpc.h2 import frames as f
from conveyor.ingress.grpc.h2.header_block import OK_TRAILERS, RESPONSE_HEAD, trailers
from conveyor.ingress.grpc.h2.stream import Stream

OK = 0
# A message up to this size is joined to its 5-byte prefix (copied) rather than sent as two pieces.
JOIN_BYTES = 1 << 16
# A streaming call's replies waiting for the client past this make its writer wait.
STREAM_BACKLOG_BYTES = 1 << 20


class Outbound:
    def __init__(self, loop: asyncio.AbstractEventLoop, closed: Callable[[Stream], None]) -> None:
        self._loop = loop
        self._closed = closed  # told when a stream's answer is complete
        self.transport: asyncio.Transport | None = None
        self.window = f.DEFAULT_WINDOW  # the connection's send window
        self.max_frame = f.DEFAULT_MAX_FRAME  # the client's SETTINGS_MAX_FRAME_SIZE
        self._blocked: dict[Stream, None] = {}  # streams waiting for the connection window
        self._out: list[Any] = []
        self._flush_pending = False
        self.paused: asyncio.Future[None] | None = None  # the transport's buffer is full

    # --- the write buffer ---------------------------------------------------------------

    def write(self, *parts: Any) -> None:
        self._out.extend(parts)
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_pending = False
        if self._out:
            out, self._out = self._out, []
            if self.transport is not None:
                self.transport.writelines(out)

    def pause(self) -> None:
        if self.paused is None or self.paused.done():
            self.paused = self._loop.create_future()

    def resume(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)

    # --- flow control ------------------------------------------------------------------

    def window_opened(self, increment: int) -> None:
        """The client's WINDOW_UPDATE on the connection."""
        self.window += increment
        for stream in list(self._blocked):
            del self._blocked[stream]
            self.pump(stream)

    def forget(self, stream: Stream) -> None:
        self._blocked.pop(stream, None)

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
        if size <= stream.send_window and size <= self.window and size <= self.max_frame:
            stream.send_window -= size
            self.window -= size
            sid = stream.id
            self.write(
                f.head(f.HEADERS, f.END_HEADERS, sid, len(RESPONSE_HEAD)) + RESPONSE_HEAD
                + f.head(f.DATA, 0, sid, size) + b"\0" + (size - 5).to_bytes(4, "big"),
                body,
                f.head(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, len(OK_TRAILERS)) + OK_TRAILERS,
            )
            self.closed_locally(stream)
            return
        self.send_message(stream, body)
        self.finish(stream, OK, "")

    def send_message(self, stream: Stream, body: bytes) -> None:
        if stream.local_closed:
            return
        if not stream.headers_sent:
            stream.headers_sent = True
            self.write(*f.headers(stream.id, RESPONSE_HEAD, self.max_frame, end_stream=False))
        prefix = b"\0" + len(body).to_bytes(4, "big")
        if len(body) <= JOIN_BYTES:  # one piece, so that it leaves in one frame
            stream.backlog.append(memoryview(prefix + body))
        else:  # large: not copied
            stream.backlog.append(memoryview(prefix))
            stream.backlog.append(memoryview(body))
        stream.backlog_bytes += len(body) + 5
        self.pump(stream)

    def pump(self, stream: Stream) -> None:
        """Send what the windows allow of the stream's backlog, then its trailers."""
        backlog = stream.backlog
        while backlog:
            allowed = min(stream.send_window, self.window, self.max_frame)
            if allowed <= 0:
                if self.window <= 0:
                    self._blocked[stream] = None
                return
            chunk = backlog[0]
            if len(chunk) <= allowed:
                backlog.popleft()
            else:
                backlog[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            size = len(chunk)
            stream.send_window -= size
            self.window -= size
            stream.backlog_bytes -= size
            self.write(f.head(f.DATA, 0, stream.id, size), chunk)
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)
        if stream.trailer is not None:
            block, stream.trailer = stream.trailer, None
            self.write(*f.headers(stream.id, block, self.max_frame, end_stream=True))
            self.closed_locally(stream)

    def finish(self, stream: Stream, code: int, message: str) -> None:
        """End the call with its status (trailers-only when nothing was sent yet)."""
        if stream.local_closed or stream.trailer is not None:
            return
        block = OK_TRAILERS if code == OK and not message else trailers(code, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            self.write(*f.headers(stream.id, RESPONSE_HEAD + block, self.max_frame, end_stream=True))
            self.closed_locally(stream)
        elif stream.backlog:
            stream.trailer = block
        else:
            self.write(*f.headers(stream.id, block, self.max_frame, end_stream=True))
            self.closed_locally(stream)

    def closed_locally(self, stream: Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # The answer is complete: the client need not send the rest (gRPC over HTTP/2).
            self.write(f.rst_stream(stream.id, f.NO_ERROR))
        self._closed(stream)
