"""A pipe that a signal writes to, so a loop asleep in a poll sees SIGTERM at once.

Python runs a signal handler in the main thread only once the call it is blocked in
returns; a ZeroMQ poll or ``select`` retries after EINTR, and the signal may even land on
another thread (ZeroMQ's I/O thread), so the loop would notice a stop request only at its
poll timeout (a second for the router). ``signal.set_wakeup_fd`` makes the C-level
handler write the signal's number down this pipe: polling its read end wakes the loop.
"""

from __future__ import annotations

import os
import signal


class SignalWake:
    """Owns the pipe and the process's wakeup fd (main thread only) until ``close``."""

    def __init__(self) -> None:
        self.fd, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)

    def clear(self) -> None:
        """Empty the pipe (the signal's handler has run or will run on its own)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        os.close(self.fd)
        os.close(self._write)
