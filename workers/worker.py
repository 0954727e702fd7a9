"""The worker actor: runs model instances for the router.

One DEALER socket to the router (``router_session.py``), one thread per loaded
instance (``instances.py``: a long batch never stops heartbeats or other
instances), batches run by ``batch_runner.py``, and results handed back to the
socket-owning main thread through ``mailbox.py``'s queue and wake pipe. A second
DEALER (``BlsLink``) carries the BLS requests models make, as an ingress would.
This module wires them and runs the loop.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import time
from typing import Any

import zmq

from conveyor.deploy.runtime.log_settings import ProcessLog
from conveyor.deploy.runtime.polling import Poller, spin_seconds
from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.exit_codes import ENGINE_DIED_CODE
from conveyor.proto.framing import drain
from conveyor.shm.arena import Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache
from conveyor.workers.backends.python.bls import BlsClient
from conveyor.workers.backends.python.pb_utils import bls as pb_bls
from conveyor.workers.backends.python.pb_utils import metrics as pb_metrics
from conveyor.workers.batch_io import OutputWriter, TensorViews
from conveyor.workers.batch_runner import BatchRunner
from conveyor.workers.bls_link import BlsLink
from conveyor.workers.client_regions import ClientRegionMaps
from conveyor.workers.config import DEFAULT_ARENA_BYTES, WorkerConfig
from conveyor.workers.devices import DeviceMap, gpu_backends, local_gpu_count
from conveyor.workers.instances import (
    InstanceKey,
    LoadedInstance,
    begin_load,
    check_readiness,
    close_instance,
    forget_sequences,
    update_adapter,
)
from conveyor.workers.mailbox import Mailbox
from conveyor.workers.reply_links import ReplyLinks
from conveyor.workers.router_session import RouterSession
from conveyor.workers.stopping import FINALIZE_WAIT_S, UNLOAD_NOW_SIGNAL, set_fatal_exit

__all__ = ["DEFAULT_ARENA_BYTES", "LoadedInstance", "Worker", "WorkerConfig"]

log = logging.getLogger(__name__)


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        """``config``: everything the worker reads (workers/config.py); ``deploy/compose.py`` builds it from
        ``conveyor worker``'s flags."""
        self.config = config
        self.spin_s = spin_seconds() if config.spin_s is None else config.spin_s
        gpus = local_gpu_count()
        self.devices = DeviceMap(gpus, os.environ)
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.systemd = Notifier()
        self.router = RouterSession(self.ctx, config, self.devices, gpu_backends(gpus), self.systemd)
        self.mailbox = Mailbox()
        self.replies = ReplyLinks(self.ctx)
        self.arena = Arena(segment_name(config.group, "worker"), config.arena_bytes)
        self.regions = RegionCache()
        self.client_regions = ClientRegionMaps()
        self.views = TensorViews(self.regions, self.client_regions)
        self.writer = OutputWriter(self.arena, self.views)
        self.bls: BlsLink | None = None
        if config.bls_endpoint:
            self.bls = BlsLink(self.ctx, config.bls_endpoint, self.arena, self.writer.lock, self.mailbox.wake)
            pb_bls.set_executor(BlsClient(self.bls, self.regions))
        pb_metrics.REGISTRY.on_dirty = self.mailbox.wake  # a model's metric change leaves within METRICS_FLUSH_S
        self.instances: dict[InstanceKey, LoadedInstance] = {}
        self.batches = BatchRunner(self.views, self.writer, self.client_regions, self.mailbox.post_all,
                                   self._emit_all)
        self._stopping = False
        self._heard = False  # this loop turn took a message from the router
        self._leave_requested = False
        self._closing: list[concurrent.futures.Future[None]] = []  # models unloaded, maybe still closing
        self.exit_code = 0  # ENGINE_DIED_CODE after ``fail``

    def stop(self, *_: Any) -> None:
        """SIGTERM/SIGINT: leave gracefully (drain); a second signal stops at once."""
        if self._leave_requested:
            self._stopping = True
        self._leave_requested = True

    def unload_now(self, *_: Any) -> None:
        """``UNLOAD_NOW_SIGNAL``: the group's exit timeout ran out; unload the models with
        their requests still open (workers/stopping.py says why)."""
        log.warning("exit timeout expired: unloading the models with requests still in flight")
        self._leave_requested = self._stopping = True

    def fail(self, why: str) -> None:
        """From any thread: an engine this worker hosts died (``workers/stopping.py``'s ``fatal_exit``). The
        worker stops at once, without a word to the router: the router sees its process gone, answers what it
        ran (``worker_lost``) and places its instances again, here once restarted, or on another worker."""
        if self.exit_code:
            return
        log.error("this worker exits (code %d) so that it restarts and loads its models again: %s",
                  ENGINE_DIED_CODE, why)
        self.exit_code = ENGINE_DIED_CODE
        self._stopping = True
        self.mailbox.wake()

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(UNLOAD_NOW_SIGNAL, self.unload_now)
        set_fatal_exit(self.fail)
        # A signal wakes the loop through the wake pipe (deploy/runtime/wake_pipe.py says why).
        unwake = self.mailbox.pipe.on_signals()
        router = self.router
        router.hello()
        router.out.flush()
        sources: list[Any] = [router.sock, self.mailbox.pipe.fd]
        if self.bls is not None:
            sources.append(self.bls.sock)
        poller = Poller(sources, self.spin_s)
        more = False  # a drain stopped at its cap: poll without waiting
        # What every turn uses, looked up once (the loop turns once or twice per request).
        beat, mailbox, replies, bls, out = self.systemd.beat, self.mailbox, self.replies, self.bls, router.out
        watchdog = self.systemd.interval is not None  # no watchdog (the usual case): no beat call per turn
        posted = mailbox.results.empty  # asked here first: ``take`` is a call per turn for the rare turn with posts
        wake_rx, router_sock, decode, on_message = mailbox.pipe.fd, router.sock, m.worker_inbox_decoder.decode, \
            self._on_message
        # The sockets known to hold no message behind a quiet descriptor (``Poller.poll``'s ``quiet``, as in the
        # router's loop): the poll found them empty or their drain ended on a question that did, and nothing
        # was sent on them since (a send may take in the commands that announced a message).
        quiet: list[Any] = []
        try:
            while not self._stopping:
                if watchdog:
                    beat()
                ready = poller.poll(0 if more else router.poll_ms(), quiet)
                more = False
                quiet.clear()
                if wake_rx in ready:
                    mailbox.woken()
                if not posted():
                    mailbox.take(out, replies)
                if bls is not None:
                    sent = bls.flush()
                    if bls.sock in ready:
                        capped = bls.drain()
                        more |= capped
                        if not capped:
                            quiet.append(bls.sock)
                    elif not sent:
                        quiet.append(bls.sock)
                router_quiet = True
                if router_sock in ready:
                    capped = drain(router_sock, decode, on_message, "the router")
                    more |= capped
                    router_quiet = not capped
                now = time.monotonic()
                if self._heard:
                    self._heard = False
                    router.heard_at(now)
                router.metrics_due(now)
                if self._leave_requested and router.leave(now):
                    self._stopping = True
                router.heartbeat(now)
                # The responses first: they are on the clients' latency path, the router's copy is not.
                replies.flush()
                if not out.flush() and router_quiet:
                    quiet.append(router_sock)
        finally:
            set_fatal_exit(None)
            unwake()
            self.systemd.stopping()
            self.close()

    def _on_message(self, msg: m.RouterToWorker) -> None:
        self._heard = True
        if not self.router.registered:
            self.router.heard(msg)
        if isinstance(msg, m.ExecBatch):
            self.batches.run(self.instances.get((msg.model, msg.version, msg.instance)), msg)
        elif isinstance(msg, m.LoadModel):
            inst = begin_load(msg, self.devices, self.mailbox.post)
            self.instances[inst.key] = inst
        elif isinstance(msg, m.CancelItem):
            self.batches.cancel(msg.batch, msg.index)
        elif isinstance(msg, m.ForgetRegions):
            self.client_regions.forget(msg.ids)
        elif isinstance(msg, m.ForgetSequences):
            forget_sequences(self.instances.get((msg.model, msg.version, msg.instance)), msg)
        elif isinstance(msg, m.ReadyCheck):
            check_readiness(self.instances.get((msg.model, msg.version, msg.instance)), msg, self.mailbox.post)
        elif isinstance(msg, m.LoraUpdate):
            update_adapter(self.instances.get((msg.model, msg.version, msg.instance)), msg, self.mailbox.post)
        elif isinstance(msg, m.UnloadModel):
            self._unload((msg.model, msg.version, msg.instance), confirm=True)
        elif isinstance(msg, m.LeaveGranted):
            self._stopping = True
        elif isinstance(msg, m.SettingsUpdate):
            ProcessLog.apply_wire(msg.log)
        elif isinstance(msg, m.Rehello):
            if not self._stopping:  # after LeaveGranted the router rightly forgot us
                log.warning("the router does not know this worker (it restarted?): saying hello again")
            self._reset()

    def _reset(self) -> None:
        if self._leave_requested:
            self._stopping = True  # a router that does not know us has nothing of ours to finish
            return
        if self.bls is not None:
            self.bls.fail_all("the router restarted")
        # The router that knew these requests is gone: end them without a word.
        self.batches.close_streams()
        for key in list(self.instances):
            self._unload(key)
        self.client_regions.clear()
        with self.writer.lock:  # the blocks the old router held (ensembles, cache) come back
            self.arena.drop_holds()
        self.router.rehello()

    def _emit_all(self, messages: list[tuple[str, bytes]]) -> None:
        """``Mailbox.post_all`` from the main thread: straight into this turn's outboxes."""
        for dest, payload in messages:
            if dest:
                self.replies.send(dest, payload)
            else:
                self.router.out.send(payload)

    def _unload(self, key: InstanceKey, confirm: bool = False) -> None:
        """``confirm``: the router asked; it is told once the model is closed (``InstanceClosed``)."""
        inst = self.instances.pop(key, None)
        if inst is None:
            if confirm:
                self.mailbox.post(m.encode(m.InstanceClosed(*key)))
            return
        self.batches.fail_streams(
            key, ConveyorError(Status.UNAVAILABLE, f"model instance '{key[0]}' version {key[1]} was unloaded"))
        self._closing = [f for f in self._closing if not f.done()]
        closed = close_instance(inst)
        if confirm:
            post, said = self.mailbox.post, m.encode(m.InstanceClosed(*key))
            closed.add_done_callback(lambda _: post(said))
        self._closing.append(closed)

    def close(self) -> None:
        if self.exit_code:
            # Dying (``fail``): what runs here is the router's to answer, as a dead worker's (``worker_lost``), once it
            # sends this worker nothing more; answered here, a request moved to another engine could come back here.
            self.batches.close_streams()
        for key in list(self.instances):
            self._unload(key)
        # The models' finalize before the process leaves (it does not wait for their threads).
        _, late = concurrent.futures.wait(self._closing, timeout=FINALIZE_WAIT_S)
        if late:
            log.warning("%d model instance(s) still closing after %.0fs: leaving without them",
                        len(late), FINALIZE_WAIT_S)
        self.replies.close()
        self.router.sock.close(0)
        if self.bls is not None:
            pb_bls.set_executor(None)
            self.bls.close()
        self.mailbox.close()
        self.arena.close()
