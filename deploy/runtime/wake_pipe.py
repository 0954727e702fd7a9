"""A pipe that wakes a loop asleep in a poll: the loop polls its read end beside its sockets, and another
thread (work done, a message posted) or a signal writes a byte to it.

Signals: Python runs a signal handler in the main thread only once the call it is blocked in returns; a
ZeroMQ poll or ``select`` retries after EINTR, and the signal may even land on another thread (ZeroMQ's I/O
thread), so the loop would notice a stop request only at its poll timeout (a second for the router).
``signal.set_wakeup_fd`` makes the C-level handler write the signal's number down the pipe: polling its read
end wakes the loop.

The router's loop (SIGTERM; the repository agent's completions, ``router/repository/agent.py``), the
worker's (its mailbox, ``workers/mailbox.py``, and signals) and the supervisor's use it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

WAKE_READ = 4096  # bytes read at once while emptying the pipe: a wake-up writes one byte, a signal one each


def wake_on_signals(fd: int) -> Callable[[], None]:
    """Make every signal write a byte to ``fd`` (non-blocking); returns the undo. Only the main
    thread gets signals: a loop run on another thread (in tests) changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)

    def undo() -> None:
        signal.set_wakeup_fd(previous)

    return undo


class WakePipe:
    """A non-blocking pipe: poll ``fd``; ``wake`` (any thread) makes it readable until ``clear`` (the loop).
    ``signals``: every signal wakes it too, until ``close``."""

    __slots__ = ("_undo", "fd", "write_fd")

    def __init__(self, signals: bool = False) -> None:
        self.fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._undo = self.on_signals() if signals else None

    def on_signals(self) -> Callable[[], None]:
        """Every signal wakes it (from the main thread only); returns the undo."""
        return wake_on_signals(self.write_fd)

    def wake(self) -> None:
        try:
            os.write(self.write_fd, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop is woken already

    def clear(self) -> None:
        """Empty the pipe, so that the next wake-up makes it readable again. A short read emptied it: reading
        again would only raise BlockingIOError (one more system call and an exception per wake-up). A byte
        written after it leaves the pipe readable: the next poll returns at once."""
        try:
            while len(os.read(self.fd, WAKE_READ)) == WAKE_READ:
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._undo is not None:
            self._undo()
        os.close(self.fd)
        os.close(self.write_fd)
