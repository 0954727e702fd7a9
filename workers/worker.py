"""The worker actor: runs model instances for the router.

One DEALER socket to the router, one thread per loaded instance (so a long
batch never stops heartbeats or other instances), results handed back to the
socket-owning main thread through a queue and a wake pipe. A second DEALER
(``BlsLink``) carries the BLS requests models make, as an ingress would.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import zmq

from conveyor.deploy.log_settings import ProcessLog
from conveyor.deploy.sd_notify import Notifier
from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.batch_shapes import BatchShapes
from conveyor.proto.dispatch_cpu import release_thread
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.framing import Outbox, drain
from conveyor.proto.polling import Poller, spin_seconds
from conveyor.proto.sequence_config import sequence_batched
from conveyor.proto.signal_wake import wake_on_signals
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends import load_backend
from conveyor.workers.backends.base import AnsweredLater, Backend, RequestBackend, RequestOutcome
from conveyor.workers.backends.python.bls import BlsClient
from conveyor.workers.backends.python.pb_utils import bls as pb_bls
from conveyor.workers.backends.python.pb_utils import metrics as pb_metrics
from conveyor.workers.batch_io import (
    IoPlan,
    OutputWriter,
    PlannedOutput,
    TensorViews,
    attach_parameters,
    gather_inputs,
    gather_requests,
    host_inputs,
    plan_batch_outputs,
    plan_request_outputs,
)
from conveyor.workers.batch_layout import BatchLayout
from conveyor.workers.bls_link import BlsLink
from conveyor.workers.classification import load_labels
from conveyor.workers.client_regions import ClientRegionMaps
from conveyor.workers.devices import DeviceMap, gpu_backends, local_gpu_count
from conveyor.workers.inline import (
    INLINE_AFTER,
    INLINE_MAX_INPUT_BYTES,
    INLINE_MAX_NS,
    inline_allowed,
)
from conveyor.workers.inline_switch import InlineSwitch
from conveyor.workers.item_stream import ItemStream
from conveyor.workers.reply_links import ReplyLinks
from conveyor.workers.sequence_state import SequenceSlots
from conveyor.workers.warmup import warm_up

log = logging.getLogger(__name__)

DEFAULT_ARENA_BYTES = 256 << 20
# No word from the router for this long is logged, once per silence, and nothing more: its
# silence says nothing about its process (it may be busy, or gone while the supervisor starts
# another). A router that does not know this worker (it restarted) says so, ``Rehello``, to the
# next heartbeat; only then are the instances dropped.
ROUTER_QUIET_S = 30.0
# Custom metrics (pb_utils.MetricFamily) go to the router at most this often. 0: on the loop turn
# after the change (a change wakes the loop), at most one message a turn, riding with the turn's
# other frames to the router; a model reading /metrics right after a change (Triton's QA model)
# finds it there.
METRICS_FLUSH_S = 0.0


@dataclass(eq=False)
class LoadedInstance:
    key: tuple[str, str, int]
    backend: Backend | RequestBackend | None
    config: mc.ModelConfig
    plan: IoPlan  # the config's tensor handling and labels, worked out at load
    # Decided once at load: a runtime Protocol check costs tens of microseconds per batch.
    per_request: bool = False
    decoupled: bool = False
    sequences: SequenceSlots | None = None  # control inputs and implicit state (sequence_batching)
    layout: BatchLayout | None = None  # ragged inputs, padding, batch inputs/outputs (array backends)
    # Its thread loads and runs the model: on every CPU, not the dispatch core (proto/dispatch_cpu.py).
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, initializer=release_thread))
    # Short batches of a backend that allows it run on the main thread (see ``Worker._exec``).
    inline_ok: bool = False
    exec_ns: float = 0.0  # recent batch time, an EWMA
    batches: int = 0
    # Tasks handed to the executor and finished; each counter has one writer thread.
    submitted: int = 0
    finished: int = 0

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on this instance's thread, after the tasks already given to it."""
        self.submitted += 1

        def run() -> None:
            try:
                task()
            finally:
                self.finished += 1

        self.executor.submit(run)

    def runs_inline(self, msg: m.ExecBatch) -> bool:
        """Whether this batch may run on the main thread: the backend allows it, nothing is
        queued on the instance's thread (order), its batches are short, and its inputs are
        no larger than ``INLINE_MAX_INPUT_BYTES``."""
        return (self.inline_ok and self.submitted == self.finished and self.batches >= INLINE_AFTER
                and self.exec_ns < INLINE_MAX_NS and InlineSwitch.on
                and _input_bytes(msg) <= INLINE_MAX_INPUT_BYTES)


EXEC_ALPHA = 0.2  # weight of a batch's time in its instance's recent average


class Worker:
    def __init__(
        self, router_endpoint: str, group: str, arena_bytes: int = DEFAULT_ARENA_BYTES, bls_endpoint: str = "",
        exit_timeout_s: float = 30.0, spin_s: float | None = None,
    ) -> None:
        """``bls_endpoint``: the router's ingress endpoint, for models' BLS requests ("" = no BLS);
        ``spin_s``: how long to spin on the sockets before each blocking poll (None: ``spin_seconds()``)."""
        self.spin_s = spin_seconds() if spin_s is None else spin_s
        gpus = local_gpu_count()
        self.devices = DeviceMap(gpus, os.environ)
        self.gpu_backends = gpu_backends(gpus)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(router_endpoint)
        # Any thread (instance threads, threads a model starts) wakes the main
        # loop with a byte down this pipe: no per-thread sockets to leak.
        self._wake_rx, self._wake_tx = os.pipe()
        self._woken = False
        os.set_blocking(self._wake_rx, False)
        os.set_blocking(self._wake_tx, False)
        # What other threads send: (destination, descriptor); "" is the router, else an ingress endpoint.
        self.results: queue.SimpleQueue[tuple[str, bytes]] = queue.SimpleQueue()
        # What this loop turn sends, flushed at its end: one message per peer.
        self.out = Outbox(self.sock)
        self.replies = ReplyLinks(self.ctx)
        self.arena = Arena(segment_name(group, "worker"), arena_bytes)
        self.regions = RegionCache()
        self.client_regions = ClientRegionMaps()
        self.views = TensorViews(self.regions, self.client_regions)
        self.writer = OutputWriter(self.arena, self.views)
        self.bls: BlsLink | None = None
        if bls_endpoint:
            self.bls = BlsLink(self.ctx, bls_endpoint, self.arena, self.writer.lock, self._wake)
            pb_bls.set_executor(BlsClient(self.bls, self.regions))
        pb_metrics.REGISTRY.on_dirty = self._wake  # a model's metric change leaves within METRICS_FLUSH_S
        self.instances: dict[tuple[str, str, int], LoadedInstance] = {}
        # (batch, index) -> the stream of each request a request backend is running
        # or, decoupled, has not ended yet. Instance threads remove their own entries.
        self.streams: dict[tuple[int, int], tuple[tuple[str, str, int], ItemStream]] = {}
        self._stopping = False
        self._last_heard = time.monotonic()
        self._quiet_logged = False
        self._registered = False
        self.systemd = Notifier()
        self.exit_timeout_s = exit_timeout_s
        self._leave_requested = False
        self._leave_by: float | None = None  # set once WorkerLeaving is sent
        self._next_metrics = 0.0

    def stop(self, *_: Any) -> None:
        """SIGTERM/SIGINT: leave gracefully (drain); a second signal stops at once."""
        if self._leave_requested:
            self._stopping = True
        self._leave_requested = True

    def _leave(self, now: float) -> None:
        """Hand the work back before exiting: the router answers LeaveGranted once it
        sends us nothing more and every batch it gave us has come back."""
        if self._leave_by is None:
            if not self._registered:
                self._stopping = True  # the router knows nothing of ours: nothing to hand back
                return
            self.out.send(m.encode(m.WorkerLeaving("stopping")))
            self._leave_by = now + self.exit_timeout_s
            self.systemd.stopping("draining: finishing in-flight batches")
            log.info("leaving: waiting for the router to move this worker's instances")
        elif now > self._leave_by:
            log.warning("the router did not let this worker go within %.0fs: exiting", self.exit_timeout_s)
            self._stopping = True

    def _hello(self) -> None:
        self.out.send(m.encode(m.WorkerHello(m.PROTOCOL_VERSION, os.getpid(), socket.gethostname(),
                                              self.devices.reported(), gpu_backends=self.gpu_backends)))

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        # A signal wakes the loop through the wake pipe (proto/signal_wake.py says why), not at the poll's timeout.
        unwake = wake_on_signals(self._wake_tx)
        self._hello()
        self.out.flush()
        sources: list[Any] = [self.sock, self._wake_rx]
        if self.bls is not None:
            sources.append(self.bls.sock)
        poller = Poller(sources, self.spin_s)
        next_beat = time.monotonic()
        more = False  # a drain stopped at its cap: poll without waiting
        try:
            while not self._stopping:
                self.systemd.beat()
                ready = poller.poll(0 if more else self._poll_ms())
                more = False
                if self._wake_rx in ready:
                    try:
                        while os.read(self._wake_rx, 4096):
                            pass
                    except BlockingIOError:
                        pass
                    self._woken = False
                self._take_posted()
                if self.bls is not None:
                    self.bls.flush()
                    if self.bls.sock in ready:
                        more |= self.bls.drain()
                if self.sock in ready:
                    more |= drain(self.sock, m.worker_inbox_decoder.decode, self._on_message, "the router")
                now = time.monotonic()
                if pb_metrics.REGISTRY.dirty and now >= self._next_metrics:
                    self._send_metrics(now)
                if self._leave_requested:
                    self._leave(now)
                if now >= next_beat:
                    self.out.send(m.encode(m.Heartbeat()))
                    next_beat = now + 1.0
                    if now - self._last_heard > ROUTER_QUIET_S and not self._quiet_logged:
                        self._quiet_logged = True
                        log.warning("no word from the router for %.0fs: keeping this worker's instances (a "
                                    "router that restarted answers a heartbeat with Rehello)", ROUTER_QUIET_S)
                # The responses first: they are on the clients' latency path, the router's copy is not.
                self.replies.flush()
                self.out.flush()
        finally:
            unwake()
            self.systemd.stopping()
            self.close()

    def _take_posted(self) -> None:
        """Move what other threads posted into this turn's outboxes."""
        if self.results.empty():  # the usual turn: no exception raised to learn it
            return
        get = self.results.get_nowait
        while True:
            try:
                dest, payload = get()
            except queue.Empty:
                return
            if dest:
                self.replies.send(dest, payload)
            else:
                self.out.send(payload)

    def _on_message(self, msg: m.RouterToWorker) -> None:
        self._last_heard = time.monotonic()
        self._quiet_logged = False
        if not self._registered and not isinstance(msg, m.Rehello):
            # The router answers a hello at once: anything but Rehello means it knows us.
            self._registered = True
            self.systemd.ready("registered with the router")
        if isinstance(msg, m.ExecBatch):
            self._exec(msg)
        elif isinstance(msg, m.LoadModel):
            self._load(msg)
        elif isinstance(msg, m.CancelItem):
            entry = self.streams.get((msg.batch, msg.index))
            if entry is not None:
                entry[1].cancel()
        elif isinstance(msg, m.ForgetRegions):
            self.client_regions.forget(msg.ids)
        elif isinstance(msg, m.ForgetSequences):
            self._forget_sequences(msg)
        elif isinstance(msg, m.ReadyCheck):
            self._ready_check(msg)
        elif isinstance(msg, m.UnloadModel):
            self._unload((msg.model, msg.version, msg.instance))
        elif isinstance(msg, m.LeaveGranted):
            self._stopping = True
        elif isinstance(msg, m.SettingsUpdate):
            ProcessLog.apply_wire(msg.log)
        elif isinstance(msg, m.Rehello):
            if not self._stopping:  # after LeaveGranted the router rightly forgot us
                log.warning("the router does not know this worker (it restarted?): saying hello again")
            self._reset()

    def _poll_ms(self) -> int:
        """How long the loop may sleep: until the custom metrics are due when some changed."""
        if not pb_metrics.REGISTRY.dirty:
            return 250
        return max(0, min(250, int((self._next_metrics - time.monotonic()) * 1000) + 1))

    def _send_metrics(self, now: float, everything: bool = False) -> None:
        """The models' custom metrics that changed (all of them for a new router), at
        most every ``METRICS_FLUSH_S``: a model may update them on every request."""
        self._next_metrics = now + METRICS_FLUSH_S
        registry = pb_metrics.REGISTRY
        changed, removed = registry.take_changes()
        if everything:
            changed = registry.everything()
        metrics = [
            m.CustomMetric(s.family, s.description, int(s.kind), s.labels, s.value, s.buckets, s.counts)
            for s in changed
        ]
        metrics += [m.CustomMetric(family, "", 0, dict(labels), removed=True) for family, labels in removed]
        if metrics:
            self.out.send(m.encode(m.CustomMetrics(metrics)))

    def _reset(self) -> None:
        if self._leave_requested:
            self._stopping = True  # a router that does not know us has nothing of ours to finish
            return
        if self.bls is not None:
            self.bls.fail_all("the router restarted")
        # The router that knew these requests is gone: end them without a word.
        for _, stream in list(self.streams.values()):
            stream.close()
        for key in list(self.instances):
            self._unload(key)
        self.client_regions.clear()
        with self.writer.lock:  # the blocks the old router held (ensembles, cache) come back
            self.arena.drop_holds()
        self._last_heard = time.monotonic()
        self._registered = False
        self._hello()
        self._send_metrics(time.monotonic(), everything=True)  # the new router knows none of them

    # --- runs in instance threads -----------------------------------------------------

    def _post(self, payload: bytes) -> None:
        """Send ``payload`` to the router from any thread."""
        self.results.put(("", payload))
        self._wake()

    def _post_all(self, messages: list[tuple[str, bytes]]) -> None:
        """Send each (destination, payload) from any thread ("" = the router), with one wake-up."""
        put = self.results.put
        for message in messages:
            put(message)
        self._wake()

    def _emit_all(self, messages: list[tuple[str, bytes]]) -> None:
        """``_post_all`` from the main thread: straight into this turn's outboxes."""
        for dest, payload in messages:
            if dest:
                self.replies.send(dest, payload)
            else:
                self.out.send(payload)

    def _wake(self) -> None:
        # One write until the loop has woken: a decoupled model posts a response per token from its
        # own thread. The loop clears ``_woken`` after emptying the pipe and before taking what was
        # posted. (Deferring the write to the end of the poster's event-loop turn was tried: vLLM's
        # first token then waited for the rest, 41 ms against 11 ms at one client.)
        if self._woken:
            return
        self._woken = True
        try:
            os.write(self._wake_tx, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the main loop is woken already

    def _load(self, msg: m.LoadModel) -> None:
        key = (msg.model, msg.version, msg.instance)
        config = mc.ModelConfig.FromString(msg.config)
        device = self.devices.local(msg.device)  # the router names physical GPUs
        inst = LoadedInstance(key, None, config, IoPlan.from_config(config, {}))
        self.instances[key] = inst

        def load() -> None:
            error = ""
            try:
                model_dir = os.path.dirname(os.path.dirname(msg.path))
                inst.plan = IoPlan.from_config(config, load_labels(model_dir, config))
                if sequence_batched(config):
                    inst.sequences = SequenceSlots(config, model_dir)
                backend = load_backend(config.backend, msg.path, config, device, msg.instance, msg.name)
                inst.per_request = isinstance(backend, RequestBackend)
                inst.decoupled = inst.per_request and config.model_transaction_policy.decoupled
                shapes = BatchShapes.from_config(config)
                if shapes.active and not inst.per_request:  # a request backend sees each request as sent
                    inst.layout = BatchLayout(shapes)
                if config.model_warmup:
                    try:
                        warm_up(backend, config, model_dir, inst.per_request, inst.layout)
                    except BaseException:
                        backend.close()  # a failed warmup fails the instance, as in Triton
                        raise
                inst.inline_ok = inline_allowed(backend, config, device, msg.path)
                inst.backend = backend
            except ConveyorError as exc:
                error = exc.message
            except Exception as exc:
                log.exception("loading %s failed", key)
                error = f"{type(exc).__name__}: {exc}"
            log.debug("instance %s loaded%s", key, f": {error}" if error else "")
            user_ready = not error and bool(getattr(inst.backend, "has_readiness", False))  # Python models only
            self._post(m.encode(m.ModelLoaded(msg.model, msg.version, msg.instance, error, user_ready)))

        inst.submit(load)

    def _unload(self, key: tuple[str, str, int]) -> None:
        inst = self.instances.pop(key, None)
        if inst is None:
            return
        gone = ConveyorError(Status.UNAVAILABLE, f"model instance '{key[0]}' version {key[1]} was unloaded")
        for owner, stream in list(self.streams.values()):
            if owner == key:
                stream.fail(gone)

        def close() -> None:
            if inst.backend is not None:
                inst.backend.close()

        inst.submit(close)
        inst.executor.shutdown(wait=False)

    def _ready_check(self, msg: m.ReadyCheck) -> None:
        """The model's own readiness check (a Python model's ``is_ready()``), off this thread:
        ``ReadyChecked`` when it is done (joined to a check of the instance still running)."""
        inst = self.instances.get((msg.model, msg.version, msg.instance))
        backend = inst.backend if inst is not None else None
        readiness = getattr(backend, "readiness", None) if getattr(backend, "has_readiness", False) else None
        if readiness is None:
            self._post(m.encode(m.ReadyChecked(msg.check, False)))
            return

        def answer(done: concurrent.futures.Future[bool]) -> None:
            self._post(m.encode(m.ReadyChecked(msg.check, done.result())))

        readiness().add_done_callback(answer)

    def _forget_sequences(self, msg: m.ForgetSequences) -> None:
        inst = self.instances.get((msg.model, msg.version, msg.instance))
        if inst is not None and inst.sequences is not None:
            sequences, slots = inst.sequences, msg.slots
            inst.submit(lambda: sequences.forget(slots))  # after the batches already submitted

    def _exec(self, msg: m.ExecBatch) -> None:
        inst = self.instances.get((msg.model, msg.version, msg.instance))
        if inst is None or inst.backend is None:
            err = m.ErrorInfo(int(Status.UNAVAILABLE), f"model '{msg.model}' is not loaded on this worker")
            self._emit_all(answers(msg, m.BatchResult(msg.batch, [], error=err)))
            return
        if msg.regions:
            self.client_regions.announce(msg.regions)
        streams = [self._stream(inst, msg, i) for i in range(len(msg.items))] if inst.per_request else []
        if inst.runs_inline(msg):
            # Its answers leave with the rest of this turn's (one send per peer: each send wakes
            # libzmq's I/O thread, and a send per batch measured 25% less throughput at c=16).
            self._emit_all(answers(msg, self._run_batch(inst, msg, streams), inst.decoupled))
            _release(streams)
        else:
            def run() -> None:
                self._post_all(answers(msg, self._run_batch(inst, msg, streams), inst.decoupled))
                _release(streams)

            inst.submit(run)

    def _stream(self, inst: LoadedInstance, msg: m.ExecBatch, index: int) -> ItemStream:
        stream = ItemStream(msg, index, inst.plan, self.writer, self._post_all, self._forget_stream)
        if not inst.decoupled:
            stream.hold()  # an answer sent after execute must follow the batch's result (AnsweredLater)
        self.streams[stream.key] = (inst.key, stream)
        return stream

    def _forget_stream(self, stream: ItemStream) -> None:
        self.streams.pop(stream.key, None)

    def _run_batch(self, inst: LoadedInstance, msg: m.ExecBatch, streams: list[ItemStream]) -> m.BatchResult:
        """Run one batch; its ``BatchResult``."""
        backend = inst.backend
        assert backend is not None
        sequences = inst.sequences
        t0 = time.monotonic_ns()
        planned: Sequence[list[PlannedOutput] | ConveyorError]
        try:
            if inst.per_request:
                requests = gather_requests(msg.items, self.views, inst.plan)
                for request, stream in zip(requests, streams, strict=True):
                    request.channel = stream
                if sequences is not None:
                    sequences.add_request_inputs(requests, msg.items)
                t1 = time.monotonic_ns()
                outcomes = cast(RequestBackend, backend).execute_requests(requests)
                t2 = time.monotonic_ns()
                if sequences is not None:
                    sequences.keep_request_states(msg.items, outcomes)
                # Decoupled: the requests were answered (or will be) through their streams.
                planned = [] if inst.decoupled else plan_request_outputs(msg.items, outcomes, inst.plan)
            else:
                inputs, rows = gather_inputs(msg.items, self.views, inst.plan, inst.layout)
                if msg.regions and not getattr(backend, "accepts_device_arrays", False):
                    inputs = host_inputs(inputs)
                wanted = inst.plan.wanted(msg.items)
                if sequences is not None:
                    sequences.add_batch_inputs(inputs, msg.items)
                    wanted = sequences.wanted(wanted)
                t1 = time.monotonic_ns()
                outputs = cast(Backend, backend).execute(inputs, wanted)
                t2 = time.monotonic_ns()
                if sequences is not None:
                    sequences.keep_batch_states(msg.items, outputs)
                planned = plan_batch_outputs(msg.items, rows, outputs, inst.plan, inst.layout)
            results = self.writer.write(planned) if planned else []
            if inst.per_request and results:
                attach_parameters(results, outcomes)
                mark_answered_later(results, outcomes)
            t3 = time.monotonic_ns()
            reply = m.BatchResult(msg.batch, results, t1 - t0, t2 - t1, t3 - t2)
            if any(item.traced for item in msg.items):  # wall-clock stamps, comparable across processes
                wall = time.time_ns() - time.monotonic_ns()
                reply.trace_ns = [t0 + wall, t1 + wall, t2 + wall, t3 + wall]
        except ConveyorError as exc:
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(exc.status), exc.message))
        except Exception as exc:
            log.exception("batch %d of '%s' failed", msg.batch, msg.model)
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(Status.INTERNAL), f"{exc}"))
        for i, stream in enumerate(streams):
            # A decoupled request stays open past execute, unless the batch failed
            # (the router ends its open requests with the batch's error); so does a
            # request its model answers later (AnsweredLater).
            if reply.error is not None or not (inst.decoupled or reply.items[i].pending):
                stream.close()
        took = time.monotonic_ns() - t0
        inst.exec_ns = took if not inst.batches else inst.exec_ns + EXEC_ALPHA * (took - inst.exec_ns)
        inst.batches += 1
        return reply

    def close(self) -> None:
        for key in list(self.instances):
            self._unload(key)
        self.replies.close()
        self.sock.close(0)
        if self.bls is not None:
            pb_bls.set_executor(None)
            self.bls.close()
        os.close(self._wake_rx)
        os.close(self._wake_tx)
        self.arena.close()


def answers(msg: m.ExecBatch, result: m.BatchResult, decoupled: bool = False) -> list[tuple[str, bytes]]:
    """What a batch's outcome sends: the ``InferResponse`` of each request the router marked
    ``reply_to``, straight to its ingress, then the ``BatchResult`` to the router, which only
    counts those requests (their outputs and release flags went with the response).

    A decoupled model's requests were answered by their streams; if its batch failed as a
    whole, the router ends them (it knows which are still open)."""
    if decoupled:
        return [("", m.encode(result))]
    out: list[tuple[str, bytes]] = []
    items = result.items
    for i, item in enumerate(msg.items):
        if not item.reply_to:
            continue
        if i < len(items):
            r = items[i]
            if r.pending:
                continue  # its stream answers it when the model does
            resp = m.InferResponse(item.id, msg.model, msg.version, r.outputs, r.error, r.release, True,
                                   r.parameters, msg.generation)
            items[i] = m.ItemResult(r.id, error=r.error)
        else:  # the batch failed as a whole
            error = result.error or m.ErrorInfo(int(Status.INTERNAL), "the batch returned no result for this request")
            resp = m.InferResponse(item.id, msg.model, msg.version, error=error, generation=msg.generation)
        out.append((item.reply_to, m.encode(resp)))
    out.append(("", m.encode(result)))
    return out


def _release(streams: list[ItemStream]) -> None:
    for stream in streams:
        if stream.holding:
            stream.release()


def mark_answered_later(results: list[m.ItemResult], outcomes: list[RequestOutcome]) -> None:
    """The requests whose model answers them after execute (``AnsweredLater``): nothing was
    written for them, and the router keeps them open until their stream's response."""
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, AnsweredLater):
            results[i] = m.ItemResult(results[i].id, pending=True)


def _input_bytes(msg: m.ExecBatch) -> int:
    return sum(ref.nbytes for item in msg.items for ref in item.inputs)
