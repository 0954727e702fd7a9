"""The worker actor: runs model instances for the router.

One DEALER socket to the router, one thread per loaded instance (so a long
batch never stops heartbeats or other instances), results handed back to the
socket-owning main thread through an inproc pipe.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import zmq

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends import load_backend
from conveyor.workers.backends.base import Backend, RequestBackend
from conveyor.workers.batch_io import (
    OutputWriter,
    PlannedOutput,
    TensorViews,
    gather_inputs,
    gather_requests,
    host_inputs,
    plan_batch_outputs,
    plan_request_outputs,
)
from conveyor.workers.classification import load_labels
from conveyor.workers.client_regions import ClientRegionMaps
from conveyor.workers.sequence_state import SequenceSlots

log = logging.getLogger(__name__)

DEFAULT_ARENA_BYTES = 256 << 20
# No word from the router for this long: say hello again (it may have restarted).
ROUTER_SILENCE_S = 5.0


@dataclass(eq=False)
class LoadedInstance:
    key: tuple[str, str, int]
    backend: Backend | RequestBackend | None
    config: mc.ModelConfig
    labels: dict[str, list[str]]
    # Decided once at load: a runtime Protocol check costs tens of microseconds per batch.
    per_request: bool = False
    sequences: SequenceSlots | None = None  # control inputs and implicit state (sequence_batching)
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(max_workers=1))


def detect_devices() -> list[str]:
    """CUDA devices this worker could use (none without cupy or a GPU)."""
    try:
        import cupy

        return [f"cuda:{i}" for i in range(cupy.cuda.runtime.getDeviceCount())]
    except Exception:
        return []


class Worker:
    def __init__(self, router_endpoint: str, group: str, arena_bytes: int = DEFAULT_ARENA_BYTES) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(router_endpoint)
        self._wake_addr = f"inproc://worker-wake-{id(self)}"
        self._wake_rx = self.ctx.socket(zmq.PULL)
        self._wake_rx.bind(self._wake_addr)
        self._wake_local = threading.local()
        self.results: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.arena = Arena(segment_name(group, "worker"), arena_bytes)
        self.regions = RegionCache()
        self.client_regions = ClientRegionMaps()
        self.views = TensorViews(self.regions, self.client_regions)
        self.writer = OutputWriter(self.arena, self.views)
        self.instances: dict[tuple[str, str, int], LoadedInstance] = {}
        self._stopping = False
        self._last_heard = time.monotonic()

    def stop(self, *_: Any) -> None:
        self._stopping = True

    def _hello(self) -> None:
        self.sock.send(m.encode(m.WorkerHello(m.PROTOCOL_VERSION, os.getpid(), socket.gethostname(),
                                              detect_devices())))

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        self._hello()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_rx, zmq.POLLIN)
        next_beat = time.monotonic()
        try:
            while not self._stopping:
                events = dict(poller.poll(250))
                if self._wake_rx in events:
                    while True:
                        try:
                            self._wake_rx.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                while True:
                    try:
                        self.sock.send(self.results.get_nowait(), copy=False)
                    except queue.Empty:
                        break
                if self.sock in events:
                    self._drain()
                now = time.monotonic()
                if now >= next_beat:
                    self.sock.send(m.encode(m.Heartbeat()))
                    next_beat = now + 1.0
                    if now - self._last_heard > ROUTER_SILENCE_S:
                        log.warning("no word from the router for %.0fs: saying hello again", ROUTER_SILENCE_S)
                        self._reset()
        finally:
            self.close()

    def _drain(self) -> None:
        decode = m.worker_inbox_decoder.decode
        for _ in range(256):
            try:
                frame = self.sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._last_heard = time.monotonic()
            try:
                msg = decode(frame.buffer)
            except msgspec.DecodeError as exc:
                log.error("undecodable message from the router: %s", exc)
                continue
            if isinstance(msg, m.ExecBatch):
                self._exec(msg)
            elif isinstance(msg, m.LoadModel):
                self._load(msg)
            elif isinstance(msg, m.ForgetRegions):
                self.client_regions.forget(msg.ids)
            elif isinstance(msg, m.ForgetSequences):
                self._forget_sequences(msg)
            elif isinstance(msg, m.UnloadModel):
                self._unload((msg.model, msg.version, msg.instance))
            elif isinstance(msg, m.Rehello):
                log.warning("the router does not know this worker (it restarted?): saying hello again")
                self._reset()

    def _reset(self) -> None:
        for key in list(self.instances):
            self._unload(key)
        self.client_regions.clear()
        self._last_heard = time.monotonic()
        self._hello()

    # --- runs in instance threads -----------------------------------------------------

    def _post(self, payload: bytes) -> None:
        self.results.put(payload)
        wake = getattr(self._wake_local, "sock", None)
        if wake is None:
            wake = self._wake_local.sock = self.ctx.socket(zmq.PUSH)
            wake.setsockopt(zmq.LINGER, 0)
            wake.connect(self._wake_addr)
        wake.send(b"")

    def _load(self, msg: m.LoadModel) -> None:
        key = (msg.model, msg.version, msg.instance)
        config = mc.ModelConfig.FromString(msg.config)
        inst = LoadedInstance(key, None, config, {})
        self.instances[key] = inst

        def load() -> None:
            error = ""
            try:
                inst.labels = load_labels(os.path.dirname(os.path.dirname(msg.path)), config)
                if config.HasField("sequence_batching"):
                    inst.sequences = SequenceSlots(config, os.path.dirname(os.path.dirname(msg.path)))
                backend = load_backend(config.backend, msg.path, config, msg.device, msg.instance)
                inst.per_request = isinstance(backend, RequestBackend)
                inst.backend = backend
            except ConveyorError as exc:
                error = exc.message
            except Exception as exc:
                log.exception("loading %s failed", key)
                error = f"{type(exc).__name__}: {exc}"
            self._post(m.encode(m.ModelLoaded(msg.model, msg.version, msg.instance, error)))

        inst.executor.submit(load)

    def _unload(self, key: tuple[str, str, int]) -> None:
        inst = self.instances.pop(key, None)
        if inst is None:
            return

        def close() -> None:
            if inst.backend is not None:
                inst.backend.close()

        inst.executor.submit(close)
        inst.executor.shutdown(wait=False)

    def _forget_sequences(self, msg: m.ForgetSequences) -> None:
        inst = self.instances.get((msg.model, msg.version, msg.instance))
        if inst is not None and inst.sequences is not None:
            inst.executor.submit(inst.sequences.forget, msg.slots)  # after the batches already submitted

    def _exec(self, msg: m.ExecBatch) -> None:
        inst = self.instances.get((msg.model, msg.version, msg.instance))
        if inst is None or inst.backend is None:
            err = m.ErrorInfo(int(Status.UNAVAILABLE), f"model '{msg.model}' is not loaded on this worker")
            self.sock.send(m.encode(m.BatchResult(msg.batch, [], error=err)))
            return
        if msg.regions:
            self.client_regions.announce(msg.regions)
        inst.executor.submit(self._run_batch, inst, msg)

    def _run_batch(self, inst: LoadedInstance, msg: m.ExecBatch) -> None:
        backend = inst.backend
        assert backend is not None
        sequences = inst.sequences
        t0 = time.monotonic_ns()
        planned: Sequence[list[PlannedOutput] | ConveyorError]
        try:
            if inst.per_request:
                requests = gather_requests(msg.items, self.views, inst.config)
                if sequences is not None:
                    sequences.add_request_inputs(requests, msg.items)
                t1 = time.monotonic_ns()
                outcomes = cast(RequestBackend, backend).execute_requests(requests)
                t2 = time.monotonic_ns()
                if sequences is not None:
                    sequences.keep_request_states(msg.items, outcomes)
                planned = plan_request_outputs(msg.items, outcomes, inst.config, inst.labels)
            else:
                inputs, rows = gather_inputs(msg.items, self.views, inst.config)
                if msg.regions and not getattr(backend, "accepts_device_arrays", False):
                    inputs = host_inputs(inputs)
                wanted = sorted({o.name for item in msg.items for o in item.outputs})
                if sequences is not None:
                    sequences.add_batch_inputs(inputs, msg.items)
                    wanted = sequences.wanted(wanted)
                t1 = time.monotonic_ns()
                outputs = cast(Backend, backend).execute(inputs, wanted)
                t2 = time.monotonic_ns()
                if sequences is not None:
                    sequences.keep_batch_states(msg.items, outputs)
                planned = plan_batch_outputs(msg.items, rows, outputs, inst.config, inst.labels)
            results = self.writer.write(planned)
            t3 = time.monotonic_ns()
            reply = m.BatchResult(msg.batch, results, t1 - t0, t2 - t1, t3 - t2)
        except ConveyorError as exc:
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(exc.status), exc.message))
        except Exception as exc:
            log.exception("batch %d of '%s' failed", msg.batch, msg.model)
            reply = m.BatchResult(msg.batch, [], error=m.ErrorInfo(int(Status.INTERNAL), f"{exc}"))
        self._post(m.encode(reply))

    def close(self) -> None:
        for key in list(self.instances):
            self._unload(key)
        self.sock.close(0)
        self._wake_rx.close(0)
        self.arena.close()
