"""zlib inflation in bounded steps, for request bodies (HTTP ``Content-Encoding``) and
messages (gRPC ``grpc-encoding``) that may be bombs (CVE-2025-33201's class).

``Inflate`` takes its input as it arrives (``give``) and inflates it a step at a time
(``step``): the first step takes all the input given and makes at most ``INFLATE_FIRST``
of output, each later one takes at most ``INFLATE_INPUT`` of input and makes at most
``INFLATE_STEP``; the step whose output would pass the limit raises ``InflatedTooLarge``
instead. So a bomb costs the limit, plus a step, in memory and in time, whatever it
would inflate to; and the caller can charge each step to its budgets, or move the steps
off its event loop, as it goes.

The steps' outputs are kept as they come and joined once at the end (``finish``): a
buffer grown step by step would be copied by the allocator as it grows (while it is
below glibc's mmap threshold, up to 32 MiB), and hold up to half as much again. zlib
copies each step's output once (out of its blocks); a body that the first step
inflates whole is that one piece, with no join: as fast as one unbounded call.
"""

from __future__ import annotations

import zlib

# The most the first step makes: a body that inflates to no more (a 1 MB gzip JSON request inflates to
# 3 to 5 MB) is one piece, copied once, as one unbounded call would; it holds twice that while zlib
# copies it out of its blocks.
INFLATE_FIRST = 8 << 20
# The most each later step makes: what a body may hold past its limit while the step that passes it is
# refused, and the longest stretch of inflating between two looks at the limit (about a millisecond).
INFLATE_STEP = 1 << 20
# The most input one step takes: zlib copies what a step leaves of its input (``unconsumed_tail``),
# so bounding it keeps a large compressed body linear to inflate however many steps it takes.
INFLATE_INPUT = 1 << 16


class InflatedTooLarge(Exception):
    """The output would pass the limit."""


class Truncated(Exception):
    """The input ended inside the compressed stream."""


class TrailingBytes(Exception):
    """Bytes after the end of a stream that is not one of gzip's back-to-back members."""


class Inflate:
    """One compressed stream (``wbits`` as zlib's), inflated to at most ``limit`` bytes.
    ``members``: gzip's members back to back are one body (as ``gzip.decompress`` reads them)."""

    __slots__ = ("_d", "_first", "_limit", "_members", "_more", "_parts", "_rest", "_tail", "_wbits", "size")

    def __init__(self, wbits: int, limit: int, *, members: bool = False, first: int = INFLATE_FIRST) -> None:
        self._wbits = wbits
        self._limit = limit
        self._members = members
        self._first = first  # the first step's most output; 0 once it ran
        self._d = zlib.decompressobj(wbits)
        self._tail = b""  # what the last step left of its input
        self._rest: memoryview = memoryview(b"")  # input not yet given to zlib
        self._more = False  # the last step filled its output: zlib may hold more with no input left
        self._parts: list[bytes] = []
        self.size = 0  # bytes made so far

    def give(self, data: bytes | bytearray | memoryview) -> None:
        """More input; only once the last is all inflated (``more`` is False)."""
        self._rest = memoryview(data)

    @property
    def more(self) -> bool:
        """Whether a ``step`` has something to do."""
        return self._more or bool(self._tail) or bool(self._rest)

    def step(self) -> int:
        """Inflate one step; the bytes it made. Raises ``InflatedTooLarge``, ``TrailingBytes`` or
        ``zlib.error`` (corrupt)."""
        d = self._d
        data: bytes | memoryview = self._tail
        first, self._first = self._first, 0
        if not data:
            take = len(self._rest) if first else INFLATE_INPUT
            data, self._rest = self._rest[:take], self._rest[take:]
        if d.eof and data:
            if not self._members:
                raise TrailingBytes
            d = self._d = zlib.decompressobj(self._wbits)
        room = self._limit - self.size + 1  # one byte past the limit tells it is over
        cap = min(room, first or INFLATE_STEP)
        part = d.decompress(data, cap)
        if len(part) == room:
            self._parts = []  # a refused body frees its memory at once
            raise InflatedTooLarge
        if part:
            self._parts.append(part)
            self.size += len(part)
        if d.eof:
            self._tail, self._more = d.unused_data, False
        else:
            self._tail = d.unconsumed_tail
            self._more = len(part) == cap  # a full step may leave output in zlib with no input left
        if len(self._tail) > INFLATE_INPUT and not self._rest:
            # What the first step left of its input is taken a slice at a time, as any other.
            self._rest, self._tail = memoryview(self._tail), b""
        return len(part)

    def finish(self) -> bytes:
        """The inflated bytes, once every input is given and stepped; ``Truncated`` when the stream did not end."""
        if not self._d.eof:
            raise Truncated
        parts, self._parts = self._parts, []
        return parts[0] if len(parts) == 1 else b"".join(parts)
