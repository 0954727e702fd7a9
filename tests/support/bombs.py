"""Decompression bombs (CVE-2025-33201's class) and what is watched while one goes off.

A bomb is made with zlib a mebibyte of filler at a time, so the test process never holds
what it inflates to. ``post`` sends one over HTTP on a raw socket (the server may answer
before it has read it all, and close); ``grpc_call`` sends one as a compressed gRPC message
over an ``h2`` client connection that keeps to flow control. ``MemoryPeak`` reads the
highest resident memory of processes over a block (the kernel's VmHWM, reset first).
"""

from __future__ import annotations

import functools
import http.client
import socket
import time
import zlib
from typing import Any

import orjson

GZIP_WBITS, ZLIB_WBITS = 31, 15
_MIB = 1 << 20


@functools.cache
def bomb(coding: str, inflated: int, prefix: bytes = b"", filler: bytes = b" ") -> bytes:
    """``prefix`` then ``filler`` up to ``inflated`` bytes, gzip- or deflate-compressed (zlib's
    wrapper, which tritonclient and grpc send) at level 9."""
    c = zlib.compressobj(9, zlib.DEFLATED, GZIP_WBITS if coding == "gzip" else ZLIB_WBITS)
    parts = [c.compress(prefix)]
    block = filler * (_MIB // len(filler))
    left = inflated - len(prefix)
    while left > 0:
        piece = block if left >= len(block) else block[:left]
        parts.append(c.compress(piece))
        left -= len(piece)
    parts.append(c.flush())
    return b"".join(parts)


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST ``body`` to ``path`` on loopback; (status, JSON body, response headers)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Content-Length": str(len(body))}.items())
        try:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: bomb\r\n{head}\r\n".encode() + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before taking it all: the answer is still read
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        return response.status, orjson.loads(data), {k.lower(): v for k, v in response.getheaders()}
    finally:
        sock.close()


def _status_field(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


class MemoryPeak:
    """How far the resident memory of ``pids`` rose over the block: the most any one rose, from
    its resident size at the start to its high-water mark (VmHWM, which the block resets by
    writing 5 to /proc/<pid>/clear_refs)."""

    def __init__(self, pids: set[int]) -> None:
        self.pids = pids
        self.start: dict[int, int] = {}
        self.growth = 0

    def __enter__(self) -> MemoryPeak:
        for pid in self.pids:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
            self.start[pid] = _status_field(pid, "VmRSS")
        return self

    def __exit__(self, *_: object) -> None:
        self.growth = max(_status_field(pid, "VmHWM") - rss for pid, rss in self.start.items())


# --- gRPC ------------------------------------------------------------------------------------

SERVICE = "/inference.GRPCInferenceService/"


def infer_request_bomb(coding: str, inflated: int) -> bytes:
    """A ModelInferRequest for ``simple`` whose INPUT0 raw contents are ``inflated`` zero bytes,
    compressed: the protobuf's fields, then field 7 (raw_input_contents) with its length, the
    zeros made by ``bomb``."""
    from conveyor.proto import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="simple")
    request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, inflated // 4])
    head = bytes(request.SerializeToString()) + bytes([7 << 3 | 2]) + _varint(inflated)
    return bomb(coding, len(head) + inflated, head, b"\0")


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def grpc_call(port: int, method: str, payload: bytes, encoding: str, timeout: float = 30.0) -> tuple[str, str]:
    """One unary call whose message is ``payload``, flagged compressed with ``encoding``, on a new
    HTTP/2 connection; (grpc-status, grpc-message) of its answer."""
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        sock.sendall(conn.data_to_send())
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
                                (":authority", "bomb"), ("content-type", "application/grpc"), ("te", "trailers"),
                                ("grpc-encoding", encoding)])
        wire = memoryview(b"\1" + len(payload).to_bytes(4, "big") + payload)
        fields: dict[bytes, bytes] = {}
        while time.monotonic() < deadline:
            while wire:
                room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(wire))
                if room <= 0:
                    break
                try:
                    conn.send_data(sid, bytes(wire[:room]), end_stream=room == len(wire))
                except h2.exceptions.StreamClosedError:  # answered before it was all sent
                    wire = wire[:0]
                    break
                wire = wire[room:]
            sock.sendall(conn.data_to_send())
            data = sock.recv(1 << 16)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    fields.update(dict(event.headers))
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset) and event.stream_id == sid:
                    return fields.get(b"grpc-status", b"").decode(), fields.get(b"grpc-message", b"").decode()
        raise AssertionError(f"no answer to the call: {fields}")
    finally:
        sock.close()
