"""The group's processes as /proc shows them (the ingress's check on its router, the benchmarks, the tests)."""

from __future__ import annotations

import os
from collections.abc import Iterable


def children(pid: int) -> dict[int, list[str]]:
    """Child pid -> its command line, for every live child of ``pid``."""
    return _processes(_PPID, pid)


def group_processes(pgid: int) -> dict[int, list[str]]:
    """Pid -> its command line, for every live process of process group ``pgid``."""
    return _processes(_PGRP, pgid)


# Fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ... utime, stime.
_PPID, _PGRP, _UTIME, _STIME = 1, 2, 11, 12
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used so far (OSError once it is gone)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[_UTIME]) + int(fields[_STIME])) / _CLK_TCK


def _processes(field: int, value: int) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[field]) != value:
                    continue
            with open(f"/proc/{entry}/cmdline") as f:
                found[int(entry)] = f.read().split("\0")
        except OSError:
            continue
    return found


def mapped_shm(pids: Iterable[int], prefix: str = "") -> set[str]:
    """The /dev/shm segments (their names, starting with ``prefix``) the processes ``pids`` map now."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    path = line.rstrip("\n").partition("/dev/shm/")[2]
                    if path and path.startswith(prefix):
                        found.add(path.removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


# Named semaphores joblib's loky makes (scikit-learn, which transformers imports, brings it into vLLM's
# engine core): ``sem.loky-<pid of their maker>-<random>``, unlinked by their maker only if it exits cleanly.
_NAMED_BY_PID = ("sem.loky-",)


def named_by_pid(pids: Iterable[int]) -> set[str]:
    """The /dev/shm entries that carry one of ``pids`` in their name as their maker (``_NAMED_BY_PID``):
    left behind when that process is killed."""
    wanted = {str(pid) for pid in pids}
    if not wanted:
        return set()
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return set()
    return {name for name in names for prefix in _NAMED_BY_PID
            if name.startswith(prefix) and name[len(prefix):].partition("-")[0] in wanted}


def unlink_shm(names: Iterable[str]) -> list[str]:
    """Unlink these /dev/shm segments where they still exist; the names unlinked."""
    gone = []
    for name in names:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            continue
        gone.append(name)
    return gone


def actor_role(argv: list[str]) -> str:
    """'router', 'worker', 'ingress-http', ... from a ``conveyor.deploy.cli`` command line."""
    if "conveyor.deploy.cli" not in argv:
        return "?"
    role = argv[argv.index("conveyor.deploy.cli") + 1]
    if role == "ingress" and "--protocol" in argv:
        role += "-" + argv[argv.index("--protocol") + 1]
    return role
