"""gRPC's length-prefixed messages (a flag byte, a 4-byte length, the bytes) cut out of
a stream's DATA, however the frames split them; and the budgets that bound the bytes
held for messages that are not complete yet."""

from __future__ import annotations

from typing import Any

# Triton accepts tensors up to protobuf's own 2 GiB message limit (a connection's buffer limit,
# below, may be lower: a message larger than that could never arrive whole).
MAX_MESSAGE_BYTES = (1 << 31) - 1
# A compressed message that inflates past the message limit: gRPC's words and status (RESOURCE_EXHAUSTED),
# those of grpc core's MessageDecompress, which also stops inflating at the limit.
DECOMPRESSED_TOO_LARGE = "Decompressed message larger than max"
# A message this large that arrives in one DATA frame is handed on as a view of its bytes, not copied out.
VIEW_BYTES = 1 << 16


class MessageTooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"Received message larger than max ({size} vs. {limit})")  # grpc's words
        self.size = size


class MessageReader:
    """One stream's messages. A message that arrives in one DATA frame is cut out of it (a
    view when large); one that spans frames is kept as the frames' pieces as they arrive
    and joined once when whole. Its buffer grows with the bytes that came, never with the
    length its prefix declares: a prefix costs nothing until the bytes follow."""

    __slots__ = ("_flag", "_have", "_head", "_limit", "_pieces", "_size")

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._limit = limit
        self._head = b""  # a prefix cut by a frame's end
        self._pieces: list[Any] | None = None  # a message cut by a frame's end
        self._size = self._flag = self._have = 0

    @property
    def partial(self) -> bool:
        """Whether the DATA so far ended inside a message."""
        return bool(self._head) or self._pieces is not None

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        """The messages ``data`` (one DATA frame's payload) completes, as (flag, bytes-like).
        Raises ``MessageTooLarge`` for a prefix over the limit (the reader is then spent)."""
        end = len(data)
        if end >= 5 and self._pieces is None and not self._head:  # the usual case: one frame, one whole message
            size = int.from_bytes(data[1:5], "big")
            if size + 5 == end and size < VIEW_BYTES:
                if size > self._limit:
                    raise MessageTooLarge(size, self._limit)
                return [(data[0], data[5:])]
        out: list[tuple[int, Any]] = []
        pos = 0
        while pos < end:
            if self._pieces is None:  # at a message's prefix
                if self._head:
                    take = min(5 - len(self._head), end - pos)
                    self._head += data[pos:pos + take]
                    pos += take
                    if len(self._head) < 5:
                        return out
                    head, self._head = self._head, b""
                    flag, size = head[0], int.from_bytes(head[1:5], "big")
                elif end - pos >= 5:
                    flag, size = data[pos], int.from_bytes(data[pos + 1:pos + 5], "big")
                    pos += 5
                else:
                    self._head = data[pos:end]
                    return out
                if size > self._limit:
                    raise MessageTooLarge(size, self._limit)
                if end - pos >= size:  # the usual case: the whole message is here
                    out.append((flag, data[pos:pos + size] if size < VIEW_BYTES else memoryview(data)[pos:pos + size]))
                    pos += size
                    continue
                self._pieces, self._size, self._flag, self._have = [], size, flag, 0
            take = min(self._size - self._have, end - pos)
            # A frame that is all message is kept as it came (h2 made it a bytes object of its own).
            self._pieces.append(data if take == end else memoryview(data)[pos:pos + take])
            self._have += take
            pos += take
            if self._have == self._size:
                pieces, self._pieces = self._pieces, None
                out.append((self._flag, b"".join(pieces)))
        return out


class ByteBudget:
    """Bytes a connection, or the whole process, may hold for request messages that are not
    yet their call's. ``limit`` 0: no limit."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.limit and self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size
