"""A model repository's files, opened without ever blocking: the router, the workers and the ingresses
read a repository's files (configs, model files, labels, warm-up and state data, JSON settings) only
through these functions.

Whoever can write into a repository (or, through SageMaker's ``POST /models``, name a directory) may
put anything where a file is expected: a FIFO (a blocking open waits for a writer, for ever), a
socket, a device node (``/dev/zero`` never ends; opening some devices has effects), or a file far
larger than memory. A plain ``open()`` of such a name holds the thread that reads it, or takes the
process's memory. Here:

* the path is ``stat``-ed first, so a device is never opened;
* it is then opened ``O_NONBLOCK`` (a FIFO opens at once, a file under a lease answers EWOULDBLOCK)
  and ``fstat``-ed: what the descriptor is, whatever was swapped in after the ``stat``, is what is
  checked; anything but a regular file (or a directory, where one is expected) is refused;
* a file read whole is read only up to its bound (``MAX_TEXT_BYTES`` for configs and the like).

Symbolic links are followed: repositories link model files to shared stores (Hugging Face's cache
does), and what a link leads to is checked like any file. Refusals are ``OSError`` whose
``strerror`` says what was found (``a FIFO, not a regular file``); ``unreadable`` words them as
Triton does for a file it cannot read.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

# A config, labels, JSON or model.py file read whole: past this it is no such file (Triton's largest
# config is kilobytes; a label file for a million classes ~20 MB), and reading it would only take memory.
MAX_TEXT_BYTES = 64 << 20
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 20


class NotRegularFile(OSError):
    """A repository name that is not a regular file (or directory, where one may be): refused unopened or unread."""


def file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return f"a file of mode {mode:o}"


def _check(mode: int, directory_ok: bool) -> None:
    if not (stat.S_ISREG(mode) or (directory_ok and stat.S_ISDIR(mode))):
        code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
        raise NotRegularFile(code, f"{file_kind(mode)}, not a regular file")


def open_regular(path: str | os.PathLike[str], *, directory_ok: bool = False) -> int:
    """A read-only descriptor of the regular file (or, with ``directory_ok``, directory) at ``path``,
    the caller's to close; ``OSError`` when it cannot be opened, ``NotRegularFile`` when it is
    something else. Never blocks, never opens a device."""
    _check(os.stat(path).st_mode, directory_ok)  # a device refused before it is opened
    fd = os.open(path, _FLAGS)
    try:
        _check(os.fstat(fd).st_mode, directory_ok)  # what was opened, whatever replaced the name meanwhile
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: str | os.PathLike[str], *, directory_ok: bool = False) -> None:
    """``open_regular`` and close: for a reader that opens ``path`` itself (a framework's loader).
    Its open is a second one: a name swapped after this check is not seen by it."""
    os.close(open_regular(path, directory_ok=directory_ok))


def check_tree(path: str | os.PathLike[str]) -> None:
    """``check_regular`` of ``path``, a file or a folder, and of everything under it (links followed,
    never out of a loop): for a framework that reads a folder's files by name (a SavedModel)."""
    check_regular(path, directory_ok=True)
    seen: set[tuple[int, int]] = set()
    for root, dirs, files in os.walk(path, followlinks=True):
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()  # a link back up: walked already
            continue
        seen.add((st.st_dev, st.st_ino))
        for name in files:  # os.walk lists as files whatever is not a folder: FIFOs, sockets, devices
            inner = os.path.join(root, name)
            try:
                _check(os.stat(inner).st_mode, False)
            except FileNotFoundError:
                continue  # a link to nothing: the framework's own error names it
            except NotRegularFile as exc:
                raise NotRegularFile(exc.errno, f"{os.path.relpath(inner, path)} is {exc.strerror}") from None


def open_binary(path: str | os.PathLike[str]) -> BinaryIO:
    """The regular file at ``path`` as a binary file object (seekable), for a reader that reads part of it."""
    return open(open_regular(path), "rb", closefd=True)


def read_bytes(path: str | os.PathLike[str], limit: int | None = MAX_TEXT_BYTES) -> bytes:
    """The whole regular file at ``path``; ``OSError`` (EFBIG) past ``limit`` bytes (None: no bound)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if limit is not None and size > limit:
            raise OSError(errno.EFBIG, f"{size} bytes, more than the {limit} a file of its kind may hold")
        # Read to the end, not to st_size: it may grow, and some files (/proc's) report 0. Still bounded.
        parts: list[bytes] = []
        got = 0
        while True:
            part = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit + 1 - got))
            if not part:
                return b"".join(parts)
            parts.append(part)
            got += len(part)
            if limit is not None and got > limit:
                raise OSError(errno.EFBIG, f"more than the {limit} bytes a file of its kind may hold")
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], limit: int | None = MAX_TEXT_BYTES, errors: str = "strict") -> str:
    """The whole regular file at ``path`` as UTF-8 text (``UnicodeDecodeError`` as ``errors`` says)."""
    return read_bytes(path, limit).decode("utf-8", errors)


def unreadable(path: str | os.PathLike[str], exc: OSError) -> str:
    """Triton's words for a file it cannot read (its filesystem's ``ReadTextFile``)."""
    return f"failed to open text file for read {os.fspath(path)}: {exc.strerror or exc}"
