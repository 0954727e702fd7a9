"""HTTP/2 framing (RFC 9113 §4, §6): the constants and the few frames the server writes.

Every frame starts with a 9-byte header: a 24-bit payload length, an 8-bit
type, 8 bits of flags and a 31-bit stream id.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (§6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (§7).
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB

# Settings (§6.5.2).
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME_LIMIT = (1 << 24) - 1

HEAD = struct.Struct(">HBBBL")  # length split 16 + 8 bits, type, flags, stream id
SETTING = struct.Struct(">HL")
U32 = struct.Struct(">L")
GOAWAY_BODY = struct.Struct(">LL")
STREAM_MASK = 0x7FFF_FFFF


def head(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame header for a payload of ``length`` bytes."""
    return HEAD.pack(length >> 8, length & 0xFF, kind, flags, stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(payload) >> 8, len(payload) & 0xFF, kind, flags, stream) + payload


def settings(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(SETTING.pack(k, v) for k, v in values.items()))


SETTINGS_ACK = head(SETTINGS, ACK, 0, 0)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, U32.pack(increment))


def rst_stream(stream: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream, U32.pack(code))


def goaway(last_stream: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, GOAWAY_BODY.pack(last_stream, code) + debug)


def headers(stream: int, block: bytes, max_frame: int, end_stream: bool) -> list[bytes]:
    """A header block as a HEADERS frame, and CONTINUATION frames when it is
    larger than the peer's frame size."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return [head(HEADERS, flags | END_HEADERS, stream, len(block)), block]
    out = [head(HEADERS, flags, stream, max_frame), block[:max_frame]]
    pos = max_frame
    while pos < len(block):
        chunk = block[pos:pos + max_frame]
        pos += len(chunk)
        out += [head(CONTINUATION, END_HEADERS if pos >= len(block) else 0, stream, len(chunk)), chunk]
    return out
