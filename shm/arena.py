"""A server-owned POSIX shared-memory arena: one segment, carved into blocks.

Two ways a block comes back:

* ``alloc``/``free``: the owner frees it (the ingress frees a request's input
  block once the router has answered that request).
* ``alloc_released``: the block goes to other processes and comes back when
  every consumer has written ``RELEASED`` into its release flag (the worker's
  output blocks: each ingress that copied its rows out sets its flag). The owner
  reclaims flagged blocks lazily, before an allocation, once enough was allocated
  since it last looked (see ``RECLAIM_BLOCKS``). No message is needed.

A release flag is one byte: ``OUTSTANDING`` (0), ``RELEASED`` (1), or ``HELD``
(2): the router keeps the block past its response (an ensemble's intermediate
tensor, a cached response; see ARCHITECTURE.md) and alone writes ``RELEASED``
later. A held block is exempt from the abandonment timeout, since the router
may keep it for minutes; ``drop_holds`` frees them when that router is gone.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import posix_ipc

from conveyor.proto.errors import ConveyorError, unavailable
from conveyor.shm.allocator import ALIGN, BlockAllocator
from conveyor.shm.naming import HOLD_TRIES, hold

log = logging.getLogger(__name__)

# A consumer copies its bytes out within milliseconds of the response; a block
# still flagged-out after this long belongs to a consumer that died.
ABANDONED_AFTER_S = 120.0

# ``alloc_released`` reads the pending blocks' flags once their number has doubled since it last
# did (and is at least this), or once this many bytes were handed out since: a scan before every
# allocation cost O(blocks out) each time, about 32 per engine step with 32 streams. The bytes bound
# keeps large blocks coming back soon, while their memory is still in the caches.
RECLAIM_BLOCKS = 16
RECLAIM_BYTES = 4 << 20

# Release flag values (one byte each).
OUTSTANDING = 0
RELEASED = 1
HELD = 2


@dataclass(slots=True)
class _Pending:
    start: int
    flags_at: int
    consumers: int
    created: float  # time.monotonic()


def arena_full(nbytes: int, capacity: int) -> ConveyorError:
    """No room for ``nbytes``. Triton's words first (its Python backend's, when its shared-memory pool
    cannot grow; its QA matches them), then what to do; never the segment's name (CVE-2025-23320's class:
    a client learns nothing of the server's shared memory), which the server logs (``Arena.alloc``)."""
    return unavailable(
        f"Failed to increase the shared memory pool size: the server's arena is full "
        f"({nbytes} bytes requested, {capacity} in all): retry later or raise --arena-size"
    )


class Arena:
    """Owns segment ``name`` (created here, unlinked by ``close``)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        for _ in range(HOLD_TRIES):
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=capacity)
            if hold(shm.fd, name):  # fd kept open until close: the lock says the owner lives (naming.py)
                break
            shm.close_fd()
        else:
            raise OSError(f"shared-memory segment '{name}' was unlinked as soon as it was made, {HOLD_TRIES} times")
        self._fd = shm.fd
        try:
            self._mmap = mmap.mmap(shm.fd, capacity)
        except BaseException:
            self._unlink()
            raise
        self.array = np.frombuffer(self._mmap, dtype=np.uint8)
        self._alloc = BlockAllocator(capacity)
        self._pending: list[_Pending] = []
        self._reclaim_at = RECLAIM_BLOCKS  # pending blocks that make the next alloc_released look
        self._since_reclaim = 0  # bytes alloc_released handed out since the last look
        self.refusals = 0  # allocations refused for want of room (logged with the name, sparsely)

    # --- owner-freed blocks ----------------------------------------------------------

    def alloc(self, nbytes: int) -> int:
        start = self._alloc.alloc(nbytes)
        if start is None and self._pending:
            self.reclaim()
            start = self._alloc.alloc(nbytes)
        if start is None:
            self.refusals += 1
            if self.refusals & (self.refusals - 1) == 0:  # the 1st, 2nd, 4th, 8th...: a flood logs a few lines
                log.warning("shared-memory arena '%s' is full: %d bytes refused (%d refusals so far)",
                            self.name, nbytes, self.refusals)
            raise arena_full(nbytes, self.capacity)
        return start

    def free(self, start: int) -> None:
        self._alloc.free(start)

    def view(self, start: int, nbytes: int) -> np.ndarray:
        return self.array[start : start + nbytes]

    def put(self, start: int, data: bytes) -> None:
        """Copy ``data`` in at ``start`` (through the mapping: cheaper than a numpy view for small writes)."""
        self._mmap[start : start + len(data)] = data

    def put_buffer(self, start: int, nbytes: int, data: Any) -> None:
        """Copy the ``nbytes`` of C-contiguous buffer ``data`` (a numpy array) in at ``start``, as ``put``."""
        self._mmap[start : start + nbytes] = data

    # --- consumer-released blocks -------------------------------------------------------

    def alloc_released(self, nbytes: int, consumers: int) -> tuple[int, int]:
        """A block of ``nbytes`` plus ``consumers`` release flags in front of it.

        Returns ``(payload_offset, flags_offset)``; consumer ``i`` releases by
        writing ``RELEASED`` at ``flags_offset + i``.
        """
        header = (consumers + ALIGN - 1) // ALIGN * ALIGN
        if len(self._pending) >= self._reclaim_at or self._since_reclaim >= RECLAIM_BYTES:
            self.reclaim()
        start = self._alloc.alloc(header + nbytes)
        if start is None:  # ``alloc`` looks anyway when the arena is full (a new ``_pending``), or refuses
            start = self.alloc(header + nbytes)
        self._since_reclaim += header + nbytes
        if consumers == 1:
            self._mmap[start] = OUTSTANDING  # the usual one flag: no bytes object to make
        else:
            self._mmap[start : start + consumers] = bytes(consumers)
        self._pending.append(_Pending(start, start, consumers, time.monotonic()))
        return start + header, start

    def reclaim(self) -> int:
        """Free every block whose consumers have all released it (or that was
        abandoned by a consumer that died, unless the router holds it)."""
        keep: list[_Pending] = []
        freed = 0
        # Flags are read through the mmap as ints and bytes: a numpy comparison per
        # block cost microseconds.
        mm = self._mmap
        stale = time.monotonic() - ABANDONED_AFTER_S
        for p in self._pending:
            at, n = p.flags_at, p.consumers
            if n == 1:
                flag = mm[at]
                done = flag == RELEASED or (p.created < stale and flag != HELD)
            else:
                flags = mm[at : at + n]
                done = flags.count(RELEASED) == n or (p.created < stale and HELD not in flags)
            if done:
                self._alloc.free(p.start)
                freed += 1
            else:
                keep.append(p)
        self._pending = keep
        self._reclaim_at = max(RECLAIM_BLOCKS, 2 * len(keep))
        self._since_reclaim = 0
        return freed

    def drop_holds(self) -> None:
        """The router that held blocks is gone (it restarted): they are released."""
        arr = self.array
        for p in self._pending:
            flags = arr[p.flags_at : p.flags_at + p.consumers]
            flags[flags == HELD] = RELEASED

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def _unlink(self) -> None:
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass
        if self._fd >= 0:
            os.close(self._fd)  # and the owner lock with it
            self._fd = -1

    def close(self) -> None:
        self._unlink()
        # Views handed out may still exist; the mapping goes when they do.
        del self.array
        try:
            self._mmap.close()
        except BufferError:
            pass
