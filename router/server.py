"""The router actor: one process, two ROUTER sockets, one plain poll loop.

It owns model state, queues and batching, and moves descriptors only: tensor
bytes stay in shared memory, between the ingress arena and the worker arena.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

import msgspec
import zmq

from conveyor.deploy.sd_notify import Notifier
from conveyor.proto import messages as m
from conveyor.proto.drain import DrainClock, Phase
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.client_shm import DEFAULT_MAX_REGIONS, ClientShmRegistry, control_ops
from conveyor.router.cloud import RepositoryRoots
from conveyor.router.control import ControlHandler
from conveyor.router.dispatch import Dispatcher, Running
from conveyor.router.ensemble import EnsembleScheduler
from conveyor.router.ensemble_state import EnsembleVersion
from conveyor.router.held_blocks import HeldBlocks
from conveyor.router.histograms import failure_reason
from conveyor.router.lifecycle import ControlMode, ModelLifecycle
from conveyor.router.loans import Loans
from conveyor.router.models import Instance, InstanceState, ModelRegistry, VersionState
from conveyor.router.otlp_export import otlp_sink
from conveyor.router.pending import Pending
from conveyor.router.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.rate_limiter import RateLimiter
from conveyor.router.replies import Replies, count_failure
from conveyor.router.response_cache import ResponseCache, cache_key
from conveyor.router.self_link import SelfLink
from conveyor.router.settings_hub import SettingsHub
from conveyor.router.stats import ModelStats
from conveyor.router.trace_settings import TraceConfig
from conveyor.router.tracing import Tracer
from conveyor.router.worker_drain import WorkerDrain
from conveyor.router.workers import HEARTBEAT_INTERVAL_S, WorkerInfo, WorkerPool
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache

log = logging.getLogger(__name__)

# How often registered client segments are checked for having gone away.
SHM_SWEEP_INTERVAL_S = 5.0


class Router:
    def __init__(
        self, repositories: list[str], ingress_endpoint: str, worker_endpoint: str, *,
        queue_cap: int = DEFAULT_QUEUE_CAP, allow_client_shm: bool = False,
        control_mode: ControlMode = ControlMode.NONE, load_models: list[str] | None = None,
        strict_config: bool = False, poll_secs: float = 15.0, group: str = "default", cache_bytes: int = 0,
        max_client_shm_regions: int = DEFAULT_MAX_REGIONS,
        trace: TraceConfig | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.repositories = repositories
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.front = self.ctx.socket(zmq.ROUTER)
        self.back = self.ctx.socket(zmq.ROUTER)
        for sock, endpoint in ((self.front, ingress_endpoint), (self.back, worker_endpoint)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes its identity back
            # A ROUTER socket silently drops what exceeds its high-water mark: a reply must
            # never be lost, and the ingress in-flight limit already bounds what can queue.
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.bind(endpoint)
        self.registry = ModelRegistry(queue_cap)
        self.pool = WorkerPool()
        self.worker_drain = WorkerDrain(self.pool, self._grant_leave)
        # SIGTERM: not ready, then refuse new requests, then exit once in-flight ones are done.
        self.shutdown = DrainClock()
        self.control = ControlHandler(self.registry, self.pool, self.shutdown)
        self.roots = RepositoryRoots(repositories)  # s3://, gs://, as:// roots become local mirrors
        self.lifecycle = ModelLifecycle(self.registry, self.roots.local, control_mode, load_models, strict_config)
        self.control.add_ops({"repository_index": lambda ready=False: self.lifecycle.index(bool(ready))})
        self._poll_secs = poll_secs
        self._next_poll = time.monotonic() + poll_secs
        self.shm = ClientShmRegistry(allow_client_shm, max_client_shm_regions)
        self.control.add_ops(control_ops(self.shm, self._forget_regions))
        self._next_shm_sweep = 0.0
        # Log and trace settings (observability extensions): kept here, pushed to every process.
        self._ingress_peers: dict[bytes, int] = {}  # identity -> pid
        trace = trace or TraceConfig()
        self.settings = SettingsHub(trace, self._broadcast_settings)
        self.tracer = Tracer(self.settings.trace, otlp_sink(trace))
        self.control.trace_export = self.tracer.export_stats
        self.control.add_ops({
            "log_settings": self.settings.log_settings,
            "trace_settings": lambda model="", settings=None: self.settings.trace_settings(
                model, settings, lambda name: name in self.registry.models),
        })
        self._stopping = False
        self.systemd = Notifier()
        self.group = group
        # Ensembles: steps are the router's own requests; blocks it keeps are held and lent out.
        regions = RegionCache()  # other processes' arenas: flags to write, condition tensors to read
        self.holds = HeldBlocks(regions)
        self.loans = Loans(segment_name(group, "router"), self.holds)
        self.self_link = SelfLink(self.ctx, self.front)
        self.ensembles = EnsembleScheduler(
            self._submit_step, lambda step_id: self._on_cancel(self.self_link.identity, step_id),
            self._send_response,
            self.holds, self.loans, lambda: self.registry.generation, regions,
        )
        # What the router keeps of other processes' memory (tests and operators check it returns to 0).
        self.control.add_ops({"held_blocks": lambda: {
            "held": len(self.holds), "loans": len(self.loans), "ensembles": len(self.ensembles)}})
        self.cache = ResponseCache(cache_bytes, self.holds) if cache_bytes > 0 else None
        self.control.response_cache = self.cache is not None
        self.limiter = rate_limiter  # None: --rate-limit off, nothing to pay
        self.replies = Replies(self.front, self.registry)
        self._reply_error = self.replies.error
        self.dispatcher = Dispatcher(self.back, self.replies, self.limiter)
        self._schedule = self.dispatcher.schedule
        self.running = self.dispatcher.running
        self.started = self.dispatcher.started
        self.queued = self.dispatcher.queued

    # --- lifecycle ---------------------------------------------------------------------

    def load_repository(self) -> None:
        self.roots.sync()
        self.lifecycle.startup()

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
        poller.register(self.self_link.sock, zmq.POLLIN)
        next_tick = time.monotonic()
        while True:
            self.systemd.beat()
            if self._stopping:
                self.shutdown.begin()
                self.systemd.stopping("draining")
                if self.shutdown.phase(busy=self.dispatcher.busy) is Phase.DONE:
                    break
            timeout_ms = self._poll_timeout_ms(next_tick)
            events = dict(poller.poll(timeout_ms))
            if self.back in events:
                self._drain(self.back, self._on_worker)
            if self.front in events:
                self._drain(self.front, self._on_ingress)
            if self.self_link.sock in events:
                self.self_link.drain(self.ensembles.on_response)
            now = time.monotonic()
            if now >= next_tick:
                self._tick(now)
                next_tick = now + HEARTBEAT_INTERVAL_S
            self.dispatcher.fire_timers()
        self.self_link.close()
        self.tracer.close()
        self.front.close(0)
        self.back.close(0)
        self.loans.close()

    def _poll_timeout_ms(self, next_tick: float) -> int:
        wait_s = max(0.0, next_tick - time.monotonic())
        due_ns = self.dispatcher.next_timer_ns()
        if due_ns:
            wait_s = min(wait_s, max(0.0, (due_ns - time.monotonic_ns()) / 1e9))
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
        elif isinstance(msg, m.ControlRequest) and msg.op in ("repository_load", "repository_unload"):
            self._on_model_control(identity, msg)
        elif isinstance(msg, m.ControlRequest):
            try:
                reply = m.ControlReply(msg.id, result=self.control.handle(msg.op, msg.args))
            except ConveyorError as exc:
                reply = m.ControlReply(msg.id, error=m.ErrorInfo(int(exc.status), exc.message))
            self.front.send_multipart([identity, m.encode(reply)])
        elif isinstance(msg, m.Cancel):
            self._on_cancel(identity, msg.id)
        elif isinstance(msg, m.TraceEnd):
            self.tracer.finish(msg)
        elif isinstance(msg, m.IngressHello):
            if msg.version != m.PROTOCOL_VERSION:
                log.error("ingress pid %d speaks protocol %d, not %d", msg.pid, msg.version, m.PROTOCOL_VERSION)
                return
            self._ingress_peers[identity] = msg.pid
            self.front.send_multipart([identity, self.settings.message()])

    def _on_infer(self, identity: bytes, req: m.InferRequest, ensemble_stats: ModelStats | None = None) -> None:
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
        if not req.outputs:  # a BLS request that names no outputs gets them all, as in Triton
            req.outputs = [m.OutputSpec(o.name) for o in state.config.output]
        if isinstance(state, EnsembleVersion):
            self.ensembles.start(identity, req, state)
            return
        if req.cache_key and self._answer_from_cache(identity, req, state):
            return
        batched = state.config.max_batch_size > 0
        rows = req.inputs[0].shape[0] if batched and req.inputs and req.inputs[0].shape else 1
        try:
            key = state.batch_key(req)
        except ConveyorError as exc:  # longer than the largest pad bucket
            self._reply_error(identity, req.id, state.model, state.label, exc)
            return
        pending = Pending(identity, req, time.monotonic_ns(), rows, key)
        if ensemble_stats is not None:
            pending.ensemble_stats = ensemble_stats
        if req.trace is not None:
            pending.trace = self.tracer.sample(state.model, state.label, req.trace, req.request_id,
                                               self._ingress_peers.get(identity, 0))
        try:
            state.batcher.push(pending)
        except ConveyorError as exc:  # queue full
            count_failure(state, "REJECTED", 0)
            self._reply_error(identity, req.id, state.model, state.label, exc)
            return
        self.queued[(identity, req.id)] = state
        self._schedule(state)

    def _answer_from_cache(self, identity: bytes, req: m.InferRequest, state: VersionState) -> bool:
        """Answer a cache hit at once (the cached block lent to the ingress). On a miss the
        request runs, keeping its ``cache_key`` so that ``_on_result`` caches its response."""
        start = time.monotonic_ns()
        cache = self.cache
        if cache is None or not state.config.response_cache.enable:
            req.cache_key = b""
            return False
        entry = cache.get(cache_key(state.model, state.label, req))
        if entry is not None:
            try:
                release = [self.loans.lend(entry.blocks)]
            except ConveyorError:
                entry = None  # no loan left: run it instead
        if entry is None:
            state.stats.cache_miss.add(time.monotonic_ns() - start)
            return False
        elapsed = time.monotonic_ns() - start
        state.stats.record_cache_hit(elapsed, elapsed)
        self._send_response(identity, m.InferResponse(
            req.id, state.model, state.label, entry.outputs, release=release, generation=self.registry.generation,
        ))
        return True

    def _cache_response(self, state: VersionState, req: m.InferRequest, item: m.ItemResult) -> list[m.Release]:
        """A cache miss's outputs: keep them in the cache, and lend them to this request's ingress too
        (the worker's own flag now belongs to the cache)."""
        start = time.monotonic_ns()
        assert self.cache is not None
        try:
            loan = self.loans.lend(item.release)
        except ConveyorError:
            return item.release
        self.cache.put(cache_key(state.model, state.label, req), item.outputs, item.release)
        state.stats.cache_miss.add(time.monotonic_ns() - start, 0)  # Triton counts the insertion as miss time
        return [loan]

    def _send_response(self, identity: bytes, resp: m.InferResponse) -> None:
        self.front.send_multipart([identity, m.encode(resp)])

    def _submit_step(self, req: m.InferRequest, ensemble_stats: ModelStats) -> None:
        """An ensemble step: a request of the router's own link (answered there)."""
        self._on_infer(self.self_link.identity, req, ensemble_stats)

    def _on_model_control(self, identity: bytes, msg: m.ControlRequest) -> None:
        """Load answers once the model settled (``_settle``); unload at once."""
        try:
            name = str(msg.args.get("model", ""))
            if msg.op == "repository_load":
                self.lifecycle.check_control_allowed()
                self.roots.sync()  # as Triton, a load looks at the repository afresh
                self.lifecycle.load(name, (identity, msg.id), str(msg.args.get("config", "")),
                                    msg.args.get("files") or None)
            else:
                self.lifecycle.unload(name, bool(msg.args.get("unload_dependents", False)))
                self.front.send_multipart([identity, m.encode(m.ControlReply(msg.id))])
        except ConveyorError as exc:
            reply = m.ControlReply(msg.id, error=m.ErrorInfo(int(exc.status), exc.message))
            self.front.send_multipart([identity, m.encode(reply)])
            return
        self._place()
        self._settle()

    def _place(self) -> None:
        """Give per-worker models (no instance_group) one instance per worker, then
        send every unplaced instance to a worker."""
        workers = len(self.pool.workers)
        for state in self.registry.live_versions():
            if state.per_worker and not state.error:
                for _ in range(workers - len(state.instances)):
                    state.instances.append(Instance(state, self.registry.next_index(), "cpu"))
        self._place_instances()

    def _settle(self) -> None:
        """Let the lifecycle swap, fail or retire entries; answer load calls; unload
        retired instances that have nothing left to do."""
        if not self.lifecycle.busy:
            return
        running = {id(run.instance) for run in self.running.values()}
        out = self.lifecycle.settle(running)
        for (identity, cid), error in out.answers:
            err = None if error is None else m.ErrorInfo(int(error.status), error.message)
            self.front.send_multipart([identity, m.encode(m.ControlReply(cid, error=err))])
        for inst in out.unload:
            worker = self.pool.workers.get(inst.worker) if inst.worker is not None else None
            if worker is not None:
                if inst in worker.instances:
                    worker.instances.remove(inst)
                st = inst.version
                self.back.send_multipart([worker.identity, m.encode(m.UnloadModel(st.model, st.label, inst.index))])
            inst.worker = None
            if self.limiter is not None:
                self.limiter.unregister(inst)

    def _on_cancel(self, identity: bytes, request_id: int) -> None:
        if not self.dispatcher.cancel(identity, request_id):
            self.ensembles.cancel(identity, request_id)

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
        if isinstance(msg, m.ItemResponse):
            self._on_item_response(identity, msg)
        elif isinstance(msg, m.BatchResult):
            self._on_result(msg)
        elif isinstance(msg, m.ModelLoaded):
            self._on_loaded(worker, msg)
        elif isinstance(msg, m.WorkerLeaving):
            self.worker_drain.begin(worker)
            self._place()
        elif isinstance(msg, m.CustomMetrics):
            self.control.custom_metrics.update(identity, msg.metrics)
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
        self.back.send_multipart([identity, self.settings.message()])
        self._update_cuda_devices()
        log.info("worker pid %d on %s joined (%s)", hello.pid, hello.host, ", ".join(hello.devices) or "cpu")
        self._place()

    def _place_instances(self) -> None:
        pending = [i for s in self.registry.live_versions() if not s.error for i in s.instances]
        if self.limiter is not None:
            self._register_limits(pending)
        for inst in self.pool.place(pending):
            st = inst.version
            assert inst.worker is not None
            load = m.LoadModel(st.model, st.label, st.path, st.config.SerializeToString(), inst.index, inst.load_device)
            self.back.send_multipart([inst.worker, m.encode(load)])

    def _register_limits(self, instances: list[Instance]) -> None:
        """Rate limiting: an instance whose resources can never be met fails to load (Triton's rule)."""
        assert self.limiter is not None
        for inst in instances:
            if inst.state is InstanceState.UNPLACED:
                try:
                    self.limiter.register(inst)
                except ConveyorError as exc:
                    inst.state, inst.error = InstanceState.FAILED, exc.message
                    log.error("model '%s' version %s cannot load: %s", inst.version.model, inst.version.label,
                              exc.message)

    def _on_loaded(self, worker: WorkerInfo, msg: m.ModelLoaded) -> None:
        inst = self.registry.find_instance(msg.model, msg.version, msg.instance)
        if inst is None or inst.worker != worker.identity:
            return
        state = inst.version
        if msg.error:
            inst.state, inst.error = InstanceState.FAILED, msg.error
            log.error("model '%s' version %s failed to load: %s", msg.model, msg.version, msg.error)
        else:
            inst.state = InstanceState.READY
            log.info("model '%s' version %s instance %d ready", msg.model, msg.version, msg.instance)
        self._schedule(state)
        self._settle()

    def _on_result(self, result: m.BatchResult) -> None:
        run = self.running.get(result.batch)
        if run is None or not run.executing:
            return
        run.executing = False
        inst = run.instance
        inst.busy = False
        if self.limiter is not None:
            self.limiter.release(inst)
        state = inst.version
        stats = state.stats
        if result.error is None:
            rows = sum(p.rows for p in run.items)
            stats.record_batch(rows, len(run.items), result.input_ns, result.infer_ns, result.output_ns)
            state.latency.computed(len(run.items), result.input_ns, result.infer_ns, result.output_ns)
            adaptive = state.batcher.adaptive
            if adaptive is not None:
                adaptive.executed(time.monotonic_ns(), rows)
        if run.open is not None:
            # Decoupled: the items were (or will be) answered by ItemResponses.
            if result.error is not None:
                self._end_open_items(result.batch, run, result.error)
            else:
                for p in run.items:  # an ensemble's decoupled step: its compute times count there too
                    if p.ensemble_stats is not None:
                        p.ensemble_stats.record_composing(result.input_ns, result.infer_ns, result.output_ns)
            if not any(run.open):
                self.running.pop(result.batch, None)
            self._after_batch(state)
            return
        del self.running[result.batch]
        now = time.monotonic_ns()
        gen = self.registry.generation
        send = self.front.send_multipart
        order = state.order
        started = self.started
        for i, p in enumerate(run.items):
            started.pop((p.ingress, p.request.id), None)
            item = result.items[i] if i < len(result.items) else m.ItemResult(i, error=result.error)
            error = item.error or result.error
            if error is None:
                stats.success.add(now - p.arrival_ns)
                state.latency.succeeded(now - p.arrival_ns)
                if p.ensemble_stats is not None:
                    p.ensemble_stats.record_composing(result.input_ns, result.infer_ns, result.output_ns)
            else:
                count_failure(state, failure_reason(error.status), now - p.arrival_ns)
            release = item.release
            if p.request.cache_key and error is None:
                release = self._cache_response(state, p.request, item)
            resp = m.InferResponse(p.request.id, state.model, state.label, item.outputs, error, release,
                                   parameters=item.parameters, generation=gen)
            if p.trace is not None:
                worker = self.pool.workers.get(inst.worker or b"")
                self.tracer.returned(p.trace, result.trace_ns, worker.pid if worker else 0,
                                     error.message if error else "")
                resp.trace_id = p.trace.id
            if order is None:
                send([p.ingress, m.encode(resp)], copy=False)
            else:
                for identity, payload in order.release(p.ticket, p.ingress, m.encode(resp)):
                    send([identity, payload], copy=False)
        self._after_batch(state)
        self._settle()

    def _after_batch(self, state: VersionState) -> None:
        """An instance of ``state`` is free again: schedule it, and with rate limiting
        every version that waited for the resources it gave back, best turn first."""
        if self.limiter is None:
            self._schedule(state)
            return
        self.limiter.wait(state)
        for waiting in self.limiter.take_waiting():
            self._schedule(waiting)

    def _on_item_response(self, worker: bytes, msg: m.ItemResponse) -> None:
        """Forward one response of a decoupled model's request to its ingress."""
        run = self.running.get(msg.batch)
        if (
            run is None or run.open is None or run.instance.worker != worker
            or not 0 <= msg.index < len(run.open) or not run.open[msg.index]
        ):
            return  # a late response for a request already ended (worker dropped, router restarted)
        p = run.items[msg.index]
        state = run.instance.version
        if not p.responded:  # nv_inference_first_response_histogram_ms: a failure is no first response
            p.responded = True
            first = state.latency.first_response
            if first is not None and msg.error is None:
                first.histogram.observe(time.monotonic_ns() - p.arrival_ns)
        resp = m.InferResponse(
            p.request.id, state.model, state.label, msg.outputs, msg.error, msg.release, msg.final,
            msg.parameters, self.registry.generation,
        )
        self.front.send_multipart([p.ingress, m.encode(resp)], copy=False)
        if msg.final:
            self._close_item(msg.batch, run, msg.index, msg.error)

    def _close_item(self, bid: int, run: Running, index: int, error: m.ErrorInfo | None) -> None:
        """A decoupled request had its final response: count it, forget it."""
        assert run.open is not None
        run.open[index] = False
        p = run.items[index]
        self.started.pop((p.ingress, p.request.id), None)
        state = run.instance.version
        took = time.monotonic_ns() - p.arrival_ns
        if error is None:
            state.stats.success.add(took)
            state.latency.succeeded(took)
        else:
            count_failure(state, failure_reason(error.status), took)
        if not run.executing and not any(run.open):
            self.running.pop(bid, None)

    def _end_open_items(self, bid: int, run: Running, error: m.ErrorInfo) -> None:
        """Answer every decoupled request of ``run`` still open with ``error`` (final)."""
        assert run.open is not None
        for i, is_open in enumerate(run.open):
            if is_open:
                self._on_item_response(run.instance.worker or b"", m.ItemResponse(bid, i, error=error))

    def _tick(self, now: float) -> None:
        for worker in self.pool.silent(now):
            self._drop_worker(worker.identity, "it stopped answering")
        if self.worker_drain.active:
            self._drain_workers()
        beat = m.encode(m.Heartbeat())
        for identity in self.pool.workers:
            self.back.send_multipart([identity, beat])
        for state in self.registry.every_version():
            if len(state.batcher):
                self._schedule(state)
        if self.lifecycle.mode is ControlMode.POLL and now >= self._next_poll:
            self._next_poll = now + self._poll_secs
            self.roots.sync()
            self.lifecycle.poll()
            self._place()
        self._settle()
        self.loans.collect(expire=True)
        if self.shm and now >= self._next_shm_sweep:
            self._next_shm_sweep = now + SHM_SWEEP_INTERVAL_S
            self._forget_regions(self.shm.sweep())

    def _broadcast_settings(self, payload: bytes) -> None:
        """A changed ``SettingsUpdate`` to every ingress (and BLS link) and worker we know."""
        for identity in self._ingress_peers:  # one gone meanwhile: ROUTER drops the message
            self.front.send_multipart([identity, payload])
        for identity in self.pool.workers:
            self.back.send_multipart([identity, payload])

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
        for state in self.worker_drain.progress(self.dispatcher.runs_on):
            self._schedule(state)

    def _grant_leave(self, worker: WorkerInfo) -> None:
        self._drop_worker(worker.identity, "it drained and stopped")
        self.back.send_multipart([worker.identity, m.encode(m.LeaveGranted())])

    def _drop_worker(self, identity: bytes, why: str) -> None:
        worker = self.pool.leave(identity)
        if worker is None:
            return
        self.worker_drain.forget(worker)  # a leaving worker's replacements exist already
        self.control.custom_metrics.forget(identity)
        self._update_cuda_devices()
        arena = segment_name(self.group, "worker", worker.pid)
        self.holds.forget_region(arena)
        if self.cache is not None:
            self.cache.forget_region(arena)
        log.warning("worker pid %d left: %s", worker.pid, why)
        err = m.ErrorInfo(int(Status.UNAVAILABLE), f"the worker running this request exited ({why})")
        # Failing a batch schedules its model again: none of this worker's instances may
        # take that batch, or it would go to the dead worker and never be answered.
        for inst in worker.instances:
            inst.state = InstanceState.UNPLACED
        for bid, run in list(self.running.items()):
            if run.instance.worker == identity:
                if run.executing:
                    self._on_result(m.BatchResult(bid, [], error=err))
                else:
                    self._end_open_items(bid, run, err)
        touched: set[int] = set()
        for inst in worker.instances:
            state = inst.version
            if state.per_worker:
                state.instances.remove(inst)
            else:
                inst.state, inst.worker, inst.busy = InstanceState.UNPLACED, None, False
            touched.add(id(state))
        self._place()
        for state in self.registry.every_version():
            if id(state) in touched:
                self._schedule(state)
        self._settle()
