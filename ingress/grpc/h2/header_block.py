"""HPACK (RFC 7541) for the gRPC server: request header blocks in, response ones out.

Requests are decoded with the ``hpack`` package, behind a cache: a gRPC
client's header block for its N-th call on a connection is usually the same
few one-byte references into the dynamic table as for its previous call, and
such a block cannot change the table, so the same bytes mean the same headers
until some block does change it (which empties the cache).

Responses are written by hand without touching either dynamic table (every
field a static-table reference or a literal "without indexing"), so there is
no encoder state to keep and the common blocks are constants.
"""

from __future__ import annotations

import base64
from typing import Any

import hpack

# Bytes 0x80..0xFE: an indexed field whose index fits the first byte (RFC 7541 §6.1).
_ONE_BYTE_INDEXED = bytes(range(0x80, 0xFF))
_CACHE_BLOCKS = 64

# Headers of the protocol itself, not the application's metadata.
_RESERVED = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"})

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class RequestHead:
    """What the server needs from a call's request headers."""

    __slots__ = ("_fields", "_metadata", "content_type", "encoding", "method", "path", "timeout_s")

    def __init__(self, fields: list[tuple[bytes, bytes]]) -> None:
        self._fields = fields
        self._metadata: tuple[tuple[str, Any], ...] | None = None
        self.path = self.method = self.content_type = self.encoding = ""
        self.timeout_s: float | None = None
        for name, value in fields:
            if name == b":path":
                self.path = value.decode("latin-1")
            elif name == b":method":
                self.method = value.decode("latin-1")
            elif name == b"content-type":
                self.content_type = value.decode("latin-1")
            elif name == b"grpc-timeout":
                self.timeout_s = parse_timeout(value.decode("latin-1"))
            elif name == b"grpc-encoding":
                self.encoding = value.decode("latin-1")

    def metadata(self) -> tuple[tuple[str, Any], ...]:
        """As grpcio's ``invocation_metadata()``: text values as str, ``-bin`` ones as bytes."""
        if self._metadata is None:
            out: list[tuple[str, Any]] = []
            for name, value in self._fields:
                if name[:1] == b":" or name in _RESERVED:
                    continue
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
                else:
                    out.append((key, value.decode("latin-1")))
            self._metadata = tuple(out)
        return self._metadata


def parse_timeout(text: str) -> float | None:
    """``grpc-timeout``: up to 8 digits and a unit; a malformed one is ignored."""
    unit = _TIMEOUT_UNITS.get(text[-1:])
    if unit is None or not text[:-1].isdigit():
        return None
    return int(text[:-1]) * unit


class RequestDecoder:
    """One connection's HPACK decoder, with the cache described above."""

    def __init__(self, max_header_list_size: int) -> None:
        self._hpack = hpack.Decoder(max_header_list_size=max_header_list_size)
        self._seen: dict[bytes, RequestHead] = {}

    def decode(self, block: bytes) -> RequestHead:
        """Raises ``hpack.HPACKError`` (a connection error) on a bad block."""
        head = self._seen.get(block)
        if head is not None:
            return head
        head = RequestHead(list(self._hpack.decode(block, raw=True)))
        if block.translate(None, _ONE_BYTE_INDEXED):
            self._seen.clear()  # the block may have changed the dynamic table
        elif len(self._seen) < _CACHE_BLOCKS:
            self._seen[block] = head
        return head


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    return _integer(len(raw), 7, 0) + raw


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing, new name (§6.2.2)."""
    return b"\x00" + _string(name) + _string(value)


_STATUS_200 = b"\x88"  # static table entry 8
_CONTENT_TYPE = _integer(31, 4, 0) + _string(b"application/grpc")  # static name 31, without indexing

RESPONSE_HEAD = _STATUS_200 + _CONTENT_TYPE
# A request that is not gRPC (its content-type): :status 415, static name 8, without indexing.
UNSUPPORTED_MEDIA_TYPE = _integer(8, 4, 0) + _string(b"415")


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: printable ASCII but '%' as is, the rest %XX of UTF-8."""
    raw = message.encode()
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def trailers(code: int, message: str = "") -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", percent_encode(message))
    return block


OK_TRAILERS = trailers(0)
