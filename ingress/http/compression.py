"""HTTP body compression: gzip and deflate, the two codings Triton speaks.

``deflate`` means the zlib-wrapped stream (RFC 9110), which is what tritonclient
sends (``zlib.compress``) and expects back (``zlib.decompress``). Raw deflate
streams from other clients are accepted on input too.

Decompression is bounded and incremental (``Inflater``): a body inflates as it
arrives, and stops at its limit, the one its uncompressed form has: a small "zip
bomb" costs the limit in memory and time, not what it would inflate to.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from conveyor.ingress.inflate import Inflate, InflatedTooLarge, TrailingBytes, Truncated
from conveyor.proto.errors import ConveyorError, Status, invalid_arg

GZIP = "gzip"
DEFLATE = "deflate"

# zlib window bits: 16 + 15 selects the gzip wrapper, 15 the zlib wrapper, -15 raw deflate.
_GZIP_WBITS = 31
_ZLIB_WBITS = 15
_RAW_WBITS = -15

# Compressed bytes gathered before a body starts to inflate: a body this small is inflated whole at its
# end, in one piece (zlib can then copy its output once); a larger one inflates as the rest arrives, and a
# bomb is refused having sent no more than this (its Content-Length may say gigabytes).
GATHER_BYTES = 1 << 20
# What one chunk may inflate to on the event loop before the rest goes to a worker thread: a few
# milliseconds of zlib at most (the first step, of a gathered body, may make up to ``INFLATE_FIRST``).
INLINE_INFLATE = 2 << 20

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


class Inflater:
    """A compressed request body inflated as its bytes arrive (``inflate.Inflate``), to at
    most ``limit`` bytes: a bomb costs the limit, not what it would inflate to.

    ``feed`` gathers the body's first ``GATHER_BYTES`` (a normal body is all of it: inflated
    at ``end`` in one piece, as fast as one unbounded call), then inflates each chunk as far
    as ``INLINE_INFLATE`` of output; when there is more, ``drain`` does the rest, on a worker
    thread if the caller likes (zlib releases the GIL). ``finish`` checks the stream ended
    and hands over the body. Errors are INVALID_ARG: corrupt, truncated, trailing bytes, or
    past ``limit`` (Triton's words, naming ``flag``, the flag that sets the limit)."""

    __slots__ = ("_coding", "_flag", "_gathered", "_inflate", "_limit", "_size")

    def __init__(self, coding: str, limit: int, flag: str = "--http-max-body-bytes") -> None:
        self._coding = coding
        self._limit = limit
        self._flag = flag
        self._inflate: Inflate | None = None  # from the first bytes given (deflate's wrapper is known from them)
        self._gathered: list[bytes] | None = []  # None once inflating
        self._size = 0  # bytes gathered

    def feed(self, data: bytes) -> bool:
        """Take ``data``; True when there is more to inflate than was done here, left for ``drain``."""
        gathered = self._gathered
        if gathered is not None:
            gathered.append(data)
            self._size += len(data)
            if self._size < GATHER_BYTES:
                return False
            self._gathered = None
            data = b"".join(gathered)
        return self._inflated(data)

    def end(self) -> bool:
        """The body is all given; True when there is more to inflate, left for ``drain``."""
        gathered, self._gathered = self._gathered, None
        return self._inflated(b"".join(gathered)) if gathered else self._left()

    def _inflated(self, data: bytes) -> bool:
        inflate = self._inflate
        if inflate is None:
            if not data:
                return False
            if self._coding == GZIP:
                wbits = _GZIP_WBITS
            else:  # some clients send a bare deflate stream without the zlib header
                wbits = _ZLIB_WBITS if _has_zlib_header(data) else _RAW_WBITS
            inflate = self._inflate = Inflate(wbits, self._limit, members=wbits == _GZIP_WBITS)
        if data:
            inflate.give(data)
            made = 0
            while inflate.more and made < INLINE_INFLATE:
                made += self._step(inflate)
        return inflate.more

    def _left(self) -> bool:
        return self._inflate is not None and self._inflate.more

    def drain(self) -> None:
        """Inflate what ``feed`` or ``end`` left (may run on a worker thread: nothing else touches this meanwhile)."""
        inflate = self._inflate
        while inflate is not None and inflate.more:
            self._step(inflate)

    def _step(self, inflate: Inflate) -> int:
        try:
            return inflate.step()
        except InflatedTooLarge:
            raise inflated_too_large(self._limit, self._flag) from None
        except TrailingBytes:
            raise invalid_arg(f"the {self._coding} request body has trailing bytes after its stream") from None
        except zlib.error as exc:
            raise invalid_arg(f"failed to decompress the {self._coding} request body: {exc}") from None

    def finish(self) -> bytes:
        """The whole inflated body; INVALID_ARG when its stream did not end."""
        try:
            if self._inflate is None:
                raise Truncated
            return self._inflate.finish()
        except Truncated:
            raise invalid_arg(f"the {self._coding} request body is truncated") from None


def inflated_too_large(limit: int, flag: str = "--http-max-body-bytes") -> ConveyorError:
    # Triton's words (DataCompressor::DecompressData), then which of ``conveyor serve``'s flags sets this limit.
    return invalid_arg(
        f"Decompressed data size exceeds the maximum allowed value of {limit} bytes. "
        f"Use --http-max-input-size to increase the limit. (conveyor serve: {flag})"
    )


def decompress(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` inflated whole; INVALID_ARG if it is corrupt, truncated or inflates past ``limit``."""
    inflater = Inflater(coding, limit)
    inflater.feed(body)
    inflater.end()
    inflater.drain()
    return inflater.finish()


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
