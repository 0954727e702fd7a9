"""Client-registered regions as a worker sees them: mapped on first use, by
registration id, and unmapped when the router says the registration is gone.

System regions are numpy views of the client's POSIX segment (the backend reads
the client's bytes in place; outputs are written in place). CUDA regions are
cupy arrays over the client's device memory, opened with cudaIpcOpenMemHandle.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.errors import client_mistake, invalid_arg, unavailable
from conveyor.shm.client_segment import open_segment

log = logging.getLogger(__name__)

PREFIX = m.CLIENT_REGION_PREFIX


def is_client_region(region: str) -> bool:
    return region.startswith(PREFIX)


def is_device_array(arr: Any) -> bool:
    return hasattr(arr, "__cuda_array_interface__")


class ClientRegionMaps:
    """Descriptors arrive with each batch (``announce``, socket thread); instance
    threads map on first use (``view``); ``forget`` (socket thread) unmaps. A
    registration forgotten while a batch was still using it is mapped for that
    batch only, never cached, so no mapping outlives its registration."""

    def __init__(self) -> None:
        self._known: dict[int, m.ClientRegion] = {}
        # (registration id, writable) -> mapping: a region only read is mapped read-only.
        self._maps: dict[tuple[int, bool], Any] = {}
        self._forgotten: set[int] = set()
        self._lock = threading.Lock()

    def announce(self, regions: list[m.ClientRegion]) -> None:
        for region in regions:
            if region.id not in self._forgotten:
                self._known.setdefault(region.id, region)

    def forget(self, ids: list[int]) -> None:
        with self._lock:
            for rid in ids:
                self._forgotten.add(rid)
                self._known.pop(rid, None)
                for writable in (False, True):
                    self._maps.pop((rid, writable), None)  # unmapped once the last view of it is dropped

    def clear(self) -> None:
        """A new router numbers registrations from scratch: drop everything."""
        with self._lock:
            self._known.clear()
            self._maps.clear()
            self._forgotten.clear()

    @property
    def mapped(self) -> int:
        return len(self._maps)

    def view(self, region: str, offset: int, nbytes: int, *, writable: bool = False) -> Any:
        """``nbytes`` at absolute ``offset`` of the region: a numpy or cupy uint8 array.
        Inputs get a read-only mapping; only outputs map the client's pages writable."""
        rid = int(region[len(PREFIX):])
        arr = self._maps.get((rid, writable))
        if arr is None:
            arr = self._map(rid, writable)
        if offset < 0 or nbytes < 0 or offset + nbytes > arr.shape[0]:
            raise invalid_arg(f"shared-memory range [{offset}, {offset + nbytes}) is outside the registered region")
        return arr[offset : offset + nbytes]

    def _map(self, rid: int, writable: bool) -> Any:
        desc = self._known.get(rid)
        if desc is None:
            raise unavailable("the shared memory region was unregistered before this request ran")
        arr = _open_cuda(desc) if desc.kind == "cuda" else _open_system(desc, writable)
        with self._lock:
            if rid in self._forgotten:
                return arr
            return self._maps.setdefault((rid, writable), arr)


def _open_system(desc: m.ClientRegion, writable: bool) -> np.ndarray:
    """The whole segment (refs carry absolute offsets): read-only for inputs, writable
    for outputs (refused clearly when the server's user may not write the segment). Opened
    without blocking and only if it is still a regular file (``shm/client_segment.py``): the
    key may have been replaced by a FIFO since the router checked it."""
    try:
        fd, st = open_segment(desc.key, writable)
    except PermissionError:
        raise invalid_arg(
            f"shared memory region '{desc.name}': the server may not "
            f"{'write' if writable else 'read'} segment '{desc.key}'"
        ) from None
    except FileNotFoundError:
        raise unavailable(f"shared memory region '{desc.name}': segment '{desc.key}' no longer exists") from None
    except OSError as exc:
        log.info("shared memory key %r: %s", desc.key, exc.strerror)
        raise client_mistake(f"Unable to open shared memory region: '{desc.key}'") from None
    try:
        if st.st_size < desc.offset + desc.byte_size:
            raise invalid_arg(
                f"shared memory region '{desc.name}': segment '{desc.key}' shrank below its registered size"
            )
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        mm = mmap.mmap(fd, st.st_size, access=access)
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=np.uint8)


class _IpcMapping:
    """Owns one cudaIpcOpenMemHandle mapping; closed when the last array over it goes."""

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr = ptr
        self.device_id = device_id

    def __del__(self) -> None:
        try:
            import cupy

            with cupy.cuda.Device(self.device_id):
                cupy.cuda.runtime.ipcCloseMemHandle(self.ptr)
        except Exception:
            pass  # the process is exiting or the context is gone: the driver reclaims it


def _open_cuda(desc: m.ClientRegion) -> Any:
    try:
        import cupy
    except ImportError:
        raise unavailable("CUDA shared memory needs cupy in the worker: pip install 'conveyor[gpu]'") from None
    try:
        with cupy.cuda.Device(desc.device_id):
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(desc.handle)
    except Exception as exc:
        raise invalid_arg(f"CUDA shared memory region '{desc.name}' could not be opened: {exc}") from None
    owner = _IpcMapping(ptr, desc.device_id)
    mem = cupy.cuda.UnownedMemory(ptr, desc.byte_size, owner, device_id=desc.device_id)
    return cupy.ndarray((desc.byte_size,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(mem, 0))
