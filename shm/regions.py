"""Maps other processes' segments by name, once, and hands out numpy views (``view``), or plain
memoryviews (``span``) for a reader that only copies the bytes out.

Those are the group's own segments (``/conveyor.<group>.<role>.<pid>``): a failure names none of them
to the client it reaches (CVE-2025-23320's class), and logs the name here."""

from __future__ import annotations

import logging
import mmap

import numpy as np
import posix_ipc

from conveyor.proto.errors import internal, unavailable

log = logging.getLogger(__name__)


class RegionCache:
    """Opens named POSIX segments lazily and keeps them mapped until ``forget``."""

    def __init__(self) -> None:
        self._maps: dict[str, np.ndarray] = {}
        self.mapped = self._maps  # read-only for callers: a segment's array when mapped (``array`` maps it)
        self._buffers: dict[str, memoryview] = {}  # ``span``'s: a memoryview slice costs less than an array's

    def array(self, name: str) -> np.ndarray:
        arr = self._maps.get(name)
        if arr is None:
            arr = self._open(name)
            self._maps[name] = arr
        return arr

    def view(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        arr = self.array(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > arr.shape[0]:
            raise _outside(name, offset, nbytes, arr.shape[0])
        return arr[offset : offset + nbytes]

    def span(self, name: str, offset: int, nbytes: int) -> memoryview:
        """``view``'s bytes as a memoryview (format ``B``), with its checks and errors."""
        buf = self._buffers.get(name)
        if buf is None:
            buf = self._buffers[name] = self.array(name).data
        if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
            raise _outside(name, offset, nbytes, buf.nbytes)
        return buf[offset : offset + nbytes]

    @staticmethod
    def _open(name: str) -> np.ndarray:
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            log.warning("shared-memory segment '%s' does not exist (its process is gone)", name)
            raise unavailable("a shared-memory segment of the server is gone (the process that held it "
                              "stopped): retry") from None
        try:
            if shm.size == 0:
                log.error("shared-memory segment '%s' is empty", name)
                raise internal("a shared-memory segment of the server is empty")
            mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        return np.frombuffer(mm, dtype=np.uint8)

    def forget(self, name: str) -> None:
        self._maps.pop(name, None)
        self._buffers.pop(name, None)

    def clear(self) -> None:
        self._maps.clear()
        self._buffers.clear()


def _outside(name: str, offset: int, nbytes: int, size: int) -> Exception:
    """A range outside its segment: logged with the segment's name, which the client's error does not hold."""
    log.error("shared-memory range [%d, %d) is outside segment '%s' of %d bytes", offset, offset + nbytes, name, size)
    return internal(f"a tensor's range [{offset}, {offset + nbytes}) lies outside the server's "
                    f"shared-memory segment of {size} bytes")
