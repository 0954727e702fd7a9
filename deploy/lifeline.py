"""How a group's processes end: every actor dies with the supervisor that started it,
however the supervisor dies; and a process whose work is done leaves at once.

A supervisor killed with SIGKILL (Model Analyzer stops ``tritonserver`` so after 5 s, the
OOM killer, ``kill -9``) cannot stop its children. Left alone they would live on: the
router would keep the group's router lock and refuse the next start's router, whose
workers and ingress processes would then join the orphan. So the supervisor names itself
in each child's environment, and the child asks the kernel for SIGKILL when its parent
dies (``prctl(PR_SET_PDEATHSIG)``), then checks that parent is still the supervisor: one
that died before the request leaves the child to init, and the child exits at once.

SIGKILL rather than SIGTERM: a draining actor waits on the others (workers on the
router's LeaveGranted, the router on in-flight work) that are dying too; the next start
sweeps what the killed actors left in /dev/shm (``shm/naming.py``). Linux only; elsewhere
an actor outlives a killed supervisor as before.

What the actors start is marked too: a framework's own processes (vLLM's engine core, started by
multiprocessing's spawn, which clears the parent-death request) would outlive a killed worker, holding
its memory (on a GPU host, the GPU memory the next start needs). Every actor's environment names its
group and its run folder (``GROUP_MEMBER_ENV``, ``GROUP_DIR_ENV``), and what it starts inherits that; the
supervisor kills the group's processes whose parent is gone (``kill_orphans``) when it starts, when it
restarts a child that died, and when it has stopped. Only its own: a process of another pid or mount
namespace (another container, a test run under ``unshare``) is another host's, whatever its group's name,
and where /proc was mounted for another pid namespace than the supervisor's, its pids cannot be signalled
from here, so nothing is.

``exit_now`` (deploy/runtime/leaving.py): how each actor leaves once its cleanup is done.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

from conveyor.deploy.runtime.group_paths import GROUP_DIR_ENV, GROUP_MEMBER_ENV, run_dir
from conveyor.deploy.runtime.procs import mapped_shm, named_by_pid, unlink_shm

log = logging.getLogger(__name__)

SUPERVISOR_PID_ENV = "CONVEYOR_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _marks(group: str) -> dict[str, str]:
    return {GROUP_MEMBER_ENV: group, GROUP_DIR_ENV: os.path.realpath(run_dir(group))}


def child_environment(group: str) -> dict[str, str]:
    """What the supervisor adds to a child's environment."""
    return {SUPERVISOR_PID_ENV: str(os.getpid()), **_marks(group)}


def mark_group_member(group: str) -> None:
    """What this actor starts from now on carries its group (an actor systemd started has no supervisor
    to set it)."""
    os.environ.update(_marks(group))


_NAMESPACES = ("pid", "mnt")  # a process in others is not of this host's groups


def _namespaces(pid: str) -> tuple[str, ...]:
    return tuple(os.readlink(f"/proc/{pid}/ns/{kind}") for kind in _NAMESPACES)


def _members(group: str) -> dict[int, int]:
    """Pid -> parent pid of every process of this pid and mount namespace whose environment, as it was
    started, names ``group`` and its run folder."""
    markers = [f"{k}={v}".encode() for k, v in _marks(group).items()]
    mine = _namespaces("self")
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            if not all(marker in environ for marker in markers) or _namespaces(entry) != mine:
                continue
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone, or another user's
            continue
        if fields[0] != "Z":  # a zombie holds nothing
            found[int(entry)] = int(fields[1])
    return found


def kill_orphans(group: str, stopping: bool = False) -> list[int]:
    """SIGKILL each process of ``group`` whose parent is neither of the group nor this process (what
    a dead actor started and left running), and what those started; unlink the Python shared memory
    only they mapped. ``stopping``: the group has stopped, and what its actors started may simply not
    have finished exiting (vLLM's engine core takes seconds): logged, not warned. Returns their pids."""
    if not sys.platform.startswith("linux"):
        return []
    if os.readlink("/proc/self") != str(os.getpid()):  # /proc is another pid namespace's: its pids are not ours
        log.warning("not looking for what dead actors of group '%s' left running: /proc is mounted for another "
                    "pid namespace than this process's (mount a /proc of its own, as `unshare --mount-proc` does)",
                    group)
        return []
    members = _members(group)
    me = os.getpid()
    orphans = [pid for pid, parent in members.items() if pid != me and parent != me and parent not in members]
    # And what they started (vLLM's engine core starts its model's worker): it would be orphaned in turn,
    # and may exit by itself before anyone looks again, leaving the memory it shares with its parent.
    doomed = set(orphans)
    added = doomed
    while added:
        added = {pid for pid, parent in members.items() if parent in added and pid not in doomed}
        doomed |= added
    # Their Python shared memory (vLLM's queues, 160 MiB each) that no process of the group left alive maps.
    segments = mapped_shm(doomed, "psm_") - mapped_shm(set(members) - doomed, "psm_")
    for pid in sorted(doomed):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        if stopping:
            log.info("killed pid %d of group '%s', still running after its actor stopped: %s", pid, group,
                     command[:200])
        else:
            log.warning("killed pid %d of group '%s', left running by an actor that died: %s", pid, group,
                        command[:200])
    unlink_shm(segments | named_by_pid(doomed))  # the names: the memory goes with the last process that maps it
    return sorted(doomed)


def die_with_supervisor() -> None:
    """In an actor the supervisor started: SIGKILL when it dies; exit now if it is already gone.
    Does nothing in an actor started otherwise (systemd, by hand)."""
    # Popped: the actor's own children (a model's helper processes) are not the supervisor's.
    supervisor = os.environ.pop(SUPERVISOR_PID_ENV, "")
    if not supervisor.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("cannot ask to die with the supervisor (prctl: %s): this process may outlive it", exc)
        return
    # The supervisor may have died before the request above: then our parent is already someone else.
    if os.getppid() != int(supervisor):
        print(f"the supervisor (pid {supervisor}) that started this process is gone: exiting", file=sys.stderr)
        os._exit(1)
