"""Release flags in the router's own segment, lent to whoever reads held blocks.

A response made of blocks the router holds (an ensemble's outputs, a cached
response) cannot hand the worker's own flag to the ingress: the router still
holds the block, and a cached block is read by many responses. Instead the
response carries one flag of the router's segment ``conveyor.<g>.router.<pid>``
(a *loan*); the loan holds every block of the response until the ingress writes
``RELEASED`` into it. ``collect`` notices returned loans lazily, as a worker's
arena does. A loan still out after the arena's abandonment timeout belongs to a
consumer that died and is collected too, unless a router-side reader (an outer
ensemble) marked it ``HELD``.

The segment is created on the first loan: a server without ensembles or a
response cache has none.
"""

from __future__ import annotations

import time

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.errors import unavailable
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.shm.arena import ABANDONED_AFTER_S, HELD, OUTSTANDING, RELEASED, Arena

DEFAULT_LOANS = 1 << 16


class Loans:
    def __init__(self, name: str, holds: HeldBlocks, slots: int = DEFAULT_LOANS) -> None:
        self.name = name
        self._holds = holds
        self._slots = slots
        self._segment: Arena | None = None
        self._free: list[int] = []
        self._out: dict[int, tuple[list[m.Release], float]] = {}  # slot -> (blocks, lent at)

    def __len__(self) -> int:
        return len(self._out)

    def lend(self, blocks: list[m.Release]) -> m.Release:
        """A flag whose release hands ``blocks`` back (each is held until then)."""
        segment = self._open()
        if self._out:
            self.collect()
        if not self._free:
            raise unavailable(f"{self._slots} responses of held blocks are being read already: retry later")
        slot = self._free.pop()
        segment.array[slot] = OUTSTANDING
        for block in blocks:
            self._holds.hold(block)
        self._out[slot] = (blocks, time.monotonic())
        return m.Release(segment.name, slot)

    def take_back(self, loan: m.Release) -> None:
        """A loan never handed out (its response was dropped): its blocks go back now."""
        if self._segment is None or loan.region != self._segment.name:
            return
        entry = self._out.pop(loan.offset, None)
        if entry is None:
            return
        for block in entry[0]:
            self._holds.drop(block)
        self._segment.array[loan.offset] = OUTSTANDING
        self._free.append(loan.offset)

    def collect(self, expire: bool = False) -> int:
        """Take back returned loans (and, with ``expire``, abandoned ones); how many."""
        if not self._out or self._segment is None:
            return 0
        flags = self._segment.array
        slots = np.fromiter(self._out, dtype=np.int64, count=len(self._out))
        values = flags[slots]
        done = set(slots[values == RELEASED].tolist())
        if expire:
            stale = time.monotonic() - ABANDONED_AFTER_S
            done |= {s for s, (_, lent) in self._out.items() if lent < stale and flags[s] != HELD}
        for slot in done:
            blocks, _ = self._out.pop(slot)
            for block in blocks:
                self._holds.drop(block)
            flags[slot] = OUTSTANDING
            self._free.append(slot)
        return len(done)

    def _open(self) -> Arena:
        if self._segment is None:
            self._segment = Arena(self.name, self._slots)
            self._free = list(range(self._slots - 1, -1, -1))
        return self._segment

    def close(self) -> None:
        if self._segment is not None:
            self._segment.close()
            self._segment = None
