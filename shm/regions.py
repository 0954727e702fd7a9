"""Maps other processes' segments by name, once, and hands out numpy views."""

from __future__ import annotations

import mmap

import numpy as np
import posix_ipc

from conveyor.proto.errors import invalid_arg, unavailable


class RegionCache:
    """Opens named POSIX segments lazily and keeps them mapped until ``forget``."""

    def __init__(self) -> None:
        self._maps: dict[str, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        arr = self._maps.get(name)
        if arr is None:
            arr = self._open(name)
            self._maps[name] = arr
        return arr

    def view(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        arr = self.array(name)
        if offset < 0 or nbytes < 0 or offset + nbytes > arr.shape[0]:
            raise invalid_arg(
                f"shared-memory range [{offset}, {offset + nbytes}) is outside region '{name}' "
                f"of {arr.shape[0]} bytes"
            )
        return arr[offset : offset + nbytes]

    @staticmethod
    def _open(name: str) -> np.ndarray:
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise unavailable(f"shared-memory region '{name}' does not exist") from None
        try:
            if shm.size == 0:
                raise invalid_arg(f"shared-memory region '{name}' is empty")
            mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        return np.frombuffer(mm, dtype=np.uint8)

    def forget(self, name: str) -> None:
        self._maps.pop(name, None)

    def clear(self) -> None:
        self._maps.clear()
