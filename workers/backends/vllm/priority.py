"""The engine's processes at a lower CPU priority than the server's own, on small hosts.

vLLM's engine core and its model workers poll busily: after every read of their shared-memory
queue they spin (``sched_yield``) for a second before they sleep. On a host with few cores that
spinning takes the cores the rest of the server needs to admit the next requests and hand out
tokens, and the engine then runs its requests in waves instead of keeping them all in flight
(measured on 2 vCPUs: docs/PERFORMANCE.md). Raising the engine processes' nice value lets the
server's own processes (and the clients on the same host) run whenever they have work, while the
engine still gets every cycle they leave. ``ENGINE_NICE`` in the model's ``parameters``: a nice
increment, or "auto" (the default: ``AUTO_NICE`` on hosts with fewer than ``AUTO_MIN_CORES``
cores, 0 elsewhere, where the spinning has cores of its own).
"""

from __future__ import annotations

import logging
import os

from conveyor.proto.errors import unavailable

log = logging.getLogger(__name__)

AUTO_NICE = 10
AUTO_MIN_CORES = 8


def small_host() -> bool:
    """Fewer than ``AUTO_MIN_CORES`` cores: the engine's spinning and the server share them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores < AUTO_MIN_CORES


def engine_nice(setting: str | None) -> int:
    """The nice increment for the engine's processes, from the model's ``ENGINE_NICE``."""
    value = (setting or "auto").strip().lower()
    if value == "auto":
        return AUTO_NICE if small_host() else 0
    try:
        nice = int(value)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise unavailable(f"ENGINE_NICE must be 'auto' or a nice increment from 0 to 19, not '{setting}'")
    return nice


def descendants(pid: int | None = None) -> set[int]:
    """Every live process below ``pid`` (this process by default), from /proc (empty elsewhere)."""
    found: set[int] = set()
    todo = [os.getpid() if pid is None else pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", encoding="ascii") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            for child in children:
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def lower_priority(pids: set[int], increment: int) -> int:
    """Raise the nice value of every thread of ``pids`` by ``increment`` (Linux keeps it per
    thread; threads started later inherit their creator's). Returns how many threads changed."""
    changed = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                current = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(19, current + increment))
                changed += 1
            except OSError:  # gone, or not ours to change
                continue
    return changed
