"""Blocks of other processes' arenas that the router keeps past their response.

An ensemble's intermediate tensors and a cached response stay where the worker
wrote them; the router keeps their block alive by writing ``HELD`` into its
release flag (the worker then neither frees it nor times it out) and writes
``RELEASED`` once nothing needs it any more. The router maps those segments only
to write these flag bytes: it never reads or copies tensor bytes.

Holds are counted per flag: the first ``hold`` writes ``HELD``, the last ``drop``
writes ``RELEASED``.
"""

from __future__ import annotations

import logging

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.shm.arena import HELD, RELEASED
from conveyor.shm.regions import RegionCache

log = logging.getLogger(__name__)


class HeldBlocks:
    def __init__(self, regions: RegionCache | None = None) -> None:
        self._regions = regions if regions is not None else RegionCache()
        self._counts: dict[tuple[str, int], int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def hold(self, flag: m.Release) -> None:
        key = (flag.region, flag.offset)
        count = self._counts.get(key, 0)
        if count == 0:
            self._write(flag, HELD)
        self._counts[key] = count + 1

    def drop(self, flag: m.Release) -> None:
        key = (flag.region, flag.offset)
        count = self._counts.get(key)
        if count is None:
            return  # its region was forgotten (the worker left)
        if count > 1:
            self._counts[key] = count - 1
            return
        del self._counts[key]
        self._write(flag, RELEASED)

    def release(self, flag: m.Release) -> None:
        """Hand back a block nobody holds (e.g. one that came with an error)."""
        if (flag.region, flag.offset) not in self._counts:
            self._write(flag, RELEASED)

    def forget_region(self, region: str) -> None:
        """Its owner exited (the segment is gone with it): stop tracking its blocks."""
        for key in [k for k in self._counts if k[0] == region]:
            del self._counts[key]
        self._regions.forget(region)

    def _write(self, flag: m.Release, value: int) -> None:
        try:
            self._regions.view(flag.region, flag.offset, 1)[0] = value
        except ConveyorError as exc:
            log.warning("cannot write a release flag in '%s': %s", flag.region, exc.message)
