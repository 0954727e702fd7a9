"""A client's POSIX segment, opened by the key the client gave, without ever blocking.

A key names an entry of /dev/shm, where any local user may put anything: a FIFO (a blocking
read-only open waits for a writer, for ever), a socket, a directory, a device node, a symlink.
``shm_open(3)`` opens the same path (glibc: ``/dev/shm/<key without leading slashes>``, with
``O_NOFOLLOW``), but blocking. Here the open never waits (``O_NONBLOCK``: a FIFO opens at once,
a file under a lease answers EWOULDBLOCK), never follows a symlink, never makes a terminal ours,
and anything that is not a regular file is refused before it is used. The router and the workers
open client keys only through ``open_segment``.
"""

from __future__ import annotations

import errno
import os
import stat

from conveyor.shm.naming import SHM_DIR

# A key opened for the server's use: never blocking (a FIFO, a leased file), never through a symlink
# (as glibc's shm_open), never our controlling terminal, and not inherited by a child process.
_FLAGS = os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return f"not a regular file (mode {mode:o})"


def segment_path(key: str) -> bytes:
    """The /dev/shm path of POSIX name ``key``, as glibc's shm_open makes it; OSError (EINVAL) for a
    name shm_open refuses (empty, or a '/' after the leading ones), one with a NUL or not encodable."""
    bare = key.lstrip("/")
    if not bare or "/" in bare or "\0" in bare:
        raise OSError(errno.EINVAL, "not a POSIX shared-memory name")
    try:
        return os.fsencode(os.path.join(SHM_DIR, bare))
    except UnicodeEncodeError:  # a lone surrogate JSON let through
        raise OSError(errno.EINVAL, "not a POSIX shared-memory name") from None


def open_segment(key: str, writable: bool = False) -> tuple[int, os.stat_result]:
    """A descriptor of segment ``key`` (read-only unless ``writable``) and its ``fstat``; the caller
    closes it. OSError when it cannot be opened or is no regular file (its message says why, for
    the server's log: it names the kind of file, never the path)."""
    fd = os.open(segment_path(key), (os.O_RDWR if writable else os.O_RDONLY) | _FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{_kind(st.st_mode)}, not a shared-memory segment")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def segment_identity(key: str) -> tuple[int, int]:
    """The size and inode of segment ``key`` (opened read-only and closed again): OSError as ``open_segment``."""
    fd, st = open_segment(key)
    os.close(fd)
    return st.st_size, st.st_ino
