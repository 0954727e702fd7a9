"""Workers known to the router, their liveness, and where model instances go (the handlers that
change it are ``router/worker_pool/``)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field

from conveyor.router.models import Instance, InstanceState

HEARTBEAT_INTERVAL_S = 1.0
# A worker silent this long is taken for dead: its work fails, its instances move. On this
# host its process says whether it lives (checked every tick): silence then only counts
# against one that is alive but stuck (its loop held by a model, say), after much longer.
WORKER_TIMEOUT_S = 10.0
LOCAL_WORKER_TIMEOUT_S = 60.0


_HOST = socket.gethostname()


def _alive(worker: WorkerInfo) -> bool:
    # A local worker that crashed is noticed at the next tick, not after the timeout.
    if worker.host != _HOST:
        return True
    try:
        os.kill(worker.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@dataclass(eq=False)
class WorkerInfo:
    identity: bytes
    pid: int
    host: str
    devices: list[str]
    gpu_backends: list[str] = field(default_factory=list)  # what can run on ``devices`` (WorkerHello)
    last_seen: float = field(default_factory=time.monotonic)
    instances: list[Instance] = field(default_factory=list)
    leaving: bool = False  # said WorkerLeaving: gets no new instance

    def hosts(self, device: str) -> bool:
        if device == "cuda":
            return bool(self.devices)
        return device == "cpu" or device in self.devices

    def least_used_gpu(self) -> str:
        """The GPU of this worker holding the fewest instances."""
        return min(self.devices, key=lambda d: sum(1 for i in self.instances if i.load_device == d))


class WorkerPool:
    def __init__(self) -> None:
        self.workers: dict[bytes, WorkerInfo] = {}

    def join(self, info: WorkerInfo) -> None:
        self.workers[info.identity] = info

    def leave(self, identity: bytes) -> WorkerInfo | None:
        return self.workers.pop(identity, None)

    def seen(self, identity: bytes) -> WorkerInfo | None:
        w = self.workers.get(identity)
        if w is not None:
            w.last_seen = time.monotonic()
        return w

    def silent(self, now: float) -> list[WorkerInfo]:
        """Workers to drop: silent too long, or (on this host) whose process is gone."""
        return [w for w in self.workers.values()
                if now - w.last_seen > (LOCAL_WORKER_TIMEOUT_S if w.host == _HOST else WORKER_TIMEOUT_S)
                or not _alive(w)]

    def excuse(self, deaf_s: float) -> None:
        """The router heard nothing for ``deaf_s`` (its own loop was held up): that time is not
        the workers' silence."""
        for w in self.workers.values():
            w.last_seen += deaf_s

    def _unplaceable(self, inst: Instance) -> str:
        """Why no worker takes ``inst``: for a KIND_GPU group when no worker has a GPU, Triton's words
        (core's ValidateInstanceGroup on a host without GPUs; Model Analyzer's GPU variants meet it)."""
        if inst.device == "cuda" and not any(w.hosts("cuda") for w in self.workers.values()):
            group = inst.name.rsplit("_", 1)[0] if inst.name else f"{inst.version.model}_0"
            return f"instance group {group} of model {inst.version.model} has kind KIND_GPU but no GPUs are available"
        wanted = "a GPU" if inst.device == "cuda" else f"device '{inst.device}'"
        return f"no worker has {wanted}"

    def place(self, instances: list[Instance]) -> list[Instance]:
        """Assign unplaced instances to workers; returns those assigned.

        Each instance goes to the worker hosting the fewest instances of the
        same model version (spreading a model over workers first), ties broken
        by the fewest instances overall.
        """
        placed: list[Instance] = []
        for inst in instances:
            if inst.state is not InstanceState.UNPLACED:
                continue
            candidates = [w for w in self.workers.values() if w.hosts(inst.device) and not w.leaving]
            if not candidates:
                # Stays unplaced (a worker with that device may join later), but says why.
                inst.error = self._unplaceable(inst) if self.workers else ""
                continue
            inst.error = ""
            best = min(
                candidates,
                key=lambda w: (sum(1 for i in w.instances if i.version is inst.version), len(w.instances)),
            )
            if inst.device == "cuda":
                inst.placed_device = best.least_used_gpu()
            inst.worker = best.identity
            inst.state = InstanceState.LOADING
            best.instances.append(inst)
            placed.append(inst)
        return placed
