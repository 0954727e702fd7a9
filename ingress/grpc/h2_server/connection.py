"""One HTTP/2 connection serving gRPC calls: an asyncio protocol that drives a sans-IO
HTTP/2 engine (``engine``: python-hyper's h2 or libnghttp2 through ngh2; frames,
CONTINUATION, HPACK, flow-control windows, stream states, SETTINGS and PING are the
engine's). This module maps the engine's events onto gRPC calls (``calls``); what goes
out is ``outbound``'s.

Plaintext HTTP/2 with prior knowledge (h2c), as gRPC clients speak it (RFC 9113;
gRPC's mapping onto it is PROTOCOL-HTTP2.md in grpc/grpc).

Flow control of what comes in: data is credited back as it is consumed. A unary
call's message is consumed as it arrives (it is wanted whole, and held against the
buffer budgets below); a streaming call's bytes are credited at once while its
handler keeps up, and once it is behind only as the handler takes each message, so
a handler that stops reading stops its client, and a client that sends past its
window gets FLOW_CONTROL_ERROR (the engine's check).

The limits (``limits``) each stop one attack; docs/SECURITY.md lists them with what an
offending client sees.
"""

from __future__ import annotations

import asyncio
import logging
import random
from functools import partial
from typing import TYPE_CHECKING, Any

from conveyor.ingress.grpc.h2_server.bdp import BdpEstimator
from conveyor.ingress.grpc.h2_server.calls import run_call
from conveyor.ingress.grpc.h2_server.compression import WBITS, Undecodable, inflated
from conveyor.ingress.grpc.h2_server.context import CallContext
from conveyor.ingress.grpc.h2_server.engine import BDP_PING, KEEPALIVE_PING, REFUSED_STREAM, EngineError
from conveyor.ingress.grpc.h2_server.limits import (
    CLOSE_TIMEOUT_S,
    FEED_MAX_BYTES,
    FEED_MIN_BYTES,
    INDUCED_BURST,
    INDUCED_RATE_PER_S,
    LINGER_S,
    MAX_AGE_JITTER,
    MAX_CONCURRENT_STREAMS,
    RESET_BURST,
    RESET_RATE_PER_S,
    WRITE_BUFFER_HIGH,
    TokenBucket,
    window_cap,
)
from conveyor.ingress.grpc.h2_server.messages import (
    MAX_MESSAGE_BYTES,
    ByteBudget,
    MessageTooLarge,
)
from conveyor.ingress.grpc.h2_server.metadata import UNSUPPORTED_MEDIA_TYPE, RequestHead
from conveyor.ingress.grpc.h2_server.outbound import Outbound
from conveyor.ingress.grpc.h2_server.ping_policy import PingPolicy
from conveyor.ingress.grpc.h2_server.stream import Inbox, Stream
from conveyor.ingress.grpc.tls import ALPN_H2

if TYPE_CHECKING:
    from conveyor.ingress.grpc.h2_server.server import H2Server

log = logging.getLogger(__name__)

_INTERNAL, _DEADLINE_EXCEEDED, _RESOURCE_EXHAUSTED, _UNIMPLEMENTED, _UNAVAILABLE = 13, 4, 8, 12, 14

_WRITING, _FEEDING = 1, 2  # why reading is paused


class GrpcConnection(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self._server = server
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        engine = self._engine = server.engine(self)
        self._streams: dict[int, Stream] = {}
        self._budget = ByteBudget(server.connection_buffer_bytes)
        self._shared = server.budget  # the process's
        self._message_limit = min(MAX_MESSAGE_BYTES, server.connection_buffer_bytes or MAX_MESSAGE_BYTES)
        now = self._loop.time()
        self._resets = TokenBucket(RESET_BURST, RESET_RATE_PER_S, now)
        self._induced = TokenBucket(INDUCED_BURST, INDUCED_RATE_PER_S, now)
        self._paused = 0  # _WRITING | _FEEDING
        self._unfed: memoryview | None = None  # what is left of a read, fed on later loop turns
        self._feed_size = 4 * FEED_MIN_BYTES  # shrinks while pieces hold many frames, grows while few
        self._closing = False  # a graceful GOAWAY was sent: new streams are refused
        self._lingering = False  # the FIN is sent: reading only to drop what the peer still sends
        # The connection is over (an error, the client's GOAWAY, lost). A plain attribute, not a property: the
        # engine reads it after every event it hands on.
        self.dead = False
        self._out = Outbound(engine, self._loop, self._forget)
        # Keepalive and age (limits.Keepalive): one timer at a time per connection, nothing per call.
        self._keepalive = server.keepalive
        self._timer: asyncio.TimerHandle | None = None  # the next keepalive PING, or its ACK's deadline
        self._age_timer: asyncio.TimerHandle | None = None  # max age, then its grace
        self._awaiting_ack = False  # a keepalive PING is out: _timer is its ACK's deadline
        self._pings = PingPolicy(server.keepalive)
        # Receive windows that grow with the link: gRPC core's BDP estimator (bdp.py).
        self._bdp = BdpEstimator(window_cap(server.connection_buffer_bytes, server.budget.limit))

    # --- transport -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        assert self._transport is not None
        if self._server.tls is not None:
            tls = transport.get_extra_info("ssl_object")
            if tls is None or tls.selected_alpn_protocol() != ALPN_H2:
                # As gRPC core's server: a TLS client that did not negotiate h2 is not a gRPC client
                # (OpenSSL completes a handshake whose ALPN found no match; the check is ours).
                log.debug("gRPC: closing a TLS connection that did not negotiate ALPN h2")
                self.dead = True
                self._transport.abort()
                return
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self._out.transport = self._transport
        self._server.connections.add(self)
        self._engine.start()
        self._out.flush()
        keepalive = self._keepalive
        self._timer = self._loop.call_later(keepalive.time_s, self._keepalive_ping)
        if keepalive.max_age_s is not None:
            age = keepalive.max_age_s * random.uniform(1 - MAX_AGE_JITTER, 1 + MAX_AGE_JITTER)
            self._age_timer = self._loop.call_later(age, self._too_old)

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self.dead = True
        self._stop_timers()
        self._transport = self._out.transport = None
        for stream in list(self._streams.values()):
            self._drop(stream)
        self._out.resume()

    def pause_writing(self) -> None:
        self._out.pause()
        self._pause(_WRITING)

    def resume_writing(self) -> None:
        self._out.resume()
        self._resume(_WRITING)
        if self._unfed is not None:
            self._loop.call_soon(self._feed_more)

    def _pause(self, why: int) -> None:
        if not self._paused and self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        self._paused &= ~why
        if not self._paused and self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    @property
    def idle(self) -> bool:
        return not self._streams

    def goaway(self) -> None:
        """Refuse new calls; close once the running ones are done."""
        if self._closing or self.dead or self._transport is None:
            return
        self._closing = True
        self._out.extra = self._engine.graceful_goaway()
        self._out.flush()
        self._close_if_done()

    def close(self) -> None:
        """Send what is pending (a GOAWAY) and FIN, linger (LINGER_S), then close."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._lingering:
            return
        self._out.flush()
        self.dead = True  # what arrives now is dropped unread by h2
        self._unfed = None
        self._out.transport = None  # and nothing more is written after the FIN
        self._loop.call_later(CLOSE_TIMEOUT_S, transport.abort)  # a no-op once it has closed
        if not transport.can_write_eof():
            transport.close()
            return
        self._lingering = True
        try:
            transport.write_eof()  # after the buffer drains
        except OSError:  # the peer is gone already
            transport.abort()
            return
        if self._paused:
            self._paused = 0
            transport.resume_reading()
        self._loop.call_later(LINGER_S, transport.close)  # the peer's FIN closes it sooner (eof_received)

    def abort_calls(self) -> list[asyncio.Task[None]]:
        """Cancel every running call (the server is stopping); return their tasks (a direct call
        stops when it is cancelled: nothing to wait for)."""
        tasks = [s.task for s in self._streams.values() if isinstance(s.task, asyncio.Task) and not s.task.done()]
        for stream in list(self._streams.values()):
            self._drop(stream)
        return tasks

    # --- keepalive and age (gRPC core's chttp2 keepalive, ping abuse policy and max_age filter) ---------

    def _stop_timers(self) -> None:
        for timer in (self._timer, self._age_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._age_timer = None

    def _reset_ping_clock(self) -> None:
        """The ping policies start over if the server wrote since the last look: headers, a message, trailers
        (an error-only answer too) or a connection WINDOW_UPDATE, as gRPC core's chttp2 resets them
        (``grpc_chttp2_reset_ping_clock``, called where it writes those; what the client sends resets
        nothing). Looked at lazily, when a PING comes or is due: nothing on the call path but the flags."""
        out, engine = self._out, self._engine
        if out.data_sent or engine.wrote:
            self._pings.reset()
            out.data_sent = engine.wrote = False

    def _keepalive_ping(self) -> None:
        """keepalive_time is up: PING (where calls run, or permit_without_calls) and wait keepalive_timeout
        for its ACK."""
        if self.dead:
            return
        keepalive = self._keepalive
        self._reset_ping_clock()
        if not self._pings.may_ping(bool(self._streams)):
            self._timer = self._loop.call_later(keepalive.time_s, self._keepalive_ping)
            return
        self._engine.ping(KEEPALIVE_PING)
        self._out.flush()
        self._awaiting_ack = True
        self._pings.pinged()
        self._timer = self._loop.call_later(keepalive.timeout_s, self._keepalive_timeout)

    def _keepalive_timeout(self) -> None:
        self._timer = None
        if not self.dead:
            self._end("keepalive watchdog timeout: no PING ACK within --grpc-keepalive-timeout")

    def on_ping_ack(self, data: bytes) -> None:
        if data == BDP_PING:
            self._probe_done()
        elif self._awaiting_ack and self._timer is not None:
            self._awaiting_ack = False
            self._timer.cancel()
            self._timer = self._loop.call_later(self._keepalive.time_s, self._keepalive_ping)

    # --- receive windows that grow with the link (gRPC core's BdpEstimator and chttp2 flow control) ---------

    def _probe(self) -> None:
        """BDP_PROBE_BYTES arrived since the last probe: PING, unless one is out or it is too soon."""
        if not self.dead and self._bdp.probe(self._loop.time()):
            self._engine.ping(BDP_PING)  # written with what this read queued

    def _probe_done(self) -> None:
        """The probe's ACK: what arrived since it left is a sample of the bandwidth-delay product."""
        bdp = self._bdp
        if bdp.acked(self._loop.time()):
            self._engine.grow(bdp.stream_window, bdp.connection_window)
            self._out.flush()

    def _too_old(self) -> None:
        """max_connection_age is up: GOAWAY NO_ERROR, the running calls finish (for up to the grace)."""
        self._age_timer = None
        if self.dead:
            return
        self.goaway()
        grace = self._keepalive.max_age_grace_s
        if grace is not None and not self.dead:
            self._age_timer = self._loop.call_later(grace, self._grace_over)

    def _grace_over(self) -> None:
        self._age_timer = None
        if not self.dead:
            self._end("max connection age and its grace are over")

    def _close_if_done(self) -> None:
        if self._closing and not self._streams and self._transport is not None:
            self.close()

    # --- reading ---------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        if len(data) > self._feed_size:
            self._unfed = memoryview(data)
            self._pause(_FEEDING)
            self._feed_more()
            return
        self._feed(data)

    def _feed_more(self) -> None:
        """The next piece of a large read; the rest on a later loop turn (not while the client
        is not reading what this connection writes)."""
        unfed = self._unfed
        if unfed is None or self.dead or self._paused & _WRITING:
            return
        size = self._feed_size
        self._unfed = unfed[size:] if len(unfed) > size else None
        self._feed(unfed[:size])
        if self.dead:
            return
        if self._unfed is not None:
            self._loop.call_soon(self._feed_more)
        else:
            self._resume(_FEEDING)

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            count = self._engine.feed(data)  # calls on_request, on_data… below
        except EngineError as err:  # flow control, too many streams or CONTINUATION, a bad frame
            self._end(str(err))  # the engine's GOAWAY (queued) leaves
            return
        if self.dead:
            return
        self._out.collect()
        if not self._engine.alive:  # it ended the connection itself (its GOAWAY was just collected)
            self._end("HTTP/2 connection error")
            return
        frames = self._engine.feed_frames
        if count > frames:
            self._feed_size = max(FEED_MIN_BYTES, self._feed_size * frames // count)
        elif count < frames // 2 and len(data) >= self._feed_size:
            self._feed_size = min(FEED_MAX_BYTES, 2 * self._feed_size)

    def _end(self, why: str) -> None:
        """The connection is over: what the engine queued (its GOAWAY) leaves, every call stops."""
        log.debug("gRPC connection closed: %s", why)
        self.dead = True
        self._unfed = None
        self._stop_timers()
        for stream in list(self._streams.values()):
            self._drop(stream)
        self.close()

    def _calm(self, why: str) -> None:
        """GOAWAY ENHANCE_YOUR_CALM: the client spent a budget."""
        self._engine.calm(why)
        self._end(why)

    # --- the engine's events ----------------------------------------------------------

    def on_goaway(self) -> None:
        # The client leaves; the engine sends nothing more once a GOAWAY was received.
        self._end("the client sent GOAWAY")

    def on_window(self, sid: int) -> None:
        if self._out.blocked:  # a client's WINDOW_UPDATEs mostly find no stream waiting
            self._out.window_opened(sid)

    def on_settings(self, window_changed: bool) -> None:
        if not self._induced.spend(self._loop.time()):
            self._calm("too many PING or SETTINGS frames")
            return
        if window_changed:
            self._out.window_opened(-1)

    def on_ping(self) -> None:
        now = self._loop.time()
        if not self._induced.spend(now):
            self._calm("too many PING or SETTINGS frames")
            return
        self._reset_ping_clock()
        if not self._pings.client_ping(now, bool(self._streams)):
            self._calm("too_many_pings")

    def _spend_reset(self) -> None:
        if not self._resets.spend(self._loop.time()):
            self._calm("too many streams reset or refused")

    def on_request(self, sid: int, head: RequestHead, ended: bool) -> None:
        if self._closing:
            self._engine.reset(sid, REFUSED_STREAM)
            return
        if len(self._streams) >= MAX_CONCURRENT_STREAMS:
            self._engine.reset(sid, REFUSED_STREAM)
            self._spend_reset()
            return
        if not head.content_type.startswith("application/grpc"):
            # gRPC over HTTP/2: a request that is not gRPC gets HTTP's 415, not a gRPC status.
            self._out.reject(sid, UNSUPPORTED_MEDIA_TYPE, end_stream=ended)
            return
        handler = self._server.handlers.get(head.path)
        stream = Stream(sid, head, handler, CallContext(head, self._loop), self._message_limit)
        self._streams[sid] = stream
        # The engine has taken the frame whole: with END_STREAM its stream is half-closed already
        # (on_end, called next, does the rest).
        stream.remote_closed = ended
        if handler is None or head.encoding or head.path in self._server.restrictions:  # else nothing refuses it
            refusal = self._refusal(stream)
            if refusal is not None or handler is None:
                self._out.finish(stream, *(refusal or (_UNIMPLEMENTED, "")))
                return
        deadline = stream.ctx.deadline
        if deadline is not None:
            stream.timer = self._loop.call_at(deadline, self._expire, stream)
        if handler.request_streaming:
            stream.inbox = Inbox(handler.request_deserializer, partial(self._taken, stream))
        # A call starts with its first request message (a streaming one) or at its END_STREAM (a
        # unary one, with its one message): a stream opened and reset, or never sent a message,
        # costs no task (rapid reset, streams that never send DATA).

    def _refusal(self, stream: Stream) -> tuple[int, str] | None:
        """Why the call cannot run, as (gRPC status, message); None when it can."""
        head = stream.head
        if stream.handler is None:
            return _UNIMPLEMENTED, f"Method not found: {head.path}"
        if head.encoding and head.encoding != "identity" and head.encoding not in WBITS:
            return _UNIMPLEMENTED, f"Compression algorithm '{head.encoding}' not supported"
        rule = self._server.restrictions.get(head.path)
        if rule is not None:
            header, value, message = rule
            if not any(k == header and v == value for k, v in head.metadata()):
                return _UNAVAILABLE, message
        return None

    def on_data(self, sid: int, data: bytes, credit: int, ended: bool) -> None:
        """DATA on ``sid``; ``credit``: its flow-controlled length (padding included)."""
        bdp = self._bdp
        bdp.received += credit
        if bdp.received >= bdp.probe_at:
            self._probe()
        stream = self._streams.get(sid)
        if stream is None or stream.local_closed:  # a stream already answered or refused: discarded
            self._engine.acknowledge(credit, sid)
            return
        if ended:
            stream.remote_closed = True  # as in on_request
        if not self._charge(stream, len(data)):
            self._engine.acknowledge(credit, sid)
            return
        inbox = stream.inbox
        if inbox is None or not (inbox or stream.deferred):
            self._engine.acknowledge(credit, sid)  # consumed: a unary message, or a handler keeping up
        else:
            stream.deferred += credit  # credited as the handler takes its messages (_taken)
        try:
            messages = stream.reader.feed(data)
        except MessageTooLarge as err:
            self._out.finish(stream, _RESOURCE_EXHAUSTED, str(err))
            return
        for flag, message in messages:
            if stream.local_closed:
                return
            self._message(stream, flag, message)

    def _charge(self, stream: Stream, size: int) -> bool:
        """Hold ``size`` more bytes for ``stream``; past a budget, end it RESOURCE_EXHAUSTED. (ByteBudget.take of
        both budgets, written out: it runs for every DATA frame.)"""
        budget, shared = self._budget, self._shared
        if budget.limit and budget.used + size > budget.limit:
            self._out.finish(stream, _RESOURCE_EXHAUSTED, (
                f"request messages not yet taken on this connection would exceed {budget.limit} bytes "
                "(--grpc-max-connection-buffer-bytes)"))
            return False
        if shared.limit and shared.used + size > shared.limit:
            self._out.finish(stream, _RESOURCE_EXHAUSTED, (
                f"request messages not yet taken in this server process would exceed {shared.limit} "
                "bytes (--grpc-max-buffer-bytes); retry later"))
            return False
        budget.used += size
        shared.used += size
        stream.held += size
        return True

    def _release(self, stream: Stream, size: int) -> None:
        stream.held -= size
        self._budget.used -= size  # ByteBudget.give of both, written out as in _charge
        self._shared.used -= size

    def _taken(self, stream: Stream, held: int) -> None:
        """A streaming call's handler took a message that held ``held`` bytes."""
        if self._streams.get(stream.id) is not stream:
            return  # the stream is over: what it held was given back then
        self._release(stream, held)
        inbox = stream.inbox
        if stream.deferred and not inbox and not self.dead:
            self._engine.acknowledge(stream.deferred, stream.id)
            stream.deferred = 0
            self._out.soon()

    def _message(self, stream: Stream, flag: int, message: Any) -> None:
        """One request message (bytes, or a bytearray or memoryview when large)."""
        held = len(message) + 5
        if flag & 1:
            inflated = self._inflated(stream, message, held)
            if inflated is None:
                return
            message, held = inflated, len(inflated)
        if stream.inbox is not None:
            stream.inbox.put(message, held)
            if stream.task is None:
                stream.task = self._loop.create_task(run_call(self._out, stream, stream.inbox))
        elif stream.request is None:
            stream.request = message
        else:
            self._out.finish(stream, _UNIMPLEMENTED, "more than one request message in a unary call")

    def _inflated(self, stream: Stream, message: Any, held: int) -> bytes | None:
        """A compressed message inflated (``compression``); None when its stream was ended instead."""
        try:
            return inflated(message, stream.head.encoding, self._message_limit, held, partial(self._charge, stream))
        except Undecodable as err:
            self._out.finish(stream, err.status, err.message)
            return None

    def on_end(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None or stream.local_closed:
            return
        stream.remote_closed = True
        if stream.reader.partial:
            self._out.finish(stream, _INTERNAL, "the request ended inside a message")
        elif stream.inbox is not None:
            stream.inbox.end()
            if stream.task is None:  # a stream of no messages
                stream.task = self._loop.create_task(run_call(self._out, stream, stream.inbox))
        elif stream.task is None:
            self._start_unary(stream)

    def _start_unary(self, stream: Stream) -> None:
        if stream.request is None:
            self._out.finish(stream, _UNIMPLEMENTED, "no request message in a unary call")
            return
        request, stream.request = stream.request, None
        self._release(stream, stream.held)  # the message is the call's now
        direct = self._server.direct.get(stream.head.path)
        if direct is None:
            stream.task = self._loop.create_task(run_call(self._out, stream, request))
            return
        deserialize = stream.handler.request_deserializer
        if deserialize is not None:
            request = deserialize(request)
        running = direct(request, stream, self._out)  # may have answered already
        if running is None:  # it may wait for more than its answer: a task runs it
            running = self._loop.create_task(run_call(self._out, stream, request, parsed=True))
        if not stream.local_closed:
            stream.task = running

    def _expire(self, stream: Stream) -> None:
        stream.timer = None
        if stream.local_closed:
            return
        task = stream.task
        if isinstance(task, asyncio.Task):
            stream.expired = True
            task.cancel()  # run_call answers DEADLINE_EXCEEDED
        elif task is not None:  # a direct call: it stops waiting, the answer is this
            task.cancel()
            self._out.finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")
        else:
            self._out.finish(stream, _DEADLINE_EXCEEDED, "Deadline Exceeded")

    # --- ending streams ----------------------------------------------------------------

    def on_reset(self, sid: int, remote: bool) -> None:
        """The stream was reset (``remote``: by the client) or closed by the engine."""
        stream = self._streams.get(sid)
        if stream is None:
            return
        self._drop(stream)
        if remote:
            self._spend_reset()

    def _drop(self, stream: Stream) -> None:
        """The stream is gone (reset, or the connection lost): stop its call."""
        stream.local_closed = stream.remote_closed = True
        self._forget(stream)

    def _forget(self, stream: Stream) -> None:
        """The stream is over for this connection (answered, reset or lost): its call stops
        (unless it is what ended it), what it held is given back."""
        if self._streams.pop(stream.id, None) is None:
            return
        task = stream.task
        # current_task(loop): without the loop it asks for the running loop, a getpid() syscall per call.
        if task is not None and not task.done() and task is not asyncio.current_task(self._loop):
            task.cancel()
        if stream.inbox is not None:
            stream.inbox.end()
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)
        if self._out.blocked:  # a stream waiting for the client's window (rare)
            self._out.forget(stream)
        if stream.held:
            self._release(stream, stream.held)
        if stream.deferred and not self.dead:
            # The connection's share of the credit (the engine gives none to a closed stream).
            self._engine.acknowledge(stream.deferred, stream.id)
            stream.deferred = 0
            self._out.soon()
        if stream.timer is not None:
            stream.timer.cancel()
            stream.timer = None
        if self._closing and not self._streams:
            self._loop.call_soon(self._close_if_done)
