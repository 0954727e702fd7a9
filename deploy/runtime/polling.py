"""Waiting for the next message: a ZeroMQ poll that may spin briefly before it sleeps.

A sleeping actor pays a wake-up for its next message (the kernel's futex and
scheduler work, tens of microseconds in a VM); one that spins on ``poll(0)`` for
a few tens of microseconds first catches a reply that is about to arrive without
it. That only pays where a core is free to spin on: on a small host the spinner
takes the core the next actor in the pipeline needs (measured on 2 vCPUs: 30-40%
less throughput, docs/PERFORMANCE.md). So it is on by itself only on hosts with
``AUTO_SPIN_MIN_CORES`` or more cores; ``--spin-us`` (or ``CONVEYOR_SPIN_US``)
forces it either way.

The wait itself is ``select.poll`` on the sockets' ``ZMQ_FD`` descriptors and
the plain ones, not ``zmq_poll``, for fewer system calls a wake-up: ``zmq_poll``
polls every descriptor without waiting, asks every socket's ``ZMQ_EVENTS``
(each a ``getpid`` and a ``poll`` in libzmq), waits, then asks every socket
again, also those whose descriptor did not fire. Here a socket is asked before
the wait unless the caller knows it quiet (what a socket holds does not always
show on its edge-triggered descriptor: a send, or a receive, may take in the
command that announced a message), and not after the wait: a socket whose
descriptor fired is answered ready, and the receive that follows takes in its
commands (a message's arrival among them) as a ZMQ_EVENTS question would have.
Every descriptor is looked at on every call, waiting or not, so a busy socket
never hides the others or the plain descriptors.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Container
from typing import Any, cast

import zmq

_zmq_poll = zmq.backend.zmq_poll
# An int option answers an int (typed once here: no ``cast`` call per question on the hot path).
_getsockopt = cast(Callable[[Any, int], int], zmq.backend.Socket.get)
_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)
_FD = int(zmq.FD)
_OS_POLLIN = select.POLLIN

SPIN_ENV = "CONVEYOR_SPIN_US"
AUTO_SPIN_US = 50.0
AUTO_SPIN_MIN_CORES = 8


def spin_seconds(setting: str | None = None) -> float:
    """The spin before each blocking poll: ``setting`` (or ``$CONVEYOR_SPIN_US``) is a number of
    microseconds (0 = never spin) or "auto" (the default: ``AUTO_SPIN_US`` on hosts with enough cores)."""
    value = (setting if setting is not None else os.environ.get(SPIN_ENV, "auto")).strip().lower()
    if value in ("", "auto"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return AUTO_SPIN_US / 1e6 if cores >= AUTO_SPIN_MIN_CORES else 0.0
    us = float(value)
    if us < 0:
        raise ValueError(f"the spin must be a number of microseconds >= 0 or 'auto', not {setting!r}")
    return us / 1e6


class Poller:
    """A poll over ZeroMQ sockets and file descriptors (or objects with ``fileno()``) for reading;
    ``poll`` answers which are ready, as ``zmq_poll`` would (a plain descriptor with an error or a
    hang-up counts as ready too: reading it tells)."""

    def __init__(self, sources: list[Any], spin_s: float = 0.0) -> None:
        self._items: list[tuple[Any, int]] = []  # for the spin's zmq_poll
        self._sockets: list[zmq.Socket[Any]] = []
        self._by_fd: dict[int, Any] = {}
        self._all = select.poll()  # every descriptor: the wait
        for source in sources:
            self.register(source)
        self.spin_s = spin_s

    def register(self, source: Any) -> None:
        self._items.append((source, _POLLIN))
        if isinstance(source, zmq.Socket):
            fd = cast(int, source.get(_FD))
            self._sockets.append(source)
        else:
            fd = source if isinstance(source, int) else source.fileno()
        self._by_fd[fd] = source
        self._all.register(fd, _OS_POLLIN)

    def poll(self, timeout_ms: int, quiet: Container[Any] = ()) -> dict[Any, int]:
        """The sources ready to read, as a dict (``in`` asks), waiting up to ``timeout_ms`` (0: not at
        all; negative: for ever). A socket whose descriptor fired may hold no message after all (only
        other commands came): its first receive raises ``zmq.Again``, as every drain expects. ``quiet``:
        sockets the caller knows hold no message behind a quiet descriptor (the last thing done with each
        was a ZMQ_EVENTS question, or a receive, that found none): they are not asked before the wait; a
        message that comes later fires their descriptor."""
        if self.spin_s and timeout_ms != 0:
            until = time.perf_counter() + self.spin_s
            while True:
                events = _zmq_poll(self._items, 0)
                if events:
                    return dict(events)
                if time.perf_counter() >= until:
                    break
        ready: dict[Any, int] = {}
        for sock in self._sockets:
            if sock not in quiet and _getsockopt(sock, _EVENTS) & _POLLIN:
                ready[sock] = _POLLIN
        by_fd = self._by_fd
        # A socket's descriptor only says its commands changed, a message's arrival nearly always: such a
        # socket is answered ready without a ZMQ_EVENTS question (about 1.3 µs), since the drain that follows
        # takes the commands in with its first receive, which raises ``zmq.Again`` when only commands came.
        for fd, _ in self._all.poll(0 if ready else timeout_ms):
            ready[by_fd[fd]] = _POLLIN
        return ready
