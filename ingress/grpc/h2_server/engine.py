"""The HTTP/2 engine under the gRPC server: the seam between gRPC's mapping (``connection``,
``outbound``, ``calls``…, one piece of code) and the library that parses frames, HPACK, stream
states and flow-control windows. Two engines: ``H2Engine`` here (python-hyper's h2) and
``ngh2_engine.Ngh2Engine`` (libnghttp2 through ``ngh2``; the one module that imports it).

An engine is fed a connection's bytes and calls its ``Sink`` (the connection) once per protocol
event, with plain values; the connection answers through the engine's few sending calls and
writes ``data_to_send()`` once per loop turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hyperframe.frame import GoAwayFrame

from conveyor.ingress.grpc.h2_server.limits import (
    CLOSED_STREAMS_REMEMBERED,
    CONNECTION_WINDOW,
    FEED_FRAMES,
    H2_STREAM_CEILING,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    STREAM_WINDOW,
)
from conveyor.ingress.grpc.h2_server.metadata import OK_TRAILERS, RESPONSE_HEAD, RequestHead

Headers = Sequence[tuple[bytes, bytes]]

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x0, 0x1, 0x2, 0x7, 0xB
KEEPALIVE_PING = b"keepaliv"  # the opaque data of the server's keepalive PINGs (one outstanding at a time)
BDP_PING = b"bdpprobe"  # the opaque data of the server's BDP probes (limits.BDP_PROBE_BYTES; one outstanding)


class EngineError(Exception):
    """The connection is over (the engine's GOAWAY, if any, is in ``data_to_send()``)."""


class Sink(Protocol):
    """What an engine tells the connection (``connection.GrpcConnection``)."""

    @property
    def dead(self) -> bool: ...  # the connection is over: the rest of what was fed is dropped

    def on_request(self, sid: int, head: RequestHead, ended: bool) -> None: ...
    def on_data(self, sid: int, data: bytes, credit: int, ended: bool) -> None: ...
    def on_end(self, sid: int) -> None: ...
    def on_reset(self, sid: int, remote: bool) -> None: ...
    def on_window(self, sid: int) -> None: ...  # 0: the connection's window; -1: every stream's
    def on_settings(self, window_changed: bool) -> None: ...
    def on_ping(self) -> None: ...
    def on_ping_ack(self, data: bytes) -> None: ...  # the client acknowledged a PING of the server's
    def on_goaway(self) -> None: ...


class Engine(Protocol):
    """The calls the gRPC server makes of its HTTP/2 engine."""

    name: str
    # What ``send`` and ``window`` raise when the stream or the connection is gone in the library before
    # its event reached the connection (the client's RST_STREAM or GOAWAY in the read being handled, a
    # stream the library reset itself): the answer is dropped. ``respond``, ``trailers`` and ``reset``
    # drop it themselves; ``send``, once per message, is the library's own call.
    gone: tuple[type[Exception], ...]
    # Since the connection last cleared it, the engine queued on its own what gRPC core's ping policies count as
    # the server writing (``connection._reset_ping_clock``): a connection WINDOW_UPDATE (``acknowledge``), or an
    # answer of its own (ngh2's refusal of metadata over the limit).
    wrote: bool
    # Events of one piece of a read past which the next pieces are smaller (limits.FEED_FRAMES, NGH2_FEED_FRAMES).
    feed_frames: int

    def start(self) -> None: ...  # the server's preface (SETTINGS) and the connection's window
    def feed(self, data: bytes | memoryview) -> int: ...  # events handled; raises EngineError
    @property
    def alive(self) -> bool: ...  # False once the engine ended the connection itself (its GOAWAY queued)
    def data_to_send(self) -> bytes: ...
    def respond(self, sid: int, headers: Headers, end_stream: bool = False) -> None: ...  # nothing if gone
    def trailers(self, sid: int, headers: Headers) -> None: ...  # nothing on a stream gone
    def send(self, sid: int, data: bytes | memoryview) -> None: ...  # raises ``gone`` on a stream gone
    # A unary call's whole answer, as respond(RESPONSE_HEAD), send(message), trailers(OK_TRAILERS) in one call: when
    # the client's windows take ``message`` in one piece now (True), else nothing is sent (False). Raises ``gone``.
    def answer(self, sid: int, message: bytes) -> bool: ...
    def window(self, sid: int) -> int: ...  # DATA bytes ``sid`` may send now, in one piece; raises ``gone``
    def acknowledge(self, credit: int, sid: int) -> None: ...
    def reset(self, sid: int, code: int) -> None: ...  # nothing on a stream already closed
    def calm(self, why: str) -> None: ...  # GOAWAY ENHANCE_YOUR_CALM: the client spent a budget
    def graceful_goaway(self) -> bytes: ...  # GOAWAY NO_ERROR; bytes to write after data_to_send()
    def ping(self, data: bytes) -> None: ...  # a PING of the server's; its ACK calls on_ping_ack(data)
    # Larger receive windows (never smaller): SETTINGS_INITIAL_WINDOW_SIZE for every stream, open ones too
    # (applied when the client acknowledges it), and a connection WINDOW_UPDATE.
    def grow(self, stream_window: int, connection_window: int) -> None: ...


_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,  # header names and values stay bytes
    validate_inbound_headers=True,
    normalize_inbound_headers=True,
    # What the server sends is its own constant headers and percent-encoded messages.
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
    split_outbound_cookies=False,
)

_LOCAL_SETTINGS = {
    SettingCodes.ENABLE_PUSH: 0,
    SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
    SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
    SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
    SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
}


class _H2(h2.connection.H2Connection):
    MAX_CLOSED_STREAMS = CLOSED_STREAMS_REMEMBERED


class H2Engine:
    """python-hyper's h2 (pure Python)."""

    name = "h2"
    alive = True  # h2 raises from receive_data when it ends the connection
    # h2 knows of the client's RST_STREAM or GOAWAY before its events are handled: a send on that stream
    # (or on a connection closed) raises one of these ProtocolErrors (StreamClosedError, …).
    gone: tuple[type[Exception], ...] = (h2.exceptions.ProtocolError,)
    wrote = False
    feed_frames = FEED_FRAMES

    def __init__(self, sink: Sink) -> None:
        self._sink = sink
        h2c = self._h2 = _H2(_CONFIG)
        h2c.local_settings = h2.settings.Settings(client=False, initial_values=_LOCAL_SETTINGS)
        h2c.max_inbound_frame_size = MAX_FRAME_SIZE
        h2c.decoder.max_header_list_size = MAX_HEADER_LIST_SIZE
        self._stream_window = STREAM_WINDOW  # what the SETTINGS sent last advertise
        self.data_to_send = h2c.data_to_send
        self.send = h2c.send_data
        self._dispatch: dict[type, Callable[[Any], None]] = {
            h2.events.RequestReceived: lambda e: sink.on_request(
                e.stream_id, RequestHead(e.headers), e.stream_ended is not None),
            h2.events.DataReceived: lambda e: sink.on_data(
                e.stream_id, e.data, e.flow_controlled_length, e.stream_ended is not None),
            h2.events.StreamEnded: lambda e: sink.on_end(e.stream_id),
            h2.events.StreamReset: lambda e: sink.on_reset(e.stream_id, e.remote_reset),
            h2.events.WindowUpdated: lambda e: sink.on_window(e.stream_id),
            h2.events.RemoteSettingsChanged: lambda e: sink.on_settings(
                SettingCodes.INITIAL_WINDOW_SIZE in e.changed_settings),
            h2.events.PingReceived: lambda e: sink.on_ping(),
            h2.events.PingAckReceived: lambda e: sink.on_ping_ack(e.ping_data),
            h2.events.ConnectionTerminated: lambda e: sink.on_goaway(),
        }

    def start(self) -> None:
        h2c = self._h2
        h2c.initiate_connection()
        h2c.increment_flow_control_window(CONNECTION_WINDOW - h2c.inbound_flow_control_window)
        # The SETTINGS frame above advertised MAX_CONCURRENT_STREAMS; h2's own check now uses the
        # ceiling (see H2_STREAM_CEILING). Nothing else is pending in the local settings, so the
        # client's acknowledgement later changes nothing.
        h2c.local_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = H2_STREAM_CEILING
        h2c.local_settings.acknowledge()

    def feed(self, data: bytes | memoryview) -> int:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as err:  # flow control, too many streams or CONTINUATION, a bad frame
            raise EngineError(f"HTTP/2 connection error: {err}") from None  # h2 has queued its GOAWAY
        dispatch = self._dispatch
        sink = self._sink
        for event in events:
            handler = dispatch.get(type(event))
            if handler is not None:
                handler(event)
                if sink.dead:
                    break
        return len(events)

    def respond(self, sid: int, headers: Headers, end_stream: bool = False) -> None:
        try:
            self._h2.send_headers(sid, headers, end_stream=end_stream)
        except h2.exceptions.ProtocolError:  # gone (see ``gone``)
            pass

    def trailers(self, sid: int, headers: Headers) -> None:
        try:
            self._h2.send_headers(sid, headers, end_stream=True)
        except h2.exceptions.ProtocolError:  # gone (see ``gone``)
            pass

    def answer(self, sid: int, message: bytes) -> bool:
        h2c = self._h2
        if len(message) > min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size):
            return False
        self.respond(sid, RESPONSE_HEAD)
        h2c.send_data(sid, message)
        self.trailers(sid, OK_TRAILERS)
        return True

    def window(self, sid: int) -> int:
        h2c = self._h2
        return min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size)

    def acknowledge(self, credit: int, sid: int) -> None:
        h2c = self._h2
        window = h2c.inbound_flow_control_window  # grows only by the WINDOW_UPDATE h2 queues for the connection
        h2c.acknowledge_received_data(credit, sid)
        if h2c.inbound_flow_control_window != window:
            self.wrote = True

    def reset(self, sid: int, code: int) -> None:
        try:
            self._h2.reset_stream(sid, code)
        except h2.exceptions.ProtocolError:  # the client's END_STREAM, RST_STREAM or GOAWAY is in h2 already
            pass

    def calm(self, why: str) -> None:
        self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM, additional_data=why.encode())

    def graceful_goaway(self) -> bytes:
        # h2 sends nothing once it has sent a GOAWAY of its own (its connection state machine is
        # then closed), so this graceful one is built with hyperframe, h2's frame layer, and
        # written after h2's output; h2 goes on serving the streams it has.
        last = self._h2.highest_inbound_stream_id
        return bytes(GoAwayFrame(0, last_stream_id=last, error_code=ErrorCodes.NO_ERROR).serialize())

    def ping(self, data: bytes) -> None:
        self._h2.ping(data)

    def grow(self, stream_window: int, connection_window: int) -> None:
        h2c = self._h2
        if stream_window > self._stream_window:
            h2c.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: stream_window})
            self._stream_window = stream_window
        # h2 credits the connection up to its window manager's maximum, which a WINDOW_UPDATE raises only as
        # far as the window then open: the new maximum is set too (h2 has no public call for it).
        manager = h2c._inbound_flow_control_window_manager
        if connection_window > manager.max_window_size:
            h2c.increment_flow_control_window(connection_window - manager.max_window_size)
            manager.max_window_size = connection_window
            self.wrote = True


ENGINES = ("h2", "ngh2")


def ngh2_problem() -> str:
    """Why the ngh2 engine must not serve in this process (its start-up self-test), or ''."""
    try:
        from conveyor.ingress.grpc.h2_server import ngh2_engine

        return ngh2_engine.self_test()
    except Exception as err:  # not installed, or any failure of the test itself: h2 serves instead
        return f"{type(err).__name__}: {err}"


def engine_class(name: str) -> Callable[[Sink], Engine]:
    """The engine called ``name`` (``ENGINES``): what makes one for each connection."""
    if name == "ngh2":
        from conveyor.ingress.grpc.h2_server.ngh2_engine import Ngh2Engine

        return Ngh2Engine
    if name != "h2":
        raise ValueError(f"no HTTP/2 engine {name!r} (one of {', '.join(ENGINES)})")
    return H2Engine
