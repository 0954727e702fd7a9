"""A pipe that a signal writes to, so a loop asleep in a poll sees SIGTERM at once.

Python runs a signal handler in the main thread only once the call it is blocked in
returns; a ZeroMQ poll or ``select`` retries after EINTR, and the signal may even land on
another thread (ZeroMQ's I/O thread), so the loop would notice a stop request only at its
poll timeout (a second for the router). ``signal.set_wakeup_fd`` makes the C-level
handler write the signal's number down a pipe: polling its read end wakes the loop.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable


def wake_on_signals(fd: int) -> Callable[[], None]:
    """Make every signal write a byte to ``fd`` (non-blocking); returns the undo. Only the main
    thread gets signals: a loop run on another thread (in tests) changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.set_wakeup_fd(fd, warn_on_full_buffer=False)

    def undo() -> None:
        signal.set_wakeup_fd(previous)

    return undo


class SignalWake:
    """A pipe of its own that signals write to, until ``close``: poll ``fd``, then ``clear``."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._undo = wake_on_signals(self._write)

    def clear(self) -> None:
        """Empty the pipe (the signal's handler has run or will run on its own)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        self._undo()
        os.close(self.fd)
        os.close(self._write)
