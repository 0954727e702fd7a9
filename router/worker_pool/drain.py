"""Workers that leave on purpose: their work moves elsewhere before they go.

A stopping worker sends ``WorkerLeaving``. From then on:

1. it gets no new instance (``WorkerPool.place`` skips it), and each instance
   it hosts of a model with an explicit ``instance_group`` gets a replacement,
   placed on another worker (per-worker models already have one everywhere);
2. each of its instances keeps taking batches until the model has a READY
   instance on a worker that stays (or none can come), then turns DRAINING
   and takes no more: the model never goes without an instance while a
   replacement loads;
3. once all its instances are DRAINING and none of its batches is running, the
   router forgets the worker and answers ``LeaveGranted``; the worker exits.

No request fails on the way: what was dispatched to it comes back from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from conveyor.router.models import Instance, InstanceState, VersionState
from conveyor.router.pool import WorkerInfo, WorkerPool

log = logging.getLogger(__name__)


def _stays(pool: WorkerPool, inst: Instance) -> bool:
    worker = pool.workers.get(inst.worker) if inst.worker is not None else None
    return worker is not None and not worker.leaving


def _can_hand_over(pool: WorkerPool, state: VersionState) -> bool:
    """True when the version does not need its leaving instances any more: it has a
    READY instance on a staying worker, or nothing on a staying worker is on its way."""
    coming = False
    for inst in state.instances:
        if not _stays(pool, inst):
            continue
        if inst.state is InstanceState.READY:
            return True
        coming = coming or inst.state is InstanceState.LOADING
    return not coming


class WorkerDrain:
    """The leaving workers of one router, and the steps that let them go."""

    def __init__(self, pool: WorkerPool, release: Callable[[WorkerInfo], None]) -> None:
        self.pool = pool
        # Called once a worker may go: the router drops it and sends LeaveGranted.
        self._release = release
        # The whole group stops (the supervisor's CORE_STOP_SIGNAL): every worker leaves, so a leaving worker's
        # instances get no replacement. One moved to a worker about to leave would load there while it leaves and
        # hold its stop up to the exit timeout (a model slow to create: L0_lifecycle's creation_delay_sec).
        self.group_stopping = False

    @property
    def active(self) -> bool:
        for w in self.pool.workers.values():  # asked per worker message: a plain loop, no generator
            if w.leaving:
                return True
        return False

    def begin(self, worker: WorkerInfo) -> None:
        """``WorkerLeaving`` from ``worker``: add replacements; the caller places them."""
        if worker.leaving:
            return
        worker.leaving = True
        log.info("worker pid %d is leaving: moving its %d instance(s)", worker.pid, len(worker.instances))
        for inst in worker.instances:
            state = inst.version
            if state.per_worker or self.group_stopping:
                continue
            index = max(i.index for i in state.instances) + 1
            state.instances.append(Instance(state, index, inst.device, name=inst.name))  # it takes over that name

    def progress(self, running_on: Callable[[bytes], bool]) -> list[VersionState]:
        """Turn instances DRAINING where a successor serves; release idle, fully drained
        workers. Returns the versions whose instances changed (to schedule again)."""
        touched: list[VersionState] = []
        for worker in [w for w in self.pool.workers.values() if w.leaving]:
            for inst in worker.instances:
                if inst.state is not InstanceState.DRAINING and _can_hand_over(self.pool, inst.version):
                    inst.state = InstanceState.DRAINING
                    touched.append(inst.version)
            drained = all(i.state is InstanceState.DRAINING for i in worker.instances)
            if drained and not running_on(worker.identity):
                self.forget(worker)
                self._release(worker)
        return touched

    def forget(self, worker: WorkerInfo) -> None:
        """Take a leaving worker's instances out of their versions (its replacements
        exist already), so dropping it re-places nothing."""
        if not worker.leaving:
            return
        for inst in worker.instances:
            if inst in inst.version.instances:
                inst.version.instances.remove(inst)
        worker.instances.clear()
