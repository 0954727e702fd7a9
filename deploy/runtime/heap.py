"""Keep freed megabytes in this process's heap, so the next request's buffers are warm.

With glibc's defaults a buffer of 128 KiB or more is mapped fresh from the kernel; once its size
is learnt it comes from the heap instead, but glibc hands the heap's free top back to the kernel
as soon as it exceeds twice that size, which a request that frees its body and its response at
once always does. So every request with megabyte tensors faults its pages in again, page by page:
in a virtual machine each fault is an exit to the hypervisor. Measured on the 2-vCPU VM
(docs/PERFORMANCE.md, "Warm heaps"): the HTTP ingress spent 2.3 ms of CPU per 1 MiB request at
concurrency 1, 1.0 ms with the heap kept; a 1 MiB numpy add plus ``tobytes`` on a main thread
took 0.93 ms against 0.06 ms. Threads' own arenas do not shrink that way; the main thread is
where the ingress's event loop and a worker's inline batches run.

``keep_freed_heap`` raises both thresholds: buffers up to 32 MiB come from the heap, and up to
64 MiB of free heap is kept. glibc only; a process started with glibc's own settings
(``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, or ``GLIBC_TUNABLES`` naming malloc)
keeps them.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit hosts
TRIM_THRESHOLD = 64 << 20
GLIBC_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def user_set_malloc() -> bool:
    """Whether this process was started with glibc malloc settings of its own."""
    return any(k in os.environ for k in GLIBC_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_heap() -> bool:
    """Raise glibc's mmap and trim thresholds (module docstring); False where nothing was changed."""
    if platform.libc_ver()[0] != "glibc" or user_set_malloc():
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
