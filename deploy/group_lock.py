"""One live owner per group name on a host.

A group's IPC sockets, its scale socket and its shared-memory segments are named
after the group. Two groups of the same name would share them: the second
router would take over the first one's sockets, and the first to stop would
remove the other's. So the owner of a group (``conveyor serve``'s supervisor, or
a standalone router) holds an exclusive ``flock`` on ``<run dir>/<role>.lock``
for its whole life; the kernel drops it when the process dies, however it dies,
so a crashed group never blocks its name.
"""

from __future__ import annotations

import fcntl
import os
import re

from conveyor.deploy.options import run_dir

DEFAULT_GROUP = "default"
# Shared-memory names are conveyor.<group>.<role>.<pid>: a dot in a group name would make
# one group's segments look like another's (group "a" would sweep "a.b"'s).
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_FREE_NAME_TRIES = 100


class GroupBusy(Exception):
    """The group name is held by a live process."""


def check_name(group: str) -> str:
    """'' or why ``group`` cannot name a group."""
    if not _NAME.fullmatch(group):
        return f"--group '{group}': use 1 to 64 letters, digits, '-' or '_'"
    return ""


class GroupLock:
    """The held lock; ``release`` (or process exit) frees the name."""

    def __init__(self, group: str, role: str = "owner") -> None:
        self.group = group
        directory = run_dir(group)
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{role}.lock")
        while True:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(self._fd)
                os.close(self._fd)
                if role == "router":
                    # The supervisor checks this lock too: a router that outlived its supervisor
                    # would otherwise take this group's workers and ingress processes.
                    raise GroupBusy(f"group '{group}' already has a router on this host{holder} that this "
                                    f"command did not start: stop it, or give this group another name with "
                                    f"--group") from None
                raise GroupBusy(f"group '{group}' is already running on this host{holder}: stop it, or give "
                                f"this one another name with --group") from None
            # A stopping owner removes its run folder: the file we locked may be gone, and a
            # newcomer would lock a new one. Only the file still at the path counts.
            try:
                same = os.stat(self.path).st_ino == os.fstat(self._fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(self._fd)
            os.makedirs(directory, exist_ok=True)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def take_group(group: str | None, role: str = "owner") -> GroupLock:
    """Hold ``group``'s lock; with no name given, the first free one of ``default``,
    ``default-2``, ``default-3``, ... Raises GroupBusy for a given name that is live."""
    if group is not None:
        return GroupLock(group, role)
    for n in range(1, MAX_FREE_NAME_TRIES + 1):
        name = DEFAULT_GROUP if n == 1 else f"{DEFAULT_GROUP}-{n}"
        try:
            return GroupLock(name, role)
        except GroupBusy:
            continue
    raise GroupBusy(f"groups '{DEFAULT_GROUP}' to '{DEFAULT_GROUP}-{MAX_FREE_NAME_TRIES}' are all running: "
                    "name this one with --group")
