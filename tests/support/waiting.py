"""Waiting for what a running group reaches on its own time (a restart, a reload, a sweep)."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(check: Callable[[], object], timeout: float = 30.0, *, what: str = "condition not met",
               interval: float = 0.2) -> None:
    """Until ``check()`` is true; an exception from it counts as not yet (the last one is reported)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:
            last = exc
        time.sleep(interval)
    raise AssertionError(f"{what} in {timeout}s (last error: {last})")


def running(pid: int) -> bool:
    """Not gone, and not a zombie (init here may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
