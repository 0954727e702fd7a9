"""The wake pipe (deploy/runtime/wake_pipe.py) that the router's, the worker's and the supervisor's loops poll:
a wake-up makes it readable until the loop clears it, however many came (more than one read's worth, more than
the pipe holds), a wake-up after the clear is seen, and a signal wakes it only while it asks for signals."""

from __future__ import annotations

import fcntl
import os
import select
import signal
import threading
from collections.abc import Iterator

import pytest

from conveyor.deploy.runtime.wake_pipe import WAKE_READ, WakePipe

LEVEL = "unit"


def _readable(pipe: WakePipe) -> bool:
    return bool(select.select([pipe.fd], [], [], 0)[0])


@pytest.fixture
def pipe() -> Iterator[WakePipe]:
    p = WakePipe()
    yield p
    p.close()


def test_a_wake_up_is_seen_until_cleared(pipe: WakePipe) -> None:
    assert not _readable(pipe)
    pipe.wake()
    assert _readable(pipe)
    pipe.clear()
    assert not _readable(pipe)
    pipe.wake()
    assert _readable(pipe), "a wake-up after the clear wakes the loop again"


@pytest.mark.parametrize("wakes", [WAKE_READ - 1, WAKE_READ, WAKE_READ + 1, 3 * WAKE_READ])
def test_clear_empties_more_than_one_reads_worth(pipe: WakePipe, wakes: int) -> None:
    for _ in range(wakes):
        pipe.wake()
    pipe.clear()
    assert not _readable(pipe)


def test_wakes_beyond_what_the_pipe_holds_neither_block_nor_fail(pipe: WakePipe) -> None:
    # The wake-ups past what the pipe holds (64 KiB by default) find it full, and the loop is woken already.
    holds = fcntl.fcntl(pipe.write_fd, fcntl.F_GETPIPE_SZ)
    done = threading.Event()

    def flood() -> None:
        for _ in range(holds + 1000):
            pipe.wake()
        done.set()

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    t.join(60)
    assert done.is_set(), "a wake-up blocked on a full pipe"
    pipe.clear()
    assert not _readable(pipe)


def test_signals_wake_it_until_it_closes() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    try:
        plain = WakePipe()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert got == [signal.SIGUSR1] and not _readable(plain), "a pipe that did not ask for signals"
        plain.close()

        woken = WakePipe(signals=True)
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _readable(woken)
        woken.clear()
        woken.close()
        assert signal.set_wakeup_fd(-1) == -1, "close gives the signals' wake-up back"
    finally:
        signal.signal(signal.SIGUSR1, previous)
