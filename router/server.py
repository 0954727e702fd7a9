"""The router actor: one process, two ROUTER sockets, one plain poll loop.

It owns model state, queues and batching, and moves descriptors only: tensor
bytes stay in shared memory, between the ingress arena and the worker arena.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from conveyor.deploy.sd_notify import Notifier
from conveyor.proto import messages as m
from conveyor.proto.drain import DrainClock, Phase
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.batcher import Pending, shape_key
from conveyor.router.client_shm import ClientShmRegistry, control_ops
from conveyor.router.control import ControlHandler
from conveyor.router.models import Instance, InstanceState, ModelRegistry, VersionState
from conveyor.router.repository import scan
from conveyor.router.worker_drain import WorkerDrain
from conveyor.router.workers import HEARTBEAT_INTERVAL_S, WorkerInfo, WorkerPool

log = logging.getLogger(__name__)

# How often registered client segments are checked for having gone away.
SHM_SWEEP_INTERVAL_S = 5.0


@dataclass(slots=True, eq=False)
class Running:
    """A batch on a worker."""

    instance: Instance
    items: list[Pending]
    dispatched_ns: int


class Router:
    def __init__(
        self, repositories: list[str], ingress_endpoint: str, worker_endpoint: str, *, allow_client_shm: bool = False
    ) -> None:
        self.repositories = repositories
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.back = self.ctx.socket(zmq.ROUTER)
        for sock, endpoint in ((self.front, ingress_endpoint), (self.back, worker_endpoint)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes its identity back
            sock.bind(endpoint)
        self.registry = ModelRegistry()
        self.pool = WorkerPool()
        self.worker_drain = WorkerDrain(self.pool, self._grant_leave)
        # SIGTERM: not ready, then refuse new requests, then exit once in-flight ones are done.
        self.shutdown = DrainClock()
        self.control = ControlHandler(self.registry, self.pool, self.shutdown)
        self.shm = ClientShmRegistry(allow_client_shm)
        self.control.add_ops(control_ops(self.shm, self._forget_regions))
        self._next_shm_sweep = 0.0
        self.running: dict[int, Running] = {}
        self.queued: dict[tuple[bytes, int], VersionState] = {}
        self._batch_ids = itertools.count(1)
        self._timers: list[tuple[int, int, VersionState]] = []
        self._timer_seq = itertools.count()
        self._stopping = False
        self.systemd = Notifier()

    # --- lifecycle ---------------------------------------------------------------------

    def load_repository(self) -> None:
        specs = scan(self.repositories)
        self.registry.replace(specs)
        for name, spec in specs.items():
            if spec.error:
                log.error("model '%s' is not available: %s", name, spec.error)
            else:
                log.info("model '%s' versions %s", name, sorted(spec.versions))

    def stop(self, *_: Any) -> None:
        self._stopping = True

    def run(self, exit_timeout_s: float = 30.0, drain_grace_s: float = 0.0) -> None:
        self.shutdown.grace_s, self.shutdown.exit_timeout_s = drain_grace_s, exit_timeout_s
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self.load_repository()
        # Bound (in __init__) and the repository scanned: workers and ingress can come.
        self.systemd.ready(f"serving {len(self.registry.models)} model(s)")
        poller = zmq.Poller()
        poller.register(self.front, zmq.POLLIN)
        poller.register(self.back, zmq.POLLIN)
        next_tick = time.monotonic()
        while True:
            self.systemd.beat()
            if self._stopping:
                self.shutdown.begin()
                self.systemd.stopping("draining")
                if self.shutdown.phase(busy=bool(self.running or self.queued)) is Phase.DONE:
                    break
            timeout_ms = self._poll_timeout_ms(next_tick)
            events = dict(poller.poll(timeout_ms))
            if self.back in events:
                self._drain(self.back, self._on_worker)
            if self.front in events:
                self._drain(self.front, self._on_ingress)
            now = time.monotonic()
            if now >= next_tick:
                self._tick(now)
                next_tick = now + HEARTBEAT_INTERVAL_S
            self._fire_timers()
        self.front.close(0)
        self.back.close(0)

    def _poll_timeout_ms(self, next_tick: float) -> int:
        wait_s = max(0.0, next_tick - time.monotonic())
        if self._timers:
            wait_s = min(wait_s, max(0.0, (self._timers[0][0] - time.monotonic_ns()) / 1e9))
        return int(wait_s * 1000) + (1 if wait_s > 0 else 0)

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Any) -> None:
        # Take everything queued before polling again: fewer syscalls under load.
        for _ in range(256):
            try:
                identity, payload = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                handle(identity.bytes, payload.buffer)
            except Exception:
                log.exception("failed to handle a message")

    # --- ingress side -------------------------------------------------------------------

    def _on_ingress(self, identity: bytes, payload: memoryview) -> None:
        try:
            msg = m.ingress_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            log.error("undecodable message from ingress: %s", exc)
            return
        if isinstance(msg, m.InferRequest):
            if self.shutdown.refusing():
                err = ConveyorError(Status.UNAVAILABLE, "the server is shutting down: retry on another instance")
                self._reply_error(identity, msg.id, msg.model, msg.version, err)
            else:
                self._on_infer(identity, msg)
        elif isinstance(msg, m.ControlRequest):
            try:
                reply = m.ControlReply(msg.id, result=self.control.handle(msg.op, msg.args))
            except ConveyorError as exc:
                reply = m.ControlReply(msg.id, error=m.ErrorInfo(int(exc.status), exc.message))
            self.front.send_multipart([identity, m.encode(reply)])
        elif isinstance(msg, m.Cancel):
            self._on_cancel(identity, msg.id)
        elif isinstance(msg, m.IngressHello) and msg.version != m.PROTOCOL_VERSION:
            log.error("ingress pid %d speaks protocol %d, not %d", msg.pid, msg.version, m.PROTOCOL_VERSION)

    def _on_infer(self, identity: bytes, req: m.InferRequest) -> None:
        try:
            state = self.registry.resolve(req.model, req.version)
        except ConveyorError as exc:
            self._reply_error(identity, req.id, req.model, req.version, exc)
            return
        if req.flags & m.FLAG_CLIENT_SHM:
            try:
                self.shm.resolve(req)
            except ConveyorError as exc:
                self._reply_error(identity, req.id, req.model, req.version, exc)
                return
        batched = state.config.max_batch_size > 0
        rows = req.inputs[0].shape[0] if batched and req.inputs and req.inputs[0].shape else 1
        pending = Pending(identity, req, time.monotonic_ns(), rows, shape_key(req, batched))
        state.batcher.push(pending)
        self.queued[(identity, req.id)] = state
        self._schedule(state)

    def _on_cancel(self, identity: bytes, request_id: int) -> None:
        state = self.queued.pop((identity, request_id), None)
        if state is None:
            return  # already running: its result will come back and be released
        item = state.batcher.remove(identity, request_id)
        if item is not None:
            state.stats.fail.add(time.monotonic_ns() - item.arrival_ns)
            self._reply_error(
                identity, request_id, state.model, state.label,
                ConveyorError(Status.CANCELLED, "request cancelled by the client"),
            )

    def _reply_error(self, identity: bytes, rid: int, model: str, version: str, exc: ConveyorError) -> None:
        resp = m.InferResponse(
            rid, model, version, error=m.ErrorInfo(int(exc.status), exc.message),
            generation=self.registry.generation,
        )
        self.front.send_multipart([identity, m.encode(resp)])

    # --- scheduling ---------------------------------------------------------------------

    def _schedule(self, state: VersionState) -> None:
        now = time.monotonic_ns()
        for item in state.batcher.take_expired(now):
            self.queued.pop((item.ingress, item.request.id), None)
            state.stats.fail.add(now - item.arrival_ns)
            self._reply_error(
                item.ingress, item.request.id, state.model, state.label,
                ConveyorError(Status.DEADLINE_EXCEEDED, "request timeout expired before the model ran it"),
            )
        while state.batcher.queue:
            instance = next(
                (i for i in state.instances if i.state is InstanceState.READY and not i.busy), None
            )
            if instance is None:
                if not state.ready:
                    self._fail_queue(state, ConveyorError(Status.UNAVAILABLE, state.reason))
                return
            batch = state.batcher.next_batch(now)
            if batch is None:
                return
            if isinstance(batch, int):
                heapq.heappush(self._timers, (batch, next(self._timer_seq), state))
                return
            self._dispatch(state, instance, batch, now)

    def _dispatch(self, state: VersionState, instance: Instance, batch: list[Pending], now: int) -> None:
        bid = next(self._batch_ids)
        items = []
        regions: list[m.ClientRegion] = []
        for p in batch:
            self.queued.pop((p.ingress, p.request.id), None)
            state.stats.queue.add(now - p.arrival_ns)
            r = p.request
            items.append(m.BatchItem(r.id, r.inputs, r.outputs, r.parameters, r.request_id))
            if r.regions:
                regions += r.regions
        instance.busy = True
        self.running[bid] = Running(instance, batch, now)
        msg = m.ExecBatch(bid, state.model, state.label, instance.index, items, regions)
        assert instance.worker is not None
        self.back.send_multipart([instance.worker, m.encode(msg)])

    def _fail_queue(self, state: VersionState, exc: ConveyorError) -> None:
        now = time.monotonic_ns()
        while state.batcher.queue:
            item = state.batcher.pop()
            self.queued.pop((item.ingress, item.request.id), None)
            state.stats.fail.add(now - item.arrival_ns)
            self._reply_error(item.ingress, item.request.id, state.model, state.label, exc)

    def _fire_timers(self) -> None:
        now = time.monotonic_ns()
        while self._timers and self._timers[0][0] <= now:
            _, _, state = heapq.heappop(self._timers)
            self._schedule(state)

    # --- worker side --------------------------------------------------------------------

    def _on_worker(self, identity: bytes, payload: memoryview) -> None:
        try:
            msg = m.worker_decoder.decode(payload)
        except msgspec.DecodeError as exc:
            log.error("undecodable message from a worker: %s", exc)
            return
        if isinstance(msg, m.WorkerHello):
            self._on_worker_hello(identity, msg)
            return
        worker = self.pool.seen(identity)
        if worker is None:
            # A worker we dropped (or from before a router restart): make it start over.
            self.back.send_multipart([identity, m.encode(m.Rehello())])
            return
        if isinstance(msg, m.BatchResult):
            self._on_result(msg)
        elif isinstance(msg, m.ModelLoaded):
            self._on_loaded(worker, msg)
        elif isinstance(msg, m.WorkerLeaving):
            self.worker_drain.begin(worker)
            self._place()
        if self.worker_drain.active:
            self._drain_workers()

    def _on_worker_hello(self, identity: bytes, hello: m.WorkerHello) -> None:
        if hello.version != m.PROTOCOL_VERSION:
            log.error("worker pid %d speaks protocol %d, not %d", hello.pid, hello.version, m.PROTOCOL_VERSION)
            return
        if identity in self.pool.workers:
            self._drop_worker(identity, "it restarted")
        worker = WorkerInfo(identity, hello.pid, hello.host, hello.devices)
        self.pool.join(worker)
        # Answer at once: the worker counts itself registered (and tells systemd) on our first word.
        self.back.send_multipart([identity, m.encode(m.Heartbeat())])
        self._update_cuda_devices()
        log.info("worker pid %d on %s joined (%s)", hello.pid, hello.host, ", ".join(hello.devices) or "cpu")
        for state in self.registry.versions():
            if state.per_worker and not state.error:
                index = max((i.index for i in state.instances), default=-1) + 1
                state.instances.append(Instance(state, index, "cpu"))
        self._place()

    def _place(self) -> None:
        pending = [i for s in self.registry.versions() if not s.error for i in s.instances]
        for inst in self.pool.place(pending):
            st = inst.version
            assert inst.worker is not None
            load = m.LoadModel(st.model, st.label, st.path, st.config.SerializeToString(), inst.index, inst.device)
            self.back.send_multipart([inst.worker, m.encode(load)])

    def _on_loaded(self, worker: WorkerInfo, msg: m.ModelLoaded) -> None:
        entry = self.registry.models.get(msg.model)
        state = entry.versions.get(int(msg.version)) if entry else None
        inst = next((i for i in state.instances if i.index == msg.instance), None) if state else None
        if state is None or inst is None or inst.worker != worker.identity:
            return
        if msg.error:
            inst.state, inst.error = InstanceState.FAILED, msg.error
            log.error("model '%s' version %s failed to load: %s", msg.model, msg.version, msg.error)
        else:
            inst.state = InstanceState.READY
            log.info("model '%s' version %s instance %d ready", msg.model, msg.version, msg.instance)
        self._schedule(state)

    def _on_result(self, result: m.BatchResult) -> None:
        run = self.running.pop(result.batch, None)
        if run is None:
            return
        inst = run.instance
        inst.busy = False
        state = inst.version
        now = time.monotonic_ns()
        stats = state.stats
        gen = self.registry.generation
        if result.error is None:
            rows = sum(p.rows for p in run.items)
            stats.record_batch(rows, len(run.items), result.input_ns, result.infer_ns, result.output_ns)
        send = self.front.send_multipart
        for i, p in enumerate(run.items):
            item = result.items[i] if i < len(result.items) else m.ItemResult(i, error=result.error)
            error = item.error or result.error
            if error is None:
                stats.success.add(now - p.arrival_ns)
            else:
                stats.fail.add(now - p.arrival_ns)
            resp = m.InferResponse(
                p.request.id, state.model, state.label, item.outputs, error, item.release, generation=gen
            )
            send([p.ingress, m.encode(resp)], copy=False)
        self._schedule(state)

    def _tick(self, now: float) -> None:
        for worker in self.pool.silent(now):
            self._drop_worker(worker.identity, "it stopped answering")
        if self.worker_drain.active:
            self._drain_workers()
        beat = m.encode(m.Heartbeat())
        for identity in self.pool.workers:
            self.back.send_multipart([identity, beat])
        for state in self.registry.versions():
            if state.batcher.queue:
                self._schedule(state)
        if self.shm and now >= self._next_shm_sweep:
            self._next_shm_sweep = now + SHM_SWEEP_INTERVAL_S
            self._forget_regions(self.shm.sweep())

    def _forget_regions(self, ids: list[int]) -> None:
        """Tell every worker to unmap these client registrations."""
        if ids:
            msg = m.encode(m.ForgetRegions(ids))
            for identity in self.pool.workers:
                self.back.send_multipart([identity, msg])

    def _update_cuda_devices(self) -> None:
        self.shm.cuda_devices = {
            int(d.split(":", 1)[1]) for w in self.pool.workers.values() for d in w.devices if d.startswith("cuda:")
        }

    # --- workers leaving on purpose (router/worker_drain.py) ---------------------------

    def _drain_workers(self) -> None:
        for state in self.worker_drain.progress(self._runs_on):
            self._schedule(state)

    def _runs_on(self, identity: bytes) -> bool:
        return any(run.instance.worker == identity for run in self.running.values())

    def _grant_leave(self, worker: WorkerInfo) -> None:
        self._drop_worker(worker.identity, "it drained and stopped")
        self.back.send_multipart([worker.identity, m.encode(m.LeaveGranted())])

    def _drop_worker(self, identity: bytes, why: str) -> None:
        worker = self.pool.leave(identity)
        if worker is None:
            return
        self.worker_drain.forget(worker)  # a leaving worker's replacements exist already
        self._update_cuda_devices()
        log.warning("worker pid %d left: %s", worker.pid, why)
        err = m.ErrorInfo(int(Status.UNAVAILABLE), f"the worker running this request exited ({why})")
        for bid, run in list(self.running.items()):
            if run.instance.worker == identity:
                self._on_result(m.BatchResult(bid, [], error=err))
        touched: set[int] = set()
        for inst in worker.instances:
            state = inst.version
            if state.per_worker:
                state.instances.remove(inst)
            else:
                inst.state, inst.worker, inst.busy = InstanceState.UNPLACED, None, False
            touched.add(id(state))
        self._place()
        for state in self.registry.versions():
            if id(state) in touched:
                self._schedule(state)
