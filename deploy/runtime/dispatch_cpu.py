"""The dispatch core: on a small host, the router and every worker's main thread share one core.

A request crosses between the router and a worker twice (its ``ExecBatch`` and its
``BatchResult``), and within each actor between the main thread and its ZeroMQ I/O
thread at every message. In a virtual machine, waking a thread on another core
costs several times a wake-up on the same core (an interprocessor interrupt, and
the idle core's exit from halt): two processes passing a byte back and forth
through pipes took 43-47 µs a round trip across the two vCPUs of the reference
host and 5.3 µs on one (docs/PERFORMANCE.md, "The dispatch core"). Pinning the
router, its I/O thread, and each worker's main and I/O threads to one core makes
those hand-offs same-core ones; the ingress processes, the clients and the models
keep every core: a worker's instance threads (where models load and run, and
where their libraries start their thread pools) go back to every CPU the process
had (``release_thread``).

A CPU engine that binds its compute threads to some cores (vLLM's CPU build binds them and leaves
the rest to the server) gets them to itself: ``avoid_cpus`` moves every thread of the worker, and
those it starts later, off them. On a small host the engine's own control process joins its compute
threads there (``confine``; the policy is ``workers/backends/vllm/placement.py``).

``--dispatch-cpu`` (or ``$CONVEYOR_DISPATCH_CPU``): "auto" (the default) pins to
the last allowed CPU on hosts with at most ``AUTO_MAX_CPUS`` CPUs, where it was
measured to pay, and leaves larger hosts alone until measured there; "off"; or a
CPU number.
"""

from __future__ import annotations

import os

DISPATCH_CPU_ENV = "CONVEYOR_DISPATCH_CPU"
AUTO_MAX_CPUS = 2

_process_cpus: set[int] | None = None  # every CPU the process had before the pin
# The CPUs the process started with, before any pin or ``avoid_cpus``: what an engine's bound threads
# are narrower than (a second engine, started after the first one's ``avoid_cpus``, is found bound too).
_START_CPUS = frozenset(os.sched_getaffinity(0))


def dispatch_cpu(setting: str | None = None) -> int | None:
    """The core to pin to (None: none), from ``setting`` or ``$CONVEYOR_DISPATCH_CPU``;
    a ValueError for a value that is not "auto", "off" or an allowed CPU."""
    value = (setting if setting is not None else os.environ.get(DISPATCH_CPU_ENV, "auto")).strip().lower()
    allowed = sorted(os.sched_getaffinity(0))
    if value in ("", "auto"):
        return allowed[-1] if 1 < len(allowed) <= AUTO_MAX_CPUS else None
    if value == "off":
        return None
    try:
        cpu = int(value)
    except ValueError:
        raise ValueError(f"the dispatch CPU must be 'auto', 'off' or a CPU number, not {setting!r}") from None
    if cpu not in allowed:
        raise ValueError(f"CPU {cpu} is not one this process may run on ({', '.join(map(str, allowed))})")
    return cpu


def pin_dispatch(cpu: int | None) -> None:
    """Pin the calling thread, the actor's main thread, to ``cpu``. Call it before the first
    socket: the context's I/O thread starts then, and inherits the pin."""
    global _process_cpus
    if cpu is None:
        return
    import numpy  # noqa: F401  # its BLAS threads start at import: before the pin, with every CPU

    _process_cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})


def release_thread() -> None:
    """A thread that runs models (a worker's instance thread) may use every CPU of the process."""
    if _process_cpus is not None:
        os.sched_setaffinity(0, _process_cpus)


# The cores of each engine still running that keeps this process's threads off them (``avoid_cpus``);
# per thread moved, its CPUs before the first of them, and the process's: what ``share_cpus`` gives back,
# less the cores of the engines still running.
_avoiding: list[set[int]] = []
_unmoved: dict[int, set[int]] = {}
_unmoved_process: set[int] | None = None


def avoid_cpus(cpus: set[int]) -> set[int] | None:
    """Keep every thread of this process off ``cpus``, the threads it starts later too (they inherit
    their creator's CPUs, or take ``release_thread``'s). Returns what to hand ``share_cpus`` when the
    engine stops; None, and nothing changed, when that would leave no CPU or ``cpus`` are none of this
    process's."""
    global _process_cpus, _unmoved_process
    full = _process_cpus if _process_cpus is not None else os.sched_getaffinity(0)
    left = full - cpus
    if not left or left == full:
        return None
    if not _avoiding:
        _unmoved_process = _process_cpus
    for tid in _threads():
        try:
            current = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, (current - cpus) or left)
        except OSError:  # the thread ended meanwhile
            continue
        _unmoved.setdefault(tid, current)
    token = set(cpus)
    _avoiding.append(token)
    if _process_cpus is not None:
        _process_cpus = left
    return token


def share_cpus(token: set[int]) -> None:
    """Undo ``avoid_cpus`` (the engine that had the CPUs stopped) for the threads it moved, but for the
    cores another engine still computes on; threads started since keep what they inherited, and
    instance threads started later get the CPUs no engine holds."""
    global _process_cpus
    _avoiding.remove(token)
    still: set[int] = set().union(*_avoiding)
    for tid, cpus in list(_unmoved.items()):
        try:
            os.sched_setaffinity(tid, (cpus - still) or cpus)
        except OSError:  # the thread ended
            del _unmoved[tid]
    if _process_cpus is not None and _unmoved_process is not None:
        _process_cpus = (_unmoved_process - still) or _unmoved_process
    if not _avoiding:
        _unmoved.clear()


def bound_cpus(pids: set[int]) -> set[int]:
    """The CPUs the threads of ``pids`` were bound to where narrower than this process's own: the
    cores a CPU engine's processes compute on (empty for processes left free, as a GPU engine's)."""
    full = _START_CPUS
    bound: set[int] = set()
    for pid in pids:
        for tid in _threads(pid):
            try:
                cpus = os.sched_getaffinity(tid)
            except OSError:
                continue
            if cpus < full:
                bound |= cpus
    return bound


def confine(pids: set[int], cpus: set[int]) -> int:
    """Keep every thread of ``pids`` that may run outside ``cpus`` on ``cpus`` (the threads they
    start later inherit it). Returns how many threads moved."""
    moved = 0
    for pid in pids:
        for tid in _threads(pid):
            try:
                if not os.sched_getaffinity(tid) <= cpus:
                    os.sched_setaffinity(tid, cpus)
                    moved += 1
            except OSError:  # gone, or not ours to move
                continue
    return moved


def _threads(pid: int | None = None) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid or os.getpid()}/task")]
    except OSError:
        return []
