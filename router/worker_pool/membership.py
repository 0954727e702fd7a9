"""Workers joining, loading, leaving and disappearing: ``WorkerHello``, ``ModelLoaded``,
``WorkerLeaving`` (see ``drain.py``) and a worker dropped because it restarted,
went silent or drained."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from conveyor.proto import messages as m
from conveyor.proto.errors import Status
from conveyor.router.context import RouterContext
from conveyor.router.dispatch import Dispatcher
from conveyor.router.models import Instance, InstanceState
from conveyor.router.observability.custom_metrics import CustomMetricsStore
from conveyor.router.pool import WorkerInfo
from conveyor.router.results import Results
from conveyor.router.settings_hub import SettingsHub
from conveyor.router.shared_memory.client_regions import ClientShmRegistry
from conveyor.router.worker_pool.drain import WorkerDrain
from conveyor.router.worker_pool.placement import Placement
from conveyor.shm.naming import segment_name

log = logging.getLogger(__name__)


class WorkerMembership:
    def __init__(
        self, ctx: RouterContext, dispatcher: Dispatcher, results: Results, placement: Placement,
        settings: SettingsHub, shm: ClientShmRegistry, custom_metrics: CustomMetricsStore, group: str,
        load_retries: int = 0,
    ) -> None:
        """``load_retries``: --model-load-retry-count."""
        self.back = ctx.back
        self.pool = ctx.pool
        self.registry = ctx.registry
        self.ledger = ctx.ledger
        self.holds = ctx.holds
        self.cache = ctx.cache
        self.dispatcher = dispatcher
        self.results = results
        self.placement = placement
        self.settings = settings
        self.shm = shm
        self.custom_metrics = custom_metrics
        self.group = group
        self.drain = WorkerDrain(self.pool, self._grant_leave)
        self.load_retries = load_retries
        # An instance turned ready, before any batch is sent to it (router/runtime_lora.py gives it the
        # model's runtime adapters).
        self.on_ready: Callable[[Instance], None] = lambda inst: None
        # A worker is gone (router/runtime_lora.py stops waiting for its answers).
        self.on_lost: Callable[[bytes], None] = lambda identity: None

    def on_hello(self, identity: bytes, hello: m.WorkerHello) -> None:
        if hello.version != m.PROTOCOL_VERSION:
            log.error("worker pid %d speaks protocol %d, not %d", hello.pid, hello.version, m.PROTOCOL_VERSION)
            return
        if identity in self.pool.workers:
            self.drop(identity, "it restarted")
        worker = WorkerInfo(identity, hello.pid, hello.host, hello.devices, hello.gpu_backends)
        self.pool.join(worker)
        # Answer at once: the worker counts itself registered (and tells systemd) on our first word.
        self.back.send(identity, m.encode(m.Heartbeat()))
        self.back.send(identity, self.settings.message())
        self._update_cuda_devices()
        log.info("worker pid %d on %s joined (%s)", hello.pid, hello.host, ", ".join(hello.devices) or "cpu")
        self.placement.place()

    def on_loaded(self, worker: WorkerInfo, msg: m.ModelLoaded) -> None:
        inst = self.registry.find_instance(msg.model, msg.version, msg.instance)
        if inst is None or inst.worker != worker.identity:
            return
        state = inst.version
        if msg.error and inst.load_attempts < self.load_retries:
            inst.load_attempts += 1
            log.warning("model '%s' version %s failed to load (%s): retry %d of %d", msg.model, msg.version,
                        msg.error, inst.load_attempts, self.load_retries)
            if inst in worker.instances:
                worker.instances.remove(inst)
            inst.state, inst.worker = InstanceState.UNPLACED, None
            self.placement.place()
            return
        if msg.error:
            inst.state, inst.error = InstanceState.FAILED, msg.error
            log.error("model '%s' version %s failed to load: %s", msg.model, msg.version, msg.error)
        else:
            inst.state = InstanceState.READY
            inst.user_ready = msg.user_ready
            inst.reports_evictions = msg.reports_evictions
            if state.placement is not None:
                state.placement.forget(inst)  # a new engine: an empty cache, whatever was sent to this instance
                state.placement.trust(state.instances)
            self.on_ready(inst)
            log.info("model '%s' version %s instance %d ready", msg.model, msg.version, msg.instance)
            if not state.load_duration_ns and all(i.state is InstanceState.READY for i in state.instances):
                state.load_duration_ns = max(1, time.monotonic_ns() - state.load_started_ns)
        self.dispatcher.schedule(state)
        self.placement.settle()

    def on_leaving(self, worker: WorkerInfo) -> None:
        self.drain.begin(worker)
        self.placement.place()

    def progress_drain(self) -> None:
        """Move leaving workers' instances on; let the fully drained ones go."""
        for state in self.drain.progress(self.ledger.runs_on):
            self.dispatcher.schedule(state)

    def _grant_leave(self, worker: WorkerInfo) -> None:
        self.drop(worker.identity, "it drained and stopped")
        self.back.send(worker.identity, m.encode(m.LeaveGranted()))

    def drop(self, identity: bytes, why: str) -> None:
        worker = self.pool.leave(identity)
        if worker is None:
            return
        self.drain.forget(worker)  # a leaving worker's replacements exist already
        self.custom_metrics.forget(identity)
        self.registry.waiting.forget(identity)  # its engines' KV-cache use
        self.on_lost(identity)
        self._update_cuda_devices()
        arena = segment_name(self.group, "worker", worker.pid)
        self.holds.forget_region(arena)
        if self.cache is not None:
            self.cache.forget_region(arena)
        log.warning("worker pid %d left: %s", worker.pid, why)
        # Marked: not the request's fault, so the OpenAI ingress may resume it on another engine.
        err = m.ErrorInfo(int(Status.UNAVAILABLE), f"the worker running this request exited ({why})",
                          worker_lost=True)
        # A worker lost while loading an instance a second time: that instance fails to load (a
        # model whose initialize kills its process, e.g. out of memory), as Triton fails the load
        # when the stub dies, rather than being loaded again on every restarted worker. The first
        # time it is only placed again: the worker may have died of another model loading beside it.
        for inst in [i for i in worker.instances if i.state is InstanceState.LOADING]:
            inst.lost_loading += 1
            if inst.lost_loading >= 2:
                st = inst.version
                self.on_loaded(worker, m.ModelLoaded(
                    st.model, st.label, inst.index,
                    f"the worker process loading model instance '{inst.name}' exited ({why})",
                ))
        # Failing a batch schedules its model again: none of this worker's instances may
        # take that batch, or it would go to the dead worker and never be answered.
        for inst in worker.instances:
            if inst.state is not InstanceState.FAILED:
                inst.state = InstanceState.UNPLACED
        for bid, run in self.ledger.batches_on(identity):
            if run.executing:
                self.results.on_result(m.BatchResult(bid, [], error=err), from_worker=False)
            else:
                self.results.end_open_items(bid, run, err)
        touched: set[int] = set()
        for inst in worker.instances:
            state = inst.version
            if state.per_worker:
                state.instances.remove(inst)
            else:
                inst.worker, inst.running = None, 0
                if inst.state is not InstanceState.FAILED:
                    inst.state = InstanceState.UNPLACED
            touched.add(id(state))
        self.placement.place()
        for state in self.registry.every_version():
            if id(state) in touched:
                self.dispatcher.schedule(state)
        self.placement.settle()

    def _update_cuda_devices(self) -> None:
        self.shm.cuda_devices = {
            int(d.split(":", 1)[1]) for w in self.pool.workers.values() for d in w.devices if d.startswith("cuda:")
        }
