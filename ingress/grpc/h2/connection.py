"""One HTTP/2 connection serving gRPC calls, as an asyncio protocol.

Plaintext HTTP/2 with prior knowledge (h2c), as gRPC clients speak it: the
client's preface, then frames both ways (RFC 9113; gRPC's mapping onto it is
PROTOCOL-HTTP2.md in grpc/grpc). This module reads: frames, header blocks,
request messages, the client's control frames; it starts each call
(``calls``) and ends streams. What goes out is ``outbound``'s.

Flow control of what comes in: the server advertises large windows and
credits the connection window as data arrives; a unary call's stream window
too, a streaming call's only as its handler takes each message (so a handler
that stops reading stops its client).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import hpack

from conveyor.ingress.grpc.h2 import frames as f
from conveyor.ingress.grpc.h2.calls import run_call
from conveyor.ingress.grpc.h2.context import CallContext
from conveyor.ingress.grpc.h2.header_block import UNSUPPORTED_MEDIA_TYPE, RequestDecoder
from conveyor.ingress.grpc.h2.messages import MAX_MESSAGE_BYTES, MessageTooLarge
from conveyor.ingress.grpc.h2.outbound import Outbound
from conveyor.ingress.grpc.h2.stream import Inbox, Stream

if TYPE_CHECKING:
    from conveyor.ingress.grpc.h2.server import H2Server

log = logging.getLogger(__name__)

RECV_WINDOW = 1 << 24  # each stream's window (SETTINGS_INITIAL_WINDOW_SIZE)
CONNECTION_WINDOW = 1 << 26
MAX_RECV_FRAME = f.MAX_FRAME_LIMIT
MAX_HEADER_LIST = 1 << 16

_DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNIMPLEMENTED, _INTERNAL, _UNAVAILABLE = 4, 8, 12, 13, 14
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
        self._peer_window = f.DEFAULT_WINDOW  # the client's SETTINGS_INITIAL_WINDOW_SIZE
        self._unacked = 0  # connection-level bytes received, not yet credited
        self._closing = False
        self._out = Outbound(self._loop, self._forget)
        self._write = self._out.write

    # --- transport -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._out.transport = self._transport
        self._server.connections.add(self)
        self._write(_SERVER_SETTINGS)
        self._out.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = self._out.transport = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._out.resume()

    def pause_writing(self) -> None:
        self._out.pause()

    def resume_writing(self) -> None:
        self._out.resume()

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
            self._out.flush()
            self._transport.close()

    def abort_calls(self) -> list[asyncio.Task[None]]:
        """Cancel every running call (the server is stopping); return their tasks."""
        tasks = [s.task for s in self._streams.values() if s.task is not None and not s.task.done()]
        for stream in list(self._streams.values()):
            self._drop(stream)
        return tasks

    def _close_if_done(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            self._out.flush()
            self._transport.close()

    # --- reading ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        try:
            if self._data_left:  # the rest of a DATA frame that began in an earlier read
                used = min(self._data_left, len(data))
                self._data_continues(data, used)
                if used == len(data):
                    self._out.flush()
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
        self._out.flush()

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
                self._out.max_frame = value
            # HEADER_TABLE_SIZE: the server's blocks never use the dynamic table.
        self._write(f.SETTINGS_ACK)
        for stream in list(self._streams.values()):
            if stream.backlog:
                self._out.pump(stream)

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "bad WINDOW_UPDATE length")
        increment = f.U32.unpack(payload)[0] & f.STREAM_MASK
        if sid == 0:
            if not increment:
                raise ConnectionError_(f.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            if self._out.window + increment > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window overflow")
            self._out.window_opened(increment)
            return
        stream = self._streams.get(sid)
        if stream is None:
            return
        if not increment:
            self._reset(stream, f.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.backlog:
            self._out.pump(stream)

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
            self._write(*f.headers(sid, UNSUPPORTED_MEDIA_TYPE, self._out.max_frame, end_stream=True))
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
            self._out.finish(stream, *(refusal or (_UNIMPLEMENTED, "")))
            return
        deadline = stream.ctx.deadline
        if deadline is not None:
            stream.timer = self._loop.call_at(deadline, self._expire, stream)
        if handler.request_streaming:
            stream.inbox = Inbox(handler.request_deserializer, lambda n: self._credit(stream, n))
            stream.task = self._loop.create_task(run_call(self._out, stream, stream.inbox))
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
        self._feed(stream, data, start, end)
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
        self._feed(stream, data, 0, size)
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

    def _feed(self, stream: Stream, data: bytes | memoryview, start: int, end: int) -> None:
        try:
            messages = stream.reader.feed(data, start, end)
        except MessageTooLarge as err:
            self._out.finish(stream, _RESOURCE_EXHAUSTED, str(err))
            return
        for flag, message in messages:
            if stream.local_closed:
                return
            self._message(stream, flag, message)

    def _message(self, stream: Stream, flag: int, message: Any) -> None:
        """One request message (bytes, or a bytearray or memoryview when large)."""
        wire_size = len(message) + 5
        if flag & 1:
            decompress = _DECOMPRESS.get(stream.head.encoding)
            if decompress is None:
                self._out.finish(stream, _INTERNAL, "a compressed message without grpc-encoding")
                return
            try:
                message = decompress(message)
            except zlib.error as err:
                self._out.finish(stream, _INTERNAL, f"cannot decompress the message: {err}")
                return
            if len(message) > MAX_MESSAGE_BYTES:
                self._out.finish(stream, _RESOURCE_EXHAUSTED, str(MessageTooLarge(len(message))))
                return
        if stream.inbox is not None:
            stream.inbox.put(message, wire_size)
        elif stream.request is None:
            stream.request = message
        else:
            self._out.finish(stream, _UNIMPLEMENTED, "more than one request message in a unary call")

    def _remote_end(self, stream: Stream) -> None:
        stream.remote_closed = True
        if stream.reader.partial:
            self._out.finish(stream, _INTERNAL, "the request ended inside a message")
        elif stream.inbox is not None:
            stream.inbox.end()
        elif stream.task is None and not stream.local_closed:
            self._start_unary(stream)

    def _start_unary(self, stream: Stream) -> None:
        if stream.request is None:
            self._out.finish(stream, _UNIMPLEMENTED, "no request message in a unary call")
            return
        request, stream.request = stream.request, None
        stream.task = self._loop.create_task(run_call(self._out, stream, request))

    def _expire(self, stream: Stream) -> None:
        stream.timer = None
        if stream.local_closed:
            return
        if stream.task is not None:
            stream.expired = True
            stream.task.cancel()
        else:
            self._out.finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")

    # --- ending streams ----------------------------------------------------------------

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
        """The stream is over for this connection (answered, reset or lost)."""
        self._streams.pop(stream.id, None)
        self._out.forget(stream)
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if self._closing and not self._streams:
            self._loop.call_soon(self._close_if_done)
