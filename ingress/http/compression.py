"""HTTP body compression: gzip and deflate, the two codings Triton speaks.

``deflate`` means the zlib-wrapped stream (RFC 9110), which is what tritonclient
sends (``zlib.compress``) and expects back (``zlib.decompress``). Raw deflate
streams from other clients are accepted on input too.

Decompression is bounded: a request may not inflate past the body limit, so a
small "zip bomb" cannot exhaust memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from conveyor.proto.errors import ConveyorError, Status, invalid_arg

GZIP = "gzip"
DEFLATE = "deflate"

# zlib window bits: 16 + 15 selects the gzip wrapper, 15 the zlib wrapper, -15 raw deflate.
_GZIP_WBITS = 31
_ZLIB_WBITS = 15
_RAW_WBITS = -15

# Triton compresses with zlib's default level; tensor payloads gain little from more.
COMPRESS_LEVEL = 6


def request_coding(content_encoding: str | None) -> str | None:
    """The coding of a request body from its ``Content-Encoding``; None for identity."""
    if not content_encoding:
        return None
    coding = content_encoding.strip().lower()
    if coding in (GZIP, "x-gzip"):
        return GZIP
    if coding == DEFLATE:
        return DEFLATE
    if coding in ("identity", ""):
        return None
    raise ConveyorError(
        Status.UNSUPPORTED,
        f"unsupported Content-Encoding '{content_encoding}': use gzip, deflate or identity",
    )


def decompress(body: bytes, coding: str, limit: int) -> bytes:
    """Inflate ``body``; INVALID_ARG if it is corrupt, truncated or inflates past ``limit``."""
    if coding == GZIP:
        wbits = _GZIP_WBITS
    else:
        # Some clients send a bare deflate stream without the zlib header.
        wbits = _ZLIB_WBITS if _has_zlib_header(body) else _RAW_WBITS
    parts: list[bytes] = []
    size = 0
    data = body
    try:
        while True:
            d = zlib.decompressobj(wbits)
            # max_length caps what one call may produce: limit + 1 detects overflow.
            part = d.decompress(data, limit - size + 1)
            size += len(part)
            if size > limit:
                raise invalid_arg(f"the {coding} request body inflates past the limit of {limit} bytes")
            parts.append(part)
            if not d.eof:
                raise invalid_arg(f"the {coding} request body is truncated")
            data = d.unused_data
            if not data:
                break
            # gzip allows several members back to back (gzip.decompress reads them all).
            if wbits != _GZIP_WBITS:
                raise invalid_arg(f"the {coding} request body has trailing bytes after its stream")
    except zlib.error as exc:
        raise invalid_arg(f"failed to decompress the {coding} request body: {exc}") from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _has_zlib_header(body: bytes) -> bool:
    return len(body) >= 2 and body[0] & 0x0F == 8 and ((body[0] << 8) | body[1]) % 31 == 0


def response_coding(accept_encoding: str | None) -> str | None:
    """Pick the response coding from ``Accept-Encoding`` as Triton does: the gzip,
    deflate or identity entry with the highest q-value, the first one on ties.
    Returns None for identity (or nothing acceptable)."""
    if not accept_encoding:
        return None
    best: str | None = None
    best_q = 0.0
    for entry in accept_encoding.split(","):
        name, _, params = entry.partition(";")
        name = name.strip().lower()
        if name not in (GZIP, DEFLATE, "identity"):
            continue
        q = 1.0
        params = params.strip()
        if params:
            key, _, value = params.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    continue
        if q > best_q:
            best, best_q = name, q
    return None if best == "identity" else best


def compress(parts: Iterable[bytes | memoryview], coding: str) -> bytes:
    """Compress the concatenation of ``parts`` without joining them first."""
    wbits = _GZIP_WBITS if coding == GZIP else _ZLIB_WBITS
    c = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, wbits)
    out = [c.compress(p) for p in parts]
    out.append(c.flush())
    return b"".join(out)
