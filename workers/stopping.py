"""How a worker stops when the group's exit timeout has run out (the supervisor's side of it
is in ``deploy/supervisor.py``).

Triton waits ``--exit-timeout-secs`` for requests in flight, then unloads every model anyway,
so a Python model's ``finalize`` runs even with a request still open (a test of Triton's
decoupled suite counts its log lines). A worker told this stops draining, unloads its
instances and waits a bounded time for their ``finalize`` before it exits.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

# The supervisor's word to a worker still draining at the group's deadline: unload now. Not a
# second SIGTERM: two signals of one kind sent together may reach the handler as one.
UNLOAD_NOW_SIGNAL = signal.SIGUSR1

# How long a stopping worker waits for its models' ``finalize`` (and ``close``) to return.
# Triton waits for a model's unload without a bound; a ``finalize`` that hangs (it waits for a
# thread that never ends) must not keep the worker, and with it the group's stop, forever.
FINALIZE_WAIT_S = 5.0

# How long the supervisor lets a worker it told to unload run before killing it: the wait above
# plus the time to leave (flush the logs, close the sockets).
UNLOAD_GRACE_S = FINALIZE_WAIT_S + 2.0


_leave: Callable[[str], None] | None = None


def set_fatal_exit(leave: Callable[[str], None] | None) -> None:
    """The running worker's way out (``Worker.fail``), or None once it is gone."""
    global _leave
    _leave = leave


def fatal_exit(why: str) -> bool:
    """From any thread: this worker process cannot go on (an engine it hosts died). It stops at once, its models
    closed, and exits with ``ENGINE_DIED_CODE``; the router answers its requests still open as any dead worker's
    (``worker_lost``: a vLLM model's move to another engine, or wait for this one's return). False where no
    worker runs (a backend used on its own): the caller answers its requests itself."""
    leave = _leave
    if leave is None:
        return False
    leave(why)
    return True


def in_worker() -> bool:
    """Whether a running worker would exit on ``fatal_exit``."""
    return _leave is not None
