"""Waiting for the next message: a ZeroMQ poll that may spin briefly before it sleeps.

A sleeping actor pays a wake-up for its next message (the kernel's futex and
scheduler work, tens of microseconds in a VM); one that spins on ``poll(0)`` for
a few tens of microseconds first catches a reply that is about to arrive without
it. That only pays where a core is free to spin on: on a small host the spinner
takes the core the next actor in the pipeline needs (measured on 2 vCPUs: 30-40%
less throughput, docs/PERFORMANCE.md). So it is on by itself only on hosts with
``AUTO_SPIN_MIN_CORES`` or more cores; ``--spin-us`` (or ``CONVEYOR_SPIN_US``)
forces it either way.
"""

from __future__ import annotations

import os
import time
from typing import Any

import zmq

_zmq_poll = zmq.backend.zmq_poll
_POLLIN = int(zmq.POLLIN)

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
    """A ZeroMQ poll over sockets (or file descriptors) for reading; ``poll`` answers which are ready.

    Calls pyzmq's compiled ``zmq_poll`` with the items built once (``zmq.Poller`` rebuilds
    nothing either, but goes through a Python method and its checks on every turn)."""

    def __init__(self, sources: list[Any], spin_s: float = 0.0) -> None:
        self._items: list[tuple[Any, int]] = []
        for source in sources:
            self.register(source)
        self.spin_s = spin_s

    def register(self, source: Any) -> None:
        self._items.append((source, _POLLIN))

    def poll(self, timeout_ms: int) -> dict[Any, int]:
        """The sources ready to read (``in`` asks; a dict built in C from the ``(source, events)``
        pairs, where a set comprehension ran Python code per turn)."""
        items = self._items
        if self.spin_s and timeout_ms != 0:
            until = time.perf_counter() + self.spin_s
            while True:
                events = _zmq_poll(items, 0)
                if events:
                    return dict(events)
                if time.perf_counter() >= until:
                    break
        return dict(_zmq_poll(items, timeout_ms))
