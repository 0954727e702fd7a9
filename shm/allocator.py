"""First-fit block allocator over a byte range (bookkeeping only, no memory)."""

from __future__ import annotations

import bisect

ALIGN = 64  # cache-line aligned blocks: numpy views and ORT like aligned data


class BlockAllocator:
    """Hands out aligned ``[offset, offset+size)`` ranges of a ``capacity``-byte space.

    Free ranges are kept sorted and coalesced, so blocks may be freed in any order.
    Single-threaded: each arena is used by its owner's event loop only.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free_starts: list[int] = [0]
        self._free_sizes: list[int] = [capacity]
        self._used: dict[int, int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    def alloc(self, nbytes: int) -> int | None:
        size = (max(nbytes, 1) + ALIGN - 1) & ~(ALIGN - 1)  # aligned up; inline: once per request on the hot path
        sizes = self._free_sizes
        for i, free in enumerate(sizes):
            if free >= size:
                starts = self._free_starts
                start = starts[i]
                if free == size:
                    del starts[i]
                    del sizes[i]
                else:
                    starts[i] = start + size
                    sizes[i] = free - size
                self._used[start] = size
                return start
        return None

    def free(self, start: int) -> None:
        size = self._used.pop(start)
        i = bisect.bisect_left(self._free_starts, start)
        # Merge with the following free range.
        if i < len(self._free_starts) and self._free_starts[i] == start + size:
            size += self._free_sizes[i]
            del self._free_starts[i]
            del self._free_sizes[i]
        # Merge with the preceding free range.
        if i > 0 and self._free_starts[i - 1] + self._free_sizes[i - 1] == start:
            self._free_sizes[i - 1] += size
            return
        self._free_starts.insert(i, start)
        self._free_sizes.insert(i, size)

    def __contains__(self, start: int) -> bool:
        return start in self._used
