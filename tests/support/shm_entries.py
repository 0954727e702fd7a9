"""Entries of /dev/shm that are no shared-memory segment (FIFOs, sockets, directories, device
nodes, symlinks), made as a local attacker would and all removed again by ``cleanup``.

``cleanup`` first opens every FIFO for writing without blocking: a server that is stuck in a
blocking read-only open of one (the bug these entries attack) comes back for the tests after.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from typing import Any

import posix_ipc

from conveyor.shm.naming import SHM_DIR


class ShmEntries:
    def __init__(self, tag: str) -> None:
        self._tag = f"cv_atk_{tag}_{os.getpid()}_{time.monotonic_ns()}"
        self._count = 0
        self._made: list[str] = []  # names in /dev/shm, removed in reverse order
        self._sockets: list[socket.socket] = []

    def _name(self, what: str) -> str:
        self._count += 1
        name = f"{self._tag}_{what}{self._count}"
        self._made.append(name)
        return name

    @staticmethod
    def path(key: str) -> str:
        return os.path.join(SHM_DIR, key.lstrip("/"))

    def segment(self, size: int) -> str:
        """A real segment of ``size`` bytes (zeros); its key."""
        key = "/" + self._name("seg")
        shm = posix_ipc.SharedMemory(key, posix_ipc.O_CREX, size=size)
        shm.close_fd()
        return key

    def fifo(self) -> str:
        key = "/" + self._name("fifo")
        os.mkfifo(self.path(key), 0o666)
        return key

    def replace_by_fifo(self, key: str) -> None:
        """Unlink segment ``key`` and put a FIFO of the same name in its place."""
        os.unlink(self.path(key))
        os.mkfifo(self.path(key), 0o666)

    def unix_socket(self) -> str:
        key = "/" + self._name("sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(self.path(key))
        sock.listen(1)
        self._sockets.append(sock)
        return key

    def directory(self) -> str:
        key = "/" + self._name("dir")
        os.mkdir(self.path(key))
        return key

    def symlink(self, target: str) -> str:
        key = "/" + self._name("link")
        os.symlink(target, self.path(key))
        return key

    def char_device(self) -> str:
        """A node of /dev/null's device in /dev/shm (root only, and only where /dev/shm is not nodev)."""
        key = "/" + self._name("chr")
        os.mknod(self.path(key), stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return key

    def nested_segment(self) -> str:
        """A regular file one directory down: ``/<dir>/<file>``, a name shm_open refuses."""
        folder = self.directory()
        name = self._name("inner")
        self._made.remove(name)
        self._made.append(os.path.join(folder.lstrip("/"), name))  # removed before its folder
        with open(os.path.join(self.path(folder), name), "wb") as f:
            f.write(bytes(64))
        return f"{folder}/{name}"

    def left(self) -> list[str]:
        """What of ours is still in /dev/shm."""
        return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(self._tag))

    def cleanup(self) -> None:
        for name in self._made:
            path = os.path.join(SHM_DIR, name)
            with contextlib.suppress(OSError):
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO unless a reader waits
        for sock in self._sockets:
            sock.close()
        for name in reversed(self._made):
            path = os.path.join(SHM_DIR, name)
            with contextlib.suppress(FileNotFoundError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
        self._made.clear()

    def __enter__(self) -> ShmEntries:
        return self

    def __exit__(self, *_: Any) -> None:
        self.cleanup()
