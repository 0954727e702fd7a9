"""gRPC's length-prefixed messages (a flag byte, a 4-byte length, the bytes) cut
out of a stream's DATA, however the frames and the reads split them."""

from __future__ import annotations

from typing import Any

# Triton accepts tensors up to protobuf's own 2 GiB message limit.
MAX_MESSAGE_BYTES = (1 << 31) - 1
# A message this large is handed on as a view of the bytes read, not copied out.
VIEW_BYTES = 1 << 16
# A message split over reads gets a buffer of its size up to this; past it, the buffer grows.
PREALLOCATE_BYTES = 1 << 26


class MessageTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"Received message larger than max ({size} vs. {MAX_MESSAGE_BYTES})")  # grpc's words
        self.size = size


class MessageReader:
    """One stream's messages. Each is copied once: out of the DATA when it is
    whole there (not at all when large: a view of immutable bytes), else into a
    buffer of its size as its pieces arrive."""

    __slots__ = ("_body", "_filled", "_flag", "_prefix", "_size")

    def __init__(self) -> None:
        self._prefix: bytearray | None = None  # a prefix cut by a frame's end
        self._body: bytearray | None = None  # a message cut by a frame's end
        self._size = self._flag = self._filled = 0

    @property
    def partial(self) -> bool:
        """Whether the DATA so far ended inside a message."""
        return self._prefix is not None or self._body is not None

    def feed(self, data: bytes | memoryview, start: int, end: int) -> list[tuple[int, Any]]:
        """The messages ``data[start:end]`` completes, as (flag, bytes-like).
        Raises ``MessageTooLarge`` for one over the limit (the reader is then spent)."""
        out: list[tuple[int, Any]] = []
        while start < end:
            body = self._body
            if body is None:  # at a message's prefix
                prefix = self._prefix
                if prefix is None and end - start >= 5:
                    flag, size = data[start], int.from_bytes(data[start + 1:start + 5], "big")
                    start += 5
                else:
                    prefix = prefix if prefix is not None else bytearray()
                    take = min(5 - len(prefix), end - start)
                    prefix += data[start:start + take]
                    start += take
                    if len(prefix) < 5:
                        self._prefix = prefix
                        return out
                    self._prefix = None
                    flag, size = prefix[0], int.from_bytes(prefix[1:5], "big")
                if size > MAX_MESSAGE_BYTES:
                    raise MessageTooLarge(size)
                if end - start >= size:  # the usual case: the whole message is here
                    if size < VIEW_BYTES or not isinstance(data, bytes):
                        out.append((flag, data[start:start + size]))
                    else:
                        out.append((flag, memoryview(data)[start:start + size]))
                    start += size
                    continue
                self._body = body = bytearray(size) if size <= PREALLOCATE_BYTES else bytearray()
                self._size, self._flag, self._filled = size, flag, 0
            take = min(self._size - self._filled, end - start)
            if len(body) == self._size:
                body[self._filled:self._filled + take] = data[start:start + take]
            else:  # not preallocated (huge): grows as it arrives
                body += data[start:start + take]
            self._filled += take
            start += take
            if self._filled == self._size:
                self._body = None
                out.append((self._flag, body))
        return out
