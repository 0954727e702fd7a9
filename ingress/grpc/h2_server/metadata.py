"""gRPC's headers: a call's request headers read (as h2 decoded them), and the
response headers and trailers the server sends (h2 encodes them)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from hpack import NeverIndexedHeaderTuple

# Headers of the protocol itself, not the application's metadata.
_RESERVED = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"})

_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


class RequestHead:
    """What the server needs from a call's request headers (``fields``: h2's, as bytes)."""

    __slots__ = ("_fields", "_metadata", "content_type", "encoding", "method", "path", "timeout_s")

    def __init__(self, fields: Sequence[tuple[bytes, bytes]]) -> None:
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


Headers = list[tuple[bytes, bytes]]

RESPONSE_HEAD: Headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
# A request that is not gRPC (its content-type) gets HTTP's 415, as gRPC over HTTP/2 asks.
UNSUPPORTED_MEDIA_TYPE: Headers = [(b":status", b"415")]
OK_TRAILERS: Headers = [(b"grpc-status", b"0")]


def percent_encode(message: str) -> bytes:
    """``grpc-message``'s encoding: printable ASCII but '%' as is, the rest %XX of UTF-8."""
    raw = message.encode()
    if all(0x20 <= b <= 0x7E and b != 0x25 for b in raw):
        return raw
    return b"".join(bytes([b]) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in raw)


def trailers(code: int, message: str = "") -> Headers:
    if not code and not message:
        return OK_TRAILERS
    block: Headers = [(b"grpc-status", str(code).encode())]
    if message:
        # Never indexed: a message is often unique (it names a model, an input, a size), and indexed
        # ones would fill the HPACK table that the client sizes (SETTINGS_HEADER_TABLE_SIZE, up to 4 GiB).
        block.append(NeverIndexedHeaderTuple(b"grpc-message", percent_encode(message)))
    return block
