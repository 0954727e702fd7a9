"""How this process's ZeroMQ I/O thread is scheduled: ``SCHED_BATCH`` unless asked otherwise.

Every message an actor sends wakes its context's I/O thread (an eventfd write), and
every message it receives was pushed by that thread. With the default policy the
woken I/O thread preempts whatever runs on its core, often the actor that just woke
it, halfway through its turn: two more context switches per message, each dear in a
virtual machine. ``SCHED_BATCH`` tells the scheduler not to preempt on that wake-up:
the I/O thread runs once the current task sleeps (typically a moment later, in its
poll) or on an idle core. Measured on 2 vCPUs (docs/PERFORMANCE.md, "The I/O
thread's scheduling policy"): 19% more requests per second at concurrency 1 with a
lower p99, and the same or slightly better at 4 and 16. The policy must be set
before the context starts its thread, that is before the first socket:
``configure_io_threads`` runs first in every actor (``deploy/cli.py``).
``--io-sched normal`` (or ``CONVEYOR_IO_SCHED=normal``) keeps the default policy.
"""

from __future__ import annotations

import os

import zmq

IO_SCHED_ENV = "CONVEYOR_IO_SCHED"
CHOICES = ("batch", "normal")


def io_sched_policy(setting: str | None = None) -> str:
    """``setting``, else ``$CONVEYOR_IO_SCHED``, else "batch"; a ValueError for anything else."""
    value = (setting if setting is not None else os.environ.get(IO_SCHED_ENV, "batch")).strip().lower() or "batch"
    if value not in CHOICES:
        raise ValueError(f"the I/O thread scheduling policy must be one of {', '.join(CHOICES)}, not {setting!r}")
    return value


def configure_io_threads(setting: str | None = None) -> str:
    """Set the policy on this process's shared context (``zmq.Context.instance()``, which
    every actor's sockets come from) and return its name."""
    policy = io_sched_policy(setting)
    if policy == "batch" and hasattr(os, "SCHED_BATCH"):
        zmq.Context.instance().set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return policy
