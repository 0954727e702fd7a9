"""The HTTP/2 engine on libnghttp2 (the vendored 1.70.0 of ``ngh2`` 0.3.0, pinned in pyproject.toml):
the ONE module that imports ``ngh2``, so that a change of its 0.x API touches this file only.

What ngh2 leaves to its user, done here:
- on a fatal limit (CONTINUATION flood, ack flood, a header list over its limit) it raises from
  ``receive_data`` and drops the connection's state without a GOAWAY: the GOAWAY is built here (the
  connection then lingers as on h2);
- flow control by consumption (``auto_window_update=False``): the connection credits what its calls
  consume (``acknowledge``), against the same budgets as on h2;
- a header list over its limit ends the connection: its limit is above MAX_HEADER_LIST_SIZE
  (NGH2_HEADER_LIST_SIZE) and a call whose metadata is over MAX_HEADER_LIST_SIZE is answered
  RESOURCE_EXHAUSTED here, as gRPC core answers it, the connection going on;
- its outbound body queue is unbounded: ``window`` tells what the client's windows take less what
  is queued already, and the server sends no more than that (``outbound.pump``).
"""

from __future__ import annotations

import struct
from typing import Any, NoReturn

import ngh2
from hpack import NeverIndexedHeaderTuple
from ngh2 import Configuration, Role, Setting

from conveyor.ingress.grpc.h2_server.engine import (
    ENHANCE_YOUR_CALM,
    INTERNAL_ERROR,
    NO_ERROR,
    PROTOCOL_ERROR,
    EngineError,
    Headers,
    Sink,
)
from conveyor.ingress.grpc.h2_server.limits import (
    CONNECTION_WINDOW,
    HEAD_CACHE_BYTES,
    HEAD_CACHE_ENTRIES,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    NGH2_FEED_FRAMES,
    NGH2_HEADER_LIST_SIZE,
    NGH2_MAX_CONTINUATIONS,
    NGH2_MAX_OUTBOUND_ACK,
    NGH2_RESET_RATE,
    STREAM_WINDOW,
)
from conveyor.ingress.grpc.h2_server.metadata import OK_TRAILERS, RESPONSE_HEAD, RequestHead, trailers

_RESOURCE_EXHAUSTED = 8
# What a sending call raises when the stream (the client's RST_STREAM in the same read as the frame being
# answered) or the connection (nghttp2 is sending its GOAWAY) is gone: the answer is dropped.
_GONE = (ngh2.StreamUnavailableError, ngh2.ConnectionStateError)

# The version this adapter was written and tested against (pyproject.toml pins it).
PINNED_VERSION = "0.3.0"

_CONFIG = Configuration(
    auto_window_update=False,  # credited as calls consume (connection.py)
    max_inbound_header_list_size=NGH2_HEADER_LIST_SIZE,  # the call's own limit is MAX_HEADER_LIST_SIZE
    max_continuations=NGH2_MAX_CONTINUATIONS,
    max_outbound_ack=NGH2_MAX_OUTBOUND_ACK,
    # The connection's own reset budget (GOAWAY ENHANCE_YOUR_CALM) is smaller and trips first;
    # nghttp2's (GOAWAY INTERNAL_ERROR) stays as a backstop.
    stream_reset_rate_limit=NGH2_RESET_RATE,
)

_SETTINGS = {
    Setting.ENABLE_PUSH: 0,
    Setting.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
    Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
    Setting.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
    Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
}

# The events of every call, dispatched on their type (module globals: one lookup each, not two).
_DataReceived, _RequestReceived = ngh2.DataReceived, ngh2.RequestReceived
_WindowUpdated, _StreamClosed = ngh2.WindowUpdated, ngh2.StreamClosed

_GOAWAY_HEAD = struct.Struct(">I B B I I I")  # length(24 of 32) type flags stream last-stream-id code
_INITIAL_WINDOW_SIZE = int(Setting.INITIAL_WINDOW_SIZE)


def goaway_frame(last_stream_id: int, code: int, why: bytes = b"") -> bytes:
    """A GOAWAY frame (RFC 9113 §6.8), for when ngh2 has dropped the connection's state."""
    head = _GOAWAY_HEAD.pack(8 + len(why), 0x7, 0, 0, last_stream_id & 0x7FFFFFFF, code)
    return head[1:] + why  # the length is 24 bits


def _never_indexed(headers: Headers) -> Headers:
    """hpack's never-indexed marker (metadata.trailers) as ngh2's."""
    return [ngh2.NeverIndexedHeader(h[0], h[1]) if isinstance(h, NeverIndexedHeaderTuple) else h for h in headers]


class Ngh2Engine:
    """libnghttp2 through ngh2 (Cython)."""

    name = "ngh2"
    gone: tuple[type[Exception], ...] = _GONE
    wrote = False
    feed_frames = NGH2_FEED_FRAMES

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        c = self._c = ngh2.Connection(Role.SERVER, _CONFIG)
        self._last = 0  # the highest stream the client opened (for a GOAWAY built here)
        self._fatal: bytes | None = None  # ngh2 failed: the GOAWAY built here, then nothing
        self._done: list[int] = []  # streams answered whole, reset NO_ERROR once the answer is written
        # Request heads by their header list (limits.HEAD_CACHE_ENTRIES): a client repeats the same few lists, each
        # parsed and its size summed once. A head is never changed once made, so calls may share it.
        self._heads: dict[tuple[tuple[bytes, bytes], ...], RequestHead] = {}
        self._stream_window = STREAM_WINDOW  # what the SETTINGS sent last advertise
        self._connection_window = CONNECTION_WINDOW
        self.send = c.send_data

    def start(self) -> None:
        c = self._c
        c.initiate_connection(_SETTINGS)
        c.set_local_window_size(CONNECTION_WINDOW)

    def feed(self, data: bytes | memoryview) -> int:
        c = self._c
        try:
            c.receive_data(data)
            events: list[Any] = c.events()  # dispatched on their exact type, below (the most frequent first)
        except ngh2.DenialOfServiceError as err:  # a limit: CONTINUATION, PING/SETTINGS acks, header list
            self._fail(ENHANCE_YOUR_CALM, str(err))
        except ngh2.ProtocolError as err:
            self._fail(PROTOCOL_ERROR, str(err))
        except ngh2.NGH2Error as err:
            self._fail(INTERNAL_ERROR, str(err))
        sink = self._sink
        for event in events:
            kind = type(event)
            if kind is _DataReceived:
                sid = event.stream_id
                chunk = event.data
                ended = event.end_stream
                sink.on_data(sid, chunk, len(chunk), ended)  # nghttp2 credits padding
                if ended and not sink.dead:
                    sink.on_end(sid)
            elif kind is _RequestReceived:
                sid = self._last = event.stream_id
                ended = event.end_stream
                headers = event.headers
                head = self._heads.get(headers)
                if head is None:
                    head = self._head(sid, headers, ended)
                    if head is None:  # over MAX_HEADER_LIST_SIZE: answered
                        continue
                sink.on_request(sid, head, ended)
                if ended and not sink.dead:
                    sink.on_end(sid)
            elif kind is _WindowUpdated:
                sink.on_window(event.stream_id)
            elif kind is _StreamClosed:
                sink.on_reset(event.stream_id, False)  # nothing once the call is over
            elif kind is ngh2.TrailersReceived:
                sink.on_end(event.stream_id)
            elif kind is ngh2.StreamReset:
                sink.on_reset(event.stream_id, True)
            elif kind is ngh2.SettingsReceived:
                sink.on_settings(_INITIAL_WINDOW_SIZE in event.settings)
            elif kind is ngh2.PingReceived:
                sink.on_ping()
            elif kind is ngh2.PingAcknowledged:
                sink.on_ping_ack(event.opaque_data)
            elif kind is ngh2.GoAwayReceived:
                sink.on_goaway()
            else:
                continue
            if sink.dead:
                break
        return len(events)

    def _head(self, sid: int, headers: tuple[tuple[bytes, bytes], ...], ended: bool) -> RequestHead | None:
        """A header list not in the cache: parsed (and kept when small), or answered when over MAX_HEADER_LIST_SIZE."""
        size = 32 * len(headers) + sum([len(n) + len(v) for n, v in headers])  # RFC 9113 §6.5.2
        if size > MAX_HEADER_LIST_SIZE:
            self._too_large(sid, size, ended)
            return None
        head = RequestHead(headers)
        if size <= HEAD_CACHE_BYTES:
            heads = self._heads
            if len(heads) >= HEAD_CACHE_ENTRIES:
                heads.clear()
            heads[headers] = head
        return head

    def _too_large(self, sid: int, size: int, ended: bool) -> None:
        """A call whose metadata is over MAX_HEADER_LIST_SIZE: RESOURCE_EXHAUSTED, the call never runs (what
        it sends next is on a stream the connection does not know: credited back and dropped)."""
        message = f"received metadata size exceeds hard limit ({size} vs. {MAX_HEADER_LIST_SIZE})"
        self.respond(sid, RESPONSE_HEAD + trailers(_RESOURCE_EXHAUSTED, message), end_stream=True)
        self.wrote = True
        if not ended:
            self.reset(sid, NO_ERROR)

    def _fail(self, code: int, why: str) -> NoReturn:
        """ngh2 has dropped the connection: what the client gets is this GOAWAY."""
        self._fatal = goaway_frame(self._last, code, why.encode()[:256])
        raise EngineError(f"HTTP/2 connection error: {why}")

    @property
    def alive(self) -> bool:
        return self._fatal is None and self._c.want_read

    def data_to_send(self) -> bytes:
        fatal = self._fatal
        if fatal is not None:
            self._fatal = b""
            return fatal
        c = self._c
        data = c.data_to_send()
        if self._done:
            done, self._done = self._done, []
            for sid in done:
                try:
                    c.reset_stream(sid, NO_ERROR)
                except _GONE:  # the client's END_STREAM closed it meanwhile, or nghttp2 is ending the connection
                    pass
            data += c.data_to_send()
        return data

    def respond(self, sid: int, headers: Headers, end_stream: bool = False) -> None:
        if headers is not RESPONSE_HEAD:
            headers = _never_indexed(headers)
        try:
            self._c.send_response(sid, headers, end_stream=end_stream)
        except _GONE:
            pass

    def trailers(self, sid: int, headers: Headers) -> None:
        if headers is not OK_TRAILERS:
            headers = _never_indexed(headers)
        try:
            self._c.send_trailers(sid, headers)
        except _GONE:
            pass

    def answer(self, sid: int, message: bytes) -> bool:
        c = self._c
        size = len(message)  # what ``window`` allows, below
        if size > c.stream_remote_window_size(sid) - c.queued_body_size(sid) or (
                size > c.remote_window_size - c.queued_body_size()):
            return False
        try:
            c.send_response(sid, RESPONSE_HEAD)
        except _GONE:  # as respond: then send_data raises it too
            pass
        c.send_data(sid, message)
        try:
            c.send_trailers(sid, OK_TRAILERS)
        except _GONE:  # as trailers
            pass
        return True

    def window(self, sid: int) -> int:
        # nghttp2 takes from the windows as it writes DATA, not as it is queued: what is queued counts.
        c = self._c
        return min(c.stream_remote_window_size(sid) - c.queued_body_size(sid),
                   c.remote_window_size - c.queued_body_size())

    def acknowledge(self, credit: int, sid: int) -> None:
        if credit:
            c = self._c
            window = c.local_window_size  # grows only by the WINDOW_UPDATE nghttp2 queues for the connection
            c.acknowledge_received_data(credit, sid)
            if c.local_window_size != window:
                self.wrote = True

    def reset(self, sid: int, code: int) -> None:
        if code == NO_ERROR:
            # nghttp2 writes a RST_STREAM before the HEADERS and DATA queued on its stream (and drops
            # them): the answer leaves first, at the next data_to_send.
            self._done.append(sid)
            return
        try:
            self._c.reset_stream(sid, code)
        except _GONE:  # closed already
            pass

    def calm(self, why: str) -> None:
        self._c.send_goaway(ENHANCE_YOUR_CALM, debug_data=why.encode())

    def graceful_goaway(self) -> bytes:
        self._c.send_goaway(NO_ERROR)  # nghttp2 goes on serving the streams it has
        return b""

    def ping(self, data: bytes) -> None:
        self._c.ping(data)

    def grow(self, stream_window: int, connection_window: int) -> None:
        c = self._c
        try:
            if stream_window > self._stream_window:
                c.update_settings({_INITIAL_WINDOW_SIZE: stream_window})
                self._stream_window = stream_window
            if connection_window > self._connection_window:
                c.set_local_window_size(connection_window)  # nghttp2 sends the difference as a WINDOW_UPDATE
                self._connection_window = connection_window
                self.wrote = True
        except _GONE:  # nghttp2 is ending the connection
            pass


# --- the start-up self-test -------------------------------------------------------------------------

class _Recorder:
    """A sink that keeps what the engine reports (the self-test's server side)."""

    dead = False

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def on_request(self, sid: int, head: RequestHead, ended: bool) -> None:
        self.seen.append(("request", sid, head.path, ended))

    def on_data(self, sid: int, data: bytes, credit: int, ended: bool) -> None:
        self.seen.append(("data", sid, bytes(data), ended))

    def on_end(self, sid: int) -> None:
        self.seen.append(("end", sid))

    def on_reset(self, sid: int, remote: bool) -> None:
        self.seen.append(("reset", sid, remote))

    def on_window(self, sid: int) -> None:
        pass

    def on_settings(self, window_changed: bool) -> None:
        pass

    def on_ping_ack(self, data: bytes) -> None:
        pass

    def on_ping(self) -> None:
        pass

    def on_goaway(self) -> None:
        self.seen.append(("goaway",))


def foreign_libnghttp2(maps: str) -> list[str]:
    """Other libnghttp2 libraries mapped in this process (``maps``: /proc/self/maps): their exported
    ``nghttp2_*`` symbols could take the place of ngh2's own (it links without -Bsymbolic), and a
    Connection would then crash the process."""
    return sorted({line.split()[-1] for line in maps.splitlines() if "libnghttp2" in line})


def self_test() -> str:
    """Why this process must not serve on ngh2, or '' (issue 44: run before the first connection).

    The pinned version; no other libnghttp2 mapped; an in-memory unary call with trailers through this
    adapter; CONTINUATION and PING floods trip (GOAWAY ENHANCE_YOUR_CALM); the limits are the ones advertised."""
    if ngh2.__version__ != PINNED_VERSION:
        return f"ngh2 {ngh2.__version__} is installed, this server was tested with {PINNED_VERSION}"
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            foreign = foreign_libnghttp2(f.read())
    except OSError:  # not Linux: nothing can be checked, and nothing seen
        foreign = []
    if foreign:
        return f"another libnghttp2 is loaded in this process ({', '.join(foreign)}): ngh2 could bind to it"
    recorder = _Recorder()
    server = Ngh2Engine(recorder)
    server.start()
    client = ngh2.Connection(Role.CLIENT)
    client.initiate_connection()
    client.receive_data(server.data_to_send())
    advertised: dict[int, int] = {}
    for event in client.events():
        if isinstance(event, ngh2.SettingsReceived):
            advertised.update(event.settings)
    wanted = {int(k): v for k, v in _SETTINGS.items() if k != Setting.ENABLE_PUSH}
    if {k: advertised.get(k) for k in wanted} != wanted:
        return f"the SETTINGS sent are {advertised}, not {wanted}"
    path = b"/inference.GRPCInferenceService/ServerLive"
    sid = client.send_request([(b":method", b"POST"), (b":scheme", b"http"), (b":path", path),
                               (b":authority", b"self-test"), (b"content-type", b"application/grpc"),
                               (b"te", b"trailers")])
    client.send_data(sid, b"\0\0\0\0\0", end_stream=True)
    server.feed(client.data_to_send())
    if recorder.seen != [("request", sid, path.decode(), False), ("data", sid, b"\0\0\0\0\0", True), ("end", sid)]:
        return f"the server saw {recorder.seen}"
    server.acknowledge(5, sid)
    server.respond(sid, RESPONSE_HEAD)
    server.send(sid, b"\0\0\0\0\2\x08\x01")
    server.trailers(sid, trailers(3, "self-test"))
    client.receive_data(server.data_to_send())
    got = [type(e).__name__ for e in client.events() if not isinstance(e, ngh2.SettingsAcknowledged)]
    if got[:3] != ["ResponseReceived", "DataReceived", "TrailersReceived"]:
        return f"the client saw {got}"
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\0\0\0\x04\0\0\0\0\0"  # and an empty SETTINGS
    # A CONTINUATION flood (CVE-2024-28182), and PINGs whose acknowledgements are never written.
    block = b"\x83\x86"  # :method POST, :scheme http (HPACK static table), the block never ended
    continuations = len(block).to_bytes(3, "big") + b"\x01\0\0\0\0\x01" + block  # HEADERS without END_HEADERS
    continuations += b"\0\0\0\x09\0\0\0\0\x01" * (NGH2_MAX_CONTINUATIONS + 2)
    pings = b"\0\0\x08\x06\0\0\0\0\0" + b"\0" * 8
    for name, flood in (("CONTINUATION", continuations), ("PING", pings * (NGH2_MAX_OUTBOUND_ACK + 10))):
        flooded = Ngh2Engine(_Recorder())
        flooded.start()
        flooded.data_to_send()
        try:
            flooded.feed(preface + flood)
        except EngineError:
            goaway = flooded.data_to_send()
            if goaway[3:4] != b"\x07" or int.from_bytes(goaway[13:17], "big") != ENHANCE_YOUR_CALM:
                return f"a {name} flood was answered {goaway[:17].hex()}, not GOAWAY ENHANCE_YOUR_CALM"
            continue
        return f"a {name} flood was not stopped"
    return ""
