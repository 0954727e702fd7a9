"""Names of the server's own shared-memory segments, and the sweep that frees orphans.

Every segment the server creates is named ``conveyor.<group>.<role>.<pid>[.<n>]``:
the owner's pid is in the name, so after a crash any process of the group can
find segments whose owner is gone and unlink them (``sweep_orphans``). The pid alone
cannot say so where /dev/shm is shared by several pid namespaces (containers with
``--ipc=host``, test runs under ``unshare``): there a live owner's pid means nothing.
So the owner also holds a ``flock`` on its segment for its life (``hold``); the kernel
drops it when the owner dies, however it dies, and a segment still locked is never swept.
"""

from __future__ import annotations

import fcntl
import logging
import os

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
PREFIX = "conveyor."
# Tries at creating a segment that a sweep in another pid namespace unlinks between its creation and its lock.
HOLD_TRIES = 3


def hold(fd: int, name: str) -> bool:
    """Lock the segment ``name`` this process just created and has open on ``fd``, for as long as ``fd``
    stays open: the lock says its owner lives (``sweep_orphans``). False when a sweep unlinked it first
    (it takes the lock before it unlinks): the caller creates it again."""
    fcntl.flock(fd, fcntl.LOCK_EX)  # a sweep holds it for a moment at most
    try:
        return os.stat(os.path.join(SHM_DIR, name.lstrip("/"))).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _unlink_unheld(path: str) -> bool:
    """Unlink ``path`` unless a live process holds its owner lock; whether it was unlinked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:  # gone already; another user's, or not a plain file: not ours to remove
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.unlink(path)  # under the lock: an owner that locks after this sees its name gone (``hold``)
        return True
    except (BlockingIOError, FileNotFoundError, PermissionError):  # its owner lives; gone; another user's
        return False
    finally:
        os.close(fd)


def segment_name(group: str, role: str, pid: int | None = None, serial: int = 0) -> str:
    """The POSIX name (leading slash) of a segment owned by this process."""
    pid = os.getpid() if pid is None else pid
    suffix = f".{serial}" if serial else ""
    return f"/{PREFIX}{group}.{role}.{pid}{suffix}"


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie: a zombie holds no memory, and where init does not reap
    orphans (a container's own init may not), a killed process stays one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False  # gone
    except OSError:
        return True
    try:  # no /proc: not Linux
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def owner_pid(entry: str) -> int | None:
    parts = entry.split(".")
    if len(parts) < 4 or not entry.startswith(PREFIX):
        return None
    try:
        return int(parts[3])
    except ValueError:
        return None


def sweep_orphans(group: str) -> list[str]:
    """Unlink this group's segments whose owning process no longer exists; ``group`` "": any
    group's (a group killed whole, its supervisor with it, is never started again by that name)."""
    removed: list[str] = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    mine = f"{PREFIX}{group}." if group else PREFIX
    for entry in entries:
        if not entry.startswith(mine):
            continue
        pid = owner_pid(entry)
        if pid is None or _running(pid):  # a zombie's segments are orphans too
            continue
        if _unlink_unheld(os.path.join(SHM_DIR, entry)):  # a lock held: its owner lives, in another pid namespace
            removed.append(entry)
    if removed:
        log.warning("freed %d orphaned shared-memory segment(s): %s", len(removed), ", ".join(removed))
    return removed


def group_segments(group: str) -> list[str]:
    try:
        return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(f"{PREFIX}{group}."))
    except FileNotFoundError:
        return []


def shm_preflight(needed_bytes: int) -> str:
    """A warning when /dev/shm is smaller than the arenas may grow to, else ''.

    Segments are sparse (tmpfs), so this is a ceiling, not a reservation; a
    container's default 64 MiB /dev/shm is the usual culprit.
    """
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return f"{SHM_DIR} is not available: shared memory cannot work here"
    size = st.f_blocks * st.f_frsize
    if size >= needed_bytes:
        return ""
    return (
        f"{SHM_DIR} holds {size >> 20} MiB but the arenas of this group may use up to {needed_bytes >> 20} MiB: "
        "lower --arena-size, or give the container more (docker run --shm-size, or a Memory-backed "
        "emptyDir on /dev/shm in Kubernetes), or on a host grow the tmpfs (/etc/fstab: "
        "'tmpfs /dev/shm tmpfs defaults,size=NG', then mount -o remount /dev/shm)"
    )
