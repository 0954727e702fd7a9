"""The HTTP ingress's connection protocols: uvicorn's httptools protocol, adjusted.

``HttpToolsProtocol`` serves every connection (``fast_protocol.py`` builds on it);
``CaseKeepingProtocol`` only when headers are forwarded to models.

A client that goes away (its connection closed or reset) while its request runs takes the
request with it: ``connection_lost`` cancels what serves it (the ASGI task, or the fast path's
task or ``_Awaiting``), which tells the router (``RouterLink.abandon``): still queued, it never
runs and counts as CANCELED; running, its model sees ``is_cancelled()``. uvicorn alone only marks
the cycle disconnected, which a falcon responder that has read its body never looks at, so the
work would run to its end for nobody (as in Triton's HTTP frontend).

Built on uvicorn's private protocol class and its attributes (``cycle``, ``flow``,
``pipeline``, ``server_state``, ``_start_asgi_task``, ...): pyproject pins uvicorn to the minor
version this was written against.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import httptools
import orjson
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as UvicornHttpToolsProtocol

from conveyor.ingress.header_forward import RAW_HEADERS
from conveyor.ingress.http.body import CLIENT_LEFT
from conveyor.ingress.http.corked_transport import CorkedTransport
from conveyor.ingress.http.edge import EdgeState
from conveyor.ingress.http.errors import RETRY_AFTER_LINE

log = logging.getLogger(__name__)


# A request answered (and its connection closing) while its body still arrives, a refused body over the
# limit most often: its rest is read and dropped, for at most this long and this much, before the connection
# closes (RFC 9112 9.6). Closed at once with those bytes unread, the kernel resets the connection and the
# client, still sending, never reads the answer (Triton's frontend's clients expect its 413).
LINGER_S = 2.0
LINGER_BYTES = 64 << 20  # a body just over Triton's default 64 MiB limit is read to its end
# Non-empty chunks one chunked request body may have (Triton's kMaxChunkedChunks): each costs the parser a
# callback and the body a piece, so a body of one-byte chunks is bounded in work, not only in bytes.
MAX_CHUNKED_CHUNKS = 1 << 16
CHUNKS_REFUSAL = (f"Chunked request body exceeds maximum of {MAX_CHUNKED_CHUNKS} non-empty chunks. Send fewer or "
                  "larger HTTP chunks.")


class Abandonable(Protocol):
    """What serves a running request: its task, or the fast path's ``_Awaiting``."""

    def cancel(self, msg: Any = None) -> bool: ...


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request refused at the edge."""


class _BackpressureFlow(FlowControl):
    """uvicorn's flow control, plus: while the client does not read what was sent to it (the
    send buffer is over its high-water mark), its connection is not read either, so it cannot
    queue more answers. uvicorn alone resumes reading after every response."""

    def pause_writing(self) -> None:
        super().pause_writing()
        self.pause_reading()

    def resume_writing(self) -> None:
        super().resume_writing()
        self.resume_reading()

    def resume_reading(self) -> None:
        if not self.write_paused and not self._transport.is_closing():
            super().resume_reading()


class HttpToolsProtocol(UvicornHttpToolsProtocol):
    """uvicorn's httptools protocol that, as Triton (libevhtp), reads a request carrying
    both ``Content-Length`` and ``Transfer-Encoding: chunked`` by its chunks (RFC 9112
    6.3) instead of refusing it; ``BodyLimit`` closes such a connection after the answer.
    A response's head and body leave in one write (``CorkedTransport``). The limits of
    ``edge.py`` hold on every connection: the head's size, field count and time, the
    body's pace, the client's reading of its answers, and the process's connection count.
    """

    edge = EdgeState()  # the process's: ``server.py`` binds a class with its own

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self._in_head = True  # reading a request head (or waiting for one)
        self._head_room = 0  # head bytes still allowed
        self._fields_left = 0  # header fields still allowed
        self._chunks_left = 0  # chunks the body being read may still have (``expect_head`` sets it)
        self._head_started: float | None = None  # loop time of the head's start; None: not begun
        self._last_read = 0.0  # loop time of the last bytes received
        self._read_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._messages = 0  # requests begun on this connection
        self._refusal: tuple[int, str] | None = None
        self._idle_since: float | None = None  # loop time the connection last went idle; None: not idle
        self._linger_left: int | None = None  # bytes still to drop while lingering; None: not lingering
        self._linger_timer: asyncio.TimerHandle | None = None
        # The request running now (its cycle, what serves it) until its response is complete: cancelled
        # when the client goes away. Not ``self.cycle``, which is the newest one (pipelined: not running).
        self.running: tuple[Any, Abandonable] | None = None

    # --- the connection -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _BackpressureFlow(transport)
        corked = CorkedTransport(transport, self.loop)
        corked.on_close = self._linger
        self.transport = corked  # type: ignore[assignment]
        now = self.loop.time()
        self._last_read = now
        self.expect_head()
        self._head_started = now  # the first head is due from the connection on: one that never sends is closed
        self._arm_read_timer(now + self.edge.limits.header_timeout_s)
        limit = self.edge.limits.max_connections
        if limit and len(self.connections) > limit and not self._make_room():
            self._refuse(503, f"too many connections: this ingress process holds at most {limit} "
                              "(--http-max-connections); retry later")
            return
        self.edge.waiting[self] = None

    def _make_room(self) -> bool:
        """At the cap: close the connection that has waited longest for a request."""
        for other in self.edge.waiting:
            if other is not self:
                log.debug("connection cap reached: closing a connection idle since its last request")
                other.edge_close()
                return True
        return False

    def edge_close(self) -> None:
        self.edge.waiting.pop(self, None)
        if not self.transport.is_closing():
            self.transport.close()

    def _linger(self) -> bool:
        """``transport.close()`` after the answer to a request whose body still arrives: send the answer
        and end our side (FIN), then drop what comes until the client is done, ``LINGER_BYTES`` or
        ``LINGER_S`` (``_linger_end``). False: close now (nothing more to read, or lingering already)."""
        cycle = self.cycle
        # (``fast_protocol.py``'s cycles have no ``more_body``: they close as before.)
        if (self._linger_left is not None or cycle is None or not getattr(cycle, "more_body", False)
                or not cycle.response_complete or not self.transport.can_write_eof()):  # TLS: no half-close
            return False
        self._linger_left = LINGER_BYTES
        self.edge.waiting.pop(self, None)
        self.transport.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, self._linger_end)
        return True

    def _linger_end(self) -> None:
        self._linger_timer = None
        self.transport.close()  # lingering already: closes

    def connection_lost(self, exc: Exception | None) -> None:
        running = self.running
        if running is not None:  # the client left before its answer: the work goes too
            self.running = None
            cycle, work = running
            cycle.disconnected = True  # (uvicorn marks only ``self.cycle``)
            scope = getattr(cycle, "scope", None)  # an ASGI request's: ``BodyLimit`` ends it quietly
            if scope is not None:
                scope[CLIENT_LEFT] = True
            work.cancel()
        self.edge.waiting.pop(self, None)
        for timer in (self._read_timer, self._write_timer, self.timeout_keep_alive_task, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._read_timer = self._write_timer = self.timeout_keep_alive_task = self._linger_timer = None
        super().connection_lost(exc)

    # --- reading: the head's size, its fields, the time it and the body take --------------

    def data_received(self, data: bytes) -> None:
        # uvicorn's, but a head is fed at most its room at a time: httptools buffers a header
        # field until it ends, so a field without end would otherwise grow without bound.
        if self._linger_left is not None:  # the rest of an answered body: dropped
            self._linger_left -= len(data)
            if self._linger_left < 0:
                self._linger_end()
            return
        self._idle_since = None  # uvicorn's ``_unset_keepalive_if_required`` (see ``_keep_alive_due``)
        self._last_read = self.loop.time()
        if self._in_head and len(data) > self._head_room:
            view = memoryview(data)
            while view:
                room = self._head_room
                piece, view = (view[:room], view[room:]) if self._in_head and len(view) > room else (view, view[:0])
                if not self._feed_piece(piece):
                    return
        else:  # all of it fits: the common case, without slicing
            self._feed_piece(data)

    def _feed_piece(self, piece: bytes | memoryview) -> bool:
        """Parse ``piece``, charging the head's room for what of it was head; False once refused or closing."""
        in_head, messages = self._in_head, self._messages
        if not self._feed(piece):
            return False
        if in_head and self._in_head and messages == self._messages:
            # All of it was this head's. (A head that began inside ``piece`` is not charged for
            # it, so a head may reach twice the limit before its 431, never more.)
            self._head_room -= len(piece)
            if self._head_room <= 0:
                limit = self.edge.limits.max_head_bytes
                self._refuse(431, f"the request head is over {limit} bytes, the most this server reads")
                return False
        return True

    def _feed(self, data: bytes | memoryview) -> bool:
        """Parse ``data``; False once the connection is answered and closing."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no WebSocket here (ws="none")
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return False
        return not self.transport.is_closing()

    def expect_head(self) -> None:
        """Wait for the next request head: its bytes and fields counted afresh, its time from its first byte."""
        self._in_head = True
        self._head_room = self.edge.limits.max_head_bytes or (1 << 62)
        self._fields_left = self.edge.limits.max_headers or (1 << 62)
        self._head_started = None
        self._chunks_left = MAX_CHUNKED_CHUNKS + 1  # the last chunk, empty, ends the body and counts here too

    def on_message_begin(self) -> None:
        self.begin_message()
        super().on_message_begin()

    def begin_message(self) -> None:
        """A request head begins: counted, its time watched from now unless already."""
        self._messages += 1
        if self._head_started is None:
            self._head_started = now = self.loop.time()
            self._arm_read_timer(now + self.edge.limits.header_timeout_s)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields_left -= 1
        if self._fields_left < 0:
            limit = self.edge.limits.max_headers
            self._refusal = (431, f"the request has more than {limit} header fields, the most this server reads")
            raise _Refused
        # uvicorn's, inline (one call less per header).
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_chunk_header(self) -> None:
        self._chunks_left -= 1
        if self._chunks_left < 0:  # the body goes on past the limit: refused as Triton refuses it, 400
            self._refusal = (400, CHUNKS_REFUSAL)
            self._refuse(400, CHUNKS_REFUSAL, reading=True)
            raise _Refused

    def on_headers_complete(self) -> None:
        self.head_complete()
        super().on_headers_complete()

    def head_complete(self) -> None:
        """The head is in: no more waiting for a request; the body's pace is watched from now on."""
        self._in_head = False
        self.edge.waiting.pop(self, None)
        if self._read_timer is None:
            self._arm_read_timer(self._last_read + self.edge.limits.body_timeout_s)

    def on_message_complete(self) -> None:
        self.expect_head()
        super().on_message_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        # uvicorn's (without ``reset_contextvars``, which ``server.py`` leaves off), keeping the task to cancel.
        task = self.loop.create_task(cycle.run_asgi(app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)
        self.running = (cycle, task)

    def on_response_complete(self) -> None:
        # uvicorn's, but the keep-alive wait costs a timer per idle spell, not per response (``_keep_alive_due``).
        self.running = None
        self.server_state.total_requests += 1
        if self.transport.is_closing() or self._linger_left is not None:
            return
        self.flow.resume_reading()
        if self.pipeline:
            self._idle_since = None
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = now = self.loop.time()
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_at(now + self.timeout_keep_alive, self._keep_alive_due)
        if self.cycle is None or self.cycle.response_complete:
            self.edge.waiting[self] = None  # at the end: it now waits the shortest

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn cancels its keep-alive timer on every request; here the timer stays and finds the
        # connection busy when it fires (``_keep_alive_due``).
        self._idle_since = None

    def _keep_alive_due(self) -> None:
        """uvicorn's keep-alive timeout: the connection is closed once it has been idle (no request
        read or running since its last response) for ``timeout_keep_alive``. One timer serves many
        requests: when it fires early (the connection was busy meanwhile) it waits again from the
        last response, or not at all while a request is in, whose response arms it again."""
        self.timeout_keep_alive_task = None
        since = self._idle_since
        if since is None:
            return
        due = since + self.timeout_keep_alive
        if self.loop.time() < due:
            self.timeout_keep_alive_task = self.loop.call_at(due, self._keep_alive_due)
            return
        self.timeout_keep_alive_handler()

    def _arm_read_timer(self, when: float) -> None:
        """Check the read deadline at ``when``, or earlier: a timer already due first stays (it
        re-arms from the state when it fires), so a keep-alive connection does not pay a new
        timer for every request."""
        timer = self._read_timer
        if (self.edge.limits.header_timeout_s if self._in_head else self.edge.limits.body_timeout_s) <= 0:
            if timer is not None:
                timer.cancel()
                self._read_timer = None
            return
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._read_timer = self.loop.call_at(when, self._check_read)

    def _check_read(self) -> None:
        """The read deadline, checked when due (not moved on every read: that would cost a timer
        per chunk): a head not in by its time, or a body silent too long, ends the connection."""
        self._read_timer = None
        if self.transport.is_closing() or self._linger_left is not None:
            return
        now = self.loop.time()
        limits = self.edge.limits
        if self.flow.read_paused:
            # Not the client's doing: we stopped reading (a request still running, an unread answer).
            self._arm_read_timer(now + (limits.header_timeout_s if self._in_head else limits.body_timeout_s))
            return
        if self._in_head:
            if self._head_started is None:
                return  # a request read, or between requests: uvicorn's keep-alive timeout watches those
            due = self._head_started + limits.header_timeout_s
            what = f"the request head did not arrive within {limits.header_timeout_s:g} s"
        else:
            due = self._last_read + limits.body_timeout_s
            what = f"the request body stopped arriving for {limits.body_timeout_s:g} s"
        if now < due:
            self._arm_read_timer(due)
            return
        log.debug("closing a connection: %s", what)
        self._refuse(408, what, reading=not self._in_head)

    # --- writing: a client that does not read its answers ----------------------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        timeout = self.edge.limits.write_timeout_s
        if timeout > 0 and self._write_timer is None:
            self._write_timer = self.loop.call_later(timeout, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        log.debug("dropping a connection that read none of its answer for %g s", self.edge.limits.write_timeout_s)
        self.edge.waiting.pop(self, None)
        self.transport.abort()  # what was queued for it goes too: close() would wait to send it

    # --- refusing ----------------------------------------------------------------------

    def _refuse(self, status: int, message: str, reading: bool = False) -> None:
        """Answer ``status`` and close; just close when an answer to an earlier request is still
        due on this connection (a second one would come out of order). ``reading``: the refusal
        is of the request whose body is being read (``self.cycle``), which has no answer yet."""
        self.edge.waiting.pop(self, None)
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or (reading and not cycle.response_started):
            body = orjson.dumps({"error": message})
            head = [STATUS_LINE[status]]
            for name, value in self.server_state.default_headers:
                head += [name, b": ", value, b"\r\n"]
            if status == 503:
                head.append(RETRY_AFTER_LINE)
            head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                        % len(body))
            self.transport.write(b"".join(head) + body)
        self.transport.close()


class CaseKeepingProtocol(HttpToolsProtocol):
    """Also keeps each header as the client wrote its name, under ``RAW_HEADERS`` in the
    ASGI scope: Triton hands forwarded headers (``--http-header-forward-pattern``) to the
    model with their names' case, which ASGI's lower-cased ``headers`` have lost. Only
    used when forwarding is on."""

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self.scope.setdefault(RAW_HEADERS, []).append((name.decode("latin-1"), value))  # type: ignore[misc]
