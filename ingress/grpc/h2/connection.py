"""One HTTP/2 connection serving gRPC calls, as an asyncio protocol.

Plaintext HTTP/2 with prior knowledge (h2c), as gRPC clients speak it: the
client's preface, then frames both ways (RFC 9113; gRPC's mapping onto it is
PROTOCOL-HTTP2.md in grpc/grpc). What one loop turn writes leaves in one
``writelines`` (the same reason as ``ingress/http/corked_transport.py``).

Flow control: the server advertises large windows and credits the connection
window as data arrives; a unary call's stream window too, a streaming call's
only as its handler takes each message (so a handler that stops reading
stops its client). The server's own DATA waits in the stream's backlog for
the client's windows.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import hpack
from grpc.aio import AbortError

from conveyor.ingress.grpc.h2 import frames as f
from conveyor.ingress.grpc.h2.context import CallContext
from conveyor.ingress.grpc.h2.header_block import (
    OK_TRAILERS,
    RESPONSE_HEAD,
    UNSUPPORTED_MEDIA_TYPE,
    RequestDecoder,
    trailers,
)
from conveyor.ingress.grpc.h2.stream import Inbox, Stream

if TYPE_CHECKING:
    from conveyor.ingress.grpc.h2.server import H2Server

log = logging.getLogger(__name__)

RECV_WINDOW = 1 << 24  # each stream's window (SETTINGS_INITIAL_WINDOW_SIZE)
CONNECTION_WINDOW = 1 << 26
MAX_RECV_FRAME = f.MAX_FRAME_LIMIT
MAX_HEADER_LIST = 1 << 16
# Triton accepts tensors up to protobuf's own 2 GiB message limit.
MAX_MESSAGE_BYTES = (1 << 31) - 1
# A streaming call's replies waiting for the client past this make its writer wait.
STREAM_BACKLOG_BYTES = 1 << 20
# A message up to this size is joined to its 5-byte prefix (copied) rather than sent as two pieces.
_JOIN_BYTES = 1 << 16
# A request message this large is handed on as a view of the bytes read, not copied out.
_VIEW_BYTES = 1 << 16
# A request message split over reads gets a buffer of its size up to this; past it, the buffer grows.
_PREALLOCATE_BYTES = 1 << 26

_OK, _UNKNOWN, _DEADLINE_EXCEEDED = 0, 2, 4
_RESOURCE_EXHAUSTED, _UNIMPLEMENTED, _INTERNAL, _UNAVAILABLE = 8, 12, 13, 14
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: zlib.decompress(b, 31),
    "deflate": zlib.decompress,
}

_SERVER_SETTINGS = f.settings({
    f.ENABLE_PUSH: 0,
    f.INITIAL_WINDOW_SIZE: RECV_WINDOW,
    f.MAX_FRAME_SIZE: MAX_RECV_FRAME,
    f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
}) + f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW)


class ConnectionError_(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class H2Connection(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._rx = bytearray()
        self._need = len(f.PREFACE)  # bytes _rx must hold before parsing again
        self._data_left = 0  # bytes still to come of a DATA frame taken as it arrives
        self._data_into: Stream | None = None  # its stream (None: discarded)
        self._data_flags = 0
        self._preface = True
        self._decoder = RequestDecoder(MAX_HEADER_LIST)
        self._streams: dict[int, Stream] = {}
        self._last_stream = 0
        self._continuing: tuple[int, int, list[bytes]] | None = None  # stream, flags, header fragments
        self._send_window = f.DEFAULT_WINDOW
        self._peer_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self._max_frame = f.DEFAULT_MAX_FRAME
        self._unacked = 0  # connection-level bytes received, not yet credited
        self._blocked: dict[Stream, None] = {}  # streams waiting for the connection window
        self._out: list[Any] = []
        self._flush_pending = False
        self._paused: asyncio.Future[None] | None = None
        self._closing = False

    # --- transport -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)
        self._out.append(_SERVER_SETTINGS)
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def pause_writing(self) -> None:
        if self._paused is None or self._paused.done():
            self._paused = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def _write(self, *parts: Any) -> None:
        self._out.extend(parts)
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        if self._out:
            out, self._out = self._out, []
            if self._transport is not None:
                self._transport.writelines(out)

    @property
    def idle(self) -> bool:
        return not self._streams

    def goaway(self) -> None:
        """Refuse new calls; close once the running ones are done."""
        if not self._closing and self._transport is not None:
            self._closing = True
            self._write(f.goaway(self._last_stream, f.NO_ERROR))
            self._close_if_done()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    def abort_calls(self) -> list[asyncio.Task[None]]:
        """Cancel every running call (the server is stopping); return their tasks."""
        tasks = [s.task for s in self._streams.values() if s.task is not None and not s.task.done()]
        for stream in list(self._streams.values()):
            self._drop(stream)
        return tasks

    def _close_if_done(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            self._flush()
            self._transport.close()

    # --- reading ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            if self._data_left:  # the rest of a DATA frame that began in an earlier read
                used = min(self._data_left, len(data))
                self._data_continues(data, used)
                if used == len(data):
                    self._flush()
                    return
                data = data[used:]
            rx = self._rx
            if rx:
                rx += data
                if len(rx) < self._need:
                    return
                data = bytes(rx)
                rx.clear()
            pos = 0
            if self._preface:
                if len(data) < len(f.PREFACE):
                    rx += data
                    return
                if data[:len(f.PREFACE)] != f.PREFACE:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "expected the HTTP/2 connection preface")
                self._preface = False
                pos = len(f.PREFACE)
            end = len(data)
            unpack = f.HEAD.unpack_from
            while end - pos >= 9:
                hi, lo, kind, flags, sid = unpack(data, pos)
                length = hi << 8 | lo
                if length > MAX_RECV_FRAME:
                    raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame larger than SETTINGS_MAX_FRAME_SIZE")
                start = pos + 9
                if end - start < length:
                    if kind == f.DATA and not flags & f.PADDED:
                        # Large messages come in frames larger than a read: take the
                        # payload as it arrives rather than buffering the frame.
                        self._data_begins(flags, sid & f.STREAM_MASK, length, data, start, end)
                        pos = end
                    break
                pos = start + length
                self._frame(kind, flags, sid & f.STREAM_MASK, data, start, pos)
            if pos < end:
                rx += memoryview(data)[pos:]
                self._need = 9 if len(rx) < 9 else 9 + (rx[0] << 16 | rx[1] << 8 | rx[2])
        except ConnectionError_ as err:
            self._fail(err.code, str(err))
        except hpack.HPACKError as err:
            self._fail(f.COMPRESSION_ERROR, f"bad header block: {err}")
        except (IndexError, ValueError) as err:  # a frame shorter than its fields (padding, priority)
            self._fail(f.PROTOCOL_ERROR, f"malformed frame: {err}")
        self._flush()

    def _fail(self, code: int, message: str) -> None:
        log.debug("HTTP/2 connection error %d: %s", code, message)
        self._write(f.goaway(self._last_stream, code, message.encode()[:256]))
        self._rx.clear()
        self._need = 1 << 62  # read nothing more
        self.close()

    def _frame(self, kind: int, flags: int, sid: int, data: bytes, start: int, end: int) -> None:
        if self._continuing is not None and kind != f.CONTINUATION:
            raise ConnectionError_(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == f.DATA:
            self._on_data(flags, sid, data, start, end)
        elif kind == f.HEADERS:
            self._on_headers(flags, sid, data[start:end])
        elif kind == f.CONTINUATION:
            self._on_continuation(flags, sid, data[start:end])
        elif kind == f.SETTINGS:
            self._on_settings(flags, sid, data[start:end])
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(sid, data[start:end])
        elif kind == f.PING:
            if end - start != 8 or sid:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "bad PING")
            if not flags & f.ACK:
                self._write(f.frame(f.PING, f.ACK, 0, data[start:end]))
        elif kind == f.RST_STREAM:
            self._on_rst_stream(sid)
        elif kind == f.GOAWAY:
            self.goaway()  # the client leaves: finish what runs, then close
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown types are ignored (§5.5).

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "bad SETTINGS length")
        for pos in range(0, len(payload), 6):
            key, value = f.SETTING.unpack_from(payload, pos)
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE too large")
                delta, self._peer_window = value - self._peer_window, value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= f.MAX_FRAME_LIMIT:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self._max_frame = value
            # HEADER_TABLE_SIZE: the server's blocks never use the dynamic table.
        self._write(f.SETTINGS_ACK)
        for stream in list(self._streams.values()):
            if stream.backlog:
                self._pump(stream)

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = f.U32.unpack(payload)[0] & f.STREAM_MASK
        if sid == 0:
            if not increment:
                raise ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window overflow")
            for blocked in list(self._blocked):
                del self._blocked[blocked]
                self._pump(blocked)
            return
        stream = self._streams.get(sid)
        if stream is None:
            return
        if not increment:
            self._reset(stream, f.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.backlog:
            self._pump(stream)

    def _on_rst_stream(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is not None:
            self._drop(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if flags & f.PADDED:
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        if flags & f.PRIORITY_FLAG:
            payload = payload[5:]
        if flags & f.END_HEADERS:
            self._on_header_block(flags, sid, payload)
        else:
            self._continuing = (sid, flags, [payload])

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._continuing is None or self._continuing[0] != sid:
            raise ConnectionError_(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
        fragments = self._continuing[2]
        fragments.append(payload)
        if sum(map(len, fragments)) > 2 * MAX_HEADER_LIST:
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            first_flags = self._continuing[1]
            self._continuing = None
            self._on_header_block(first_flags, sid, b"".join(fragments))

    def _on_header_block(self, flags: int, sid: int, block: bytes) -> None:
        head = self._decoder.decode(block)  # always: it keeps the decoder's table in step
        stream = self._streams.get(sid)
        if stream is not None:  # trailers from the client end its side
            if flags & f.END_STREAM:
                self._remote_end(stream)
            return
        if sid % 2 == 0 or sid <= self._last_stream:
            if sid and sid <= self._last_stream:
                return  # a stream already closed (reset by either side)
            raise ConnectionError_(f.PROTOCOL_ERROR, "bad stream id")
        self._last_stream = sid
        if self._closing:
            self._write(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        if not head.content_type.startswith("application/grpc"):
            # gRPC over HTTP/2: a request that is not gRPC gets HTTP's 415, not a gRPC status.
            self._write(*f.headers(sid, UNSUPPORTED_MEDIA_TYPE, self._max_frame, end_stream=True))
            if not flags & f.END_STREAM:
                self._write(f.rst_stream(sid, f.NO_ERROR))
            return
        handler = self._server.handlers.get(head.path)
        stream = Stream(sid, head, handler, CallContext(head, self._loop), self._peer_window)
        self._streams[sid] = stream
        if flags & f.END_STREAM:
            stream.remote_closed = True
        refusal = self._refusal(stream)
        if refusal is not None or handler is None:
            self._finish(stream, *(refusal or (_UNIMPLEMENTED, "")))
            return
        deadline = stream.ctx.deadline
        if deadline is not None:
            stream.timer = self._loop.call_at(deadline, self._expire, stream)
        if handler.request_streaming:
            stream.inbox = Inbox(handler.request_deserializer, lambda n: self._credit(stream, n))
            stream.task = self._loop.create_task(self._run(stream, stream.inbox))
            if stream.remote_closed:
                stream.inbox.end()
        elif stream.remote_closed:
            self._start_unary(stream)

    def _refusal(self, stream: Stream) -> tuple[int, str] | None:
        """Why the call cannot run, as (gRPC status, message); None when it can."""
        head = stream.head
        if stream.handler is None:
            return _UNIMPLEMENTED, f"Method not found: {head.path}"
        if head.encoding and head.encoding != "identity" and head.encoding not in _DECOMPRESS:
            return _UNIMPLEMENTED, f"Compression algorithm '{head.encoding}' not supported"
        rule = self._server.restrictions.get(head.path)
        if rule is not None:
            header, value, message = rule
            if not any(k == header and v == value for k, v in head.metadata()):
                return _UNAVAILABLE, message
        return None

    def _on_data(self, flags: int, sid: int, data: bytes, start: int, end: int) -> None:
        stream = self._data_stream(sid, end - start)
        if stream is None:
            return
        if flags & f.PADDED:
            pad = data[start]
            start, end = start + 1, end - pad
            if stream.inbox is not None:
                self._credit(stream, pad + 1)
        self._messages(stream, data, start, end)
        if flags & f.END_STREAM and not stream.local_closed:
            self._remote_end(stream)

    def _data_begins(self, flags: int, sid: int, length: int, data: bytes, start: int, end: int) -> None:
        """A DATA frame (not padded) of which only ``data[start:end]`` has arrived."""
        self._data_into = self._data_stream(sid, length)
        self._data_flags = flags
        self._data_left = length
        self._data_continues(memoryview(data)[start:end], end - start)

    def _data_continues(self, data: bytes | memoryview, size: int) -> None:
        """The next ``size`` bytes of the DATA frame under way are ``data[:size]``."""
        self._data_left -= size
        stream = self._data_into
        if stream is None or stream.local_closed:
            return
        self._messages(stream, data, 0, size)
        if not self._data_left:
            self._data_into = None
            if self._data_flags & f.END_STREAM and not stream.local_closed:
                self._remote_end(stream)

    def _data_stream(self, sid: int, size: int) -> Stream | None:
        """Flow control for a DATA frame of ``size`` bytes; the stream it feeds,
        None when that stream is already finished."""
        self._unacked += size
        if self._unacked >= CONNECTION_WINDOW // 4:
            self._write(f.window_update(0, self._unacked))
            self._unacked = 0
        stream = self._streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self._last_stream or sid == 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on an idle stream")
            return None  # a stream this server already finished or reset
        if stream.inbox is None:  # unary: credit now, the message is wanted whole
            self._credit(stream, size)
        return stream

    def _credit(self, stream: Stream, size: int) -> None:
        stream.unacked += size
        if stream.unacked >= RECV_WINDOW // 2 and not stream.remote_closed and not stream.local_closed:
            self._write(f.window_update(stream.id, stream.unacked))
            stream.unacked = 0

    def _messages(self, stream: Stream, data: bytes | memoryview, start: int, end: int) -> None:
        """Split DATA into gRPC messages (a flag byte, a 4-byte length, the bytes).
        A message is copied once: out of ``data`` when it is whole there, else into
        a buffer of its size as its pieces arrive."""
        while start < end:
            body = stream.body
            if body is None:  # at a message's prefix
                prefix = stream.prefix
                if prefix is None and end - start >= 5:
                    flag, size = data[start], int.from_bytes(data[start + 1:start + 5], "big")
                    start += 5
                else:
                    prefix = prefix if prefix is not None else bytearray()
                    take = min(5 - len(prefix), end - start)
                    prefix += data[start:start + take]
                    start += take
                    if len(prefix) < 5:
                        stream.prefix = prefix
                        return
                    stream.prefix = None
                    flag, size = prefix[0], int.from_bytes(prefix[1:5], "big")
                if size > MAX_MESSAGE_BYTES:
                    self._too_large(stream, size)
                    return
                if end - start >= size:  # the usual case: the whole message is here
                    if size < _VIEW_BYTES or not isinstance(data, bytes):
                        message: Any = data[start:start + size]
                    else:
                        message = memoryview(data)[start:start + size]  # bytes do not change: no copy
                    start += size
                    self._message(stream, flag, message)
                    if stream.local_closed:
                        return
                    continue
                stream.body = body = bytearray(size) if size <= _PREALLOCATE_BYTES else bytearray()
                stream.body_size, stream.body_flag = size, flag
                stream.filled = 0
            take = min(stream.body_size - stream.filled, end - start)
            if len(body) == stream.body_size:
                body[stream.filled:stream.filled + take] = data[start:start + take]
            else:  # not preallocated (huge): grows as it arrives
                body += data[start:start + take]
            stream.filled += take
            start += take
            if stream.filled == stream.body_size:
                stream.body = None
                self._message(stream, stream.body_flag, body)
                if stream.local_closed:
                    return

    def _too_large(self, stream: Stream, size: int) -> None:
        stream.body = None
        self._finish(stream, _RESOURCE_EXHAUSTED,
                     f"Received message larger than max ({size} vs. {MAX_MESSAGE_BYTES})")

    def _message(self, stream: Stream, flag: int, message: Any) -> None:
        """One request message (bytes, or a bytearray or memoryview when large)."""
        wire_size = len(message) + 5
        if wire_size - 5 > MAX_MESSAGE_BYTES:
            self._too_large(stream, wire_size - 5)
            return
        if flag & 1:
            decompress = _DECOMPRESS.get(stream.head.encoding)
            if decompress is None:
                self._finish(stream, _INTERNAL, "a compressed message without grpc-encoding")
                return
            try:
                message = decompress(message)
            except zlib.error as err:
                self._finish(stream, _INTERNAL, f"cannot decompress the message: {err}")
                return
        if stream.inbox is not None:
            stream.inbox.put(message, wire_size)
        elif stream.request is None:
            stream.request = message
        else:
            self._finish(stream, _UNIMPLEMENTED, "more than one request message in a unary call")

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.body is not None or stream.prefix is not None:
            stream.body = stream.prefix = None
            self._finish(stream, _INTERNAL, "the request ended inside a message")
        elif stream.inbox is not None:
            stream.inbox.end()
        elif stream.task is None and not stream.local_closed:
            self._start_unary(stream)

    def _start_unary(self, stream: Stream) -> None:
        if stream.request is None:
            self._finish(stream, _UNIMPLEMENTED, "no request message in a unary call")
            return
        request, stream.request = stream.request, None
        stream.task = self._loop.create_task(self._run(stream, request))

    def _expire(self, stream: Stream) -> None:
        stream.timer = None
        if stream.local_closed:
            return
        if stream.task is not None:
            stream.expired = True
            stream.task.cancel()
        else:
            self._finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")

    # --- running a call -------------------------------------------------------------------

    async def _run(self, stream: Stream, request: Any) -> None:
        handler, ctx = stream.handler, stream.ctx
        serialize = handler.response_serializer
        try:
            if not handler.request_streaming and handler.request_deserializer is not None:
                request = handler.request_deserializer(request)
            if not handler.response_streaming:
                call = handler.stream_unary if handler.request_streaming else handler.unary_unary
                response = await call(request, ctx)
                if ctx.code is not None and ctx.code is not grpc.StatusCode.OK:
                    self._finish(stream, ctx.code.value[0], ctx.details)
                    return
                self._reply(stream, serialize(response) if serialize is not None else response)
                return
            call = handler.stream_stream if handler.request_streaming else handler.unary_stream
            async for item in call(request, ctx):
                self._send_message(stream, serialize(item) if serialize is not None else item)
                if stream.backlog_bytes > STREAM_BACKLOG_BYTES or (self._paused and not self._paused.done()):
                    await self._drained(stream)
            code = ctx.code.value[0] if ctx.code is not None else _OK
            self._finish(stream, code, ctx.details)
        except AbortError:
            code = ctx.code.value[0] if ctx.code is not None else _UNKNOWN
            self._finish(stream, code, ctx.details)
        except asyncio.CancelledError:
            if stream.expired:
                self._finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")
        except Exception as err:
            log.exception("gRPC call %s failed", stream.head.path)
            self._finish(stream, _UNKNOWN, f"Unexpected {type(err)}: {err}")

    async def _drained(self, stream: Stream) -> None:
        if stream.backlog_bytes > STREAM_BACKLOG_BYTES and not stream.local_closed:
            stream.drained = self._loop.create_future()
            await stream.drained
        if self._paused is not None and not self._paused.done():
            await self._paused

    # --- writing ---------------------------------------------------------------------

    def _reply(self, stream: Stream, body: bytes) -> None:
        """A unary call's whole answer: headers, the message, trailers."""
        if stream.local_closed:
            return
        size = len(body) + 5
        if size <= stream.send_window and size <= self._send_window and size <= self._max_frame:
            stream.send_window -= size
            self._send_window -= size
            sid = stream.id
            self._write(
                f.head(f.HEADERS, f.END_HEADERS, sid, len(RESPONSE_HEAD)) + RESPONSE_HEAD
                + f.head(f.DATA, 0, sid, size) + b"\0" + (size - 5).to_bytes(4, "big"),
                body,
                f.head(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, len(OK_TRAILERS)) + OK_TRAILERS,
            )
            self._closed_locally(stream)
            return
        self._send_message(stream, body)
        self._finish(stream, _OK, "")

    def _send_message(self, stream: Stream, body: bytes) -> None:
        if stream.local_closed:
            return
        if not stream.headers_sent:
            stream.headers_sent = True
            self._write(*f.headers(stream.id, RESPONSE_HEAD, self._max_frame, end_stream=False))
        prefix = b"\0" + len(body).to_bytes(4, "big")
        if len(body) <= _JOIN_BYTES:  # one piece, so that it leaves in one frame
            stream.backlog.append(memoryview(prefix + body))
        else:  # large: not copied
            stream.backlog.append(memoryview(prefix))
            stream.backlog.append(memoryview(body))
        stream.backlog_bytes += len(body) + 5
        self._pump(stream)

    def _pump(self, stream: Stream) -> None:
        """Send what the windows allow of the stream's backlog, then its trailers."""
        backlog = stream.backlog
        while backlog:
            allowed = min(stream.send_window, self._send_window, self._max_frame)
            if allowed <= 0:
                if self._send_window <= 0:
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
            self._send_window -= size
            stream.backlog_bytes -= size
            self._write(f.head(f.DATA, 0, stream.id, size), chunk)
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)
        if stream.trailer is not None:
            block, stream.trailer = stream.trailer, None
            self._write(*f.headers(stream.id, block, self._max_frame, end_stream=True))
            self._closed_locally(stream)

    def _finish(self, stream: Stream, code: int, message: str) -> None:
        """End the call with its status (trailers-only when nothing was sent yet)."""
        if stream.local_closed or stream.trailer is not None:
            return
        block = OK_TRAILERS if code == _OK and not message else trailers(code, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            self._write(*f.headers(stream.id, RESPONSE_HEAD + block, self._max_frame, end_stream=True))
            self._closed_locally(stream)
        elif stream.backlog:
            stream.trailer = block
        else:
            self._write(*f.headers(stream.id, block, self._max_frame, end_stream=True))
            self._closed_locally(stream)

    def _closed_locally(self, stream: Stream) -> None:
        stream.local_closed = True
        if not stream.remote_closed:
            # The answer is complete: the client need not send the rest (gRPC over HTTP/2).
            self._write(f.rst_stream(stream.id, f.NO_ERROR))
        self._forget(stream)

    def _reset(self, stream: Stream, code: int) -> None:
        self._write(f.rst_stream(stream.id, code))
        self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        """The stream is gone (reset, or the connection lost): stop its call."""
        stream.local_closed = stream.remote_closed = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.inbox is not None:
            stream.inbox.end()
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)
        self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        self._streams.pop(stream.id, None)
        self._blocked.pop(stream, None)
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if self._closing and not self._streams:
            self._loop.call_soon(self._close_if_done)
