"""The router actor: one process, two ROUTER sockets, one plain poll loop.

It owns model state, queues and batching, and moves descriptors only: tensor
bytes stay in shared memory, between the ingress arena and the worker arena.

This module is the loop and the wiring: sockets, poll, a message to its handler,
the periodic tick. The handlers live in their own modules:

- ``admission.py``: an ``InferRequest`` refused, answered from the cache, run as
  an ensemble or queued; ``Cancel``;
- ``dispatch.py``: queued requests become batches on free instances; timers;
- ``results.py``: ``BatchResult``/``ItemResponse`` become ``InferResponse``s;
- ``worker_pool/membership.py``: workers joining, loading, leaving, dropped;
- ``worker_pool/placement.py``: instances placed on workers, the lifecycle settled, load/unload calls;
- ``repository/agent.py``: the repository's slow work (disks, networks, child processes, model
  files) on threads of its own, and the opening of files clients name as shared-memory keys; the
  loop polls its descriptor and applies what comes back (``lifecycle.py``), so nothing here ever
  waits for it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import Any

import zmq

from conveyor.deploy.runtime.drain import DrainClock, Phase
from conveyor.deploy.runtime.group_paths import run_dir
from conveyor.deploy.runtime.polling import Poller, spin_seconds
from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.deploy.runtime.wake_pipe import WakePipe
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, triton_line, triton_status_text
from conveyor.proto.exit_codes import CREATE_FAILED_CODE
from conveyor.proto.framing import PeerOutbox, drain_peers
from conveyor.proto.triton_cli import (
    CORE_STOP_SIGNAL,
    STOP_DEADLINE_FILE,
    is_triton_cli,
    keeps_running_when_unusable,
)
from conveyor.router.admission import Admission
from conveyor.router.config import RouterConfig
from conveyor.router.context import RouterContext
from conveyor.router.control import ControlHandler
from conveyor.router.control_ops import router_ops
from conveyor.router.control_table import Caller
from conveyor.router.dispatch import Dispatcher
from conveyor.router.ensembles.self_link import SelfLink
from conveyor.router.ledger import Ledger
from conveyor.router.lifecycle import ControlMode, ModelLifecycle
from conveyor.router.observability.otlp_export import otlp_sink
from conveyor.router.observability.tracing import Tracer
from conveyor.router.pool import HEARTBEAT_INTERVAL_S, WorkerPool
from conveyor.router.registry import ModelRegistry
from conveyor.router.replies import Replies, count_refused
from conveyor.router.repository.agent import Lane, RepositoryAgent
from conveyor.router.repository.cloud import RepositoryRoots
from conveyor.router.response_cache import ResponseCache
from conveyor.router.results import Results
from conveyor.router.runtime_lora import RuntimeLora
from conveyor.router.scheduling.rate_limiter import RateLimiter
from conveyor.router.scheduling.sequences import SequenceBatcher
from conveyor.router.settings_hub import SettingsHub
from conveyor.router.shared_memory.client_regions import ClientShmRegistry, look_all
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.router.shared_memory.loans import Loans
from conveyor.router.user_readiness import UserReadiness
from conveyor.router.worker_pool.membership import WorkerMembership
from conveyor.router.worker_pool.placement import Placement
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache

log = logging.getLogger(__name__)

# How often registered client segments are checked for having gone away.
SHM_SWEEP_INTERVAL_S = 5.0
# How soon the loop thread gets the GIL back from a repository agent thread running Python
# (a config parsed, a cloud store's client at work) when it wants it: Python's default is 5 ms,
# a wait the loop would pay on every wake-up while such a job runs (1 ms: a few times less).
SWITCH_INTERVAL_S = 0.001
# A tick this late means the loop itself was held up (nothing should do that, but a pause of the
# whole process can): the workers' silence is measured without that time.
LATE_TICK_S = 3 * HEARTBEAT_INTERVAL_S


class Router:
    def __init__(self, config: RouterConfig) -> None:
        """``config``: everything the router reads (router/config.py), handed on as slices: each collaborator
        built here takes the part it reads. ``deploy/compose.py`` builds it from ``conveyor router``'s flags."""
        self.config = config
        models = config.models
        self.spin_s = spin_seconds() if config.spin_s is None else config.spin_s
        self.zmq: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self.front_sock = self.zmq.socket(zmq.ROUTER)
        self.back_sock = self.zmq.socket(zmq.ROUTER)
        for sock, endpoint in ((self.front_sock, config.ingress_endpoint), (self.back_sock, config.worker_endpoint)):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted peer takes its identity back
            # A ROUTER socket silently drops what exceeds its high-water mark: a reply must
            # never be lost, and the ingress in-flight limit already bounds what can queue.
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.bind(endpoint)
        # Everything a loop turn sends leaves at the end of the turn, one message per peer.
        self.front = PeerOutbox(self.front_sock)
        self.back = PeerOutbox(self.back_sock)
        self.registry = ModelRegistry(config.scheduling.queue_cap, config.scheduling.sequence_slot_padding)
        self.pool = WorkerPool()
        # SIGTERM: not ready, then refuse new requests, then exit once in-flight ones are done.
        self.shutdown = DrainClock()
        self.control = ControlHandler(self.registry, self.pool, self.shutdown)
        self.control.strict_readiness = models.strict_readiness
        self.roots = RepositoryRoots(list(config.repositories))  # s3://, gs://, as:// roots become local mirrors
        # Disks, networks, child processes and model files: on the agent's threads, never in this loop.
        self.agent = RepositoryAgent(models.load_threads)
        self.lifecycle = ModelLifecycle(self.registry, self.roots.local, models, self.agent,
                                        self.roots.sync if self.roots.remote else None, self.roots.check)
        self.control.starting = self._starting
        self._announced_ready = False  # systemd's READY, once start-up's loads settled
        self._startup_pending = models.exit_on_error  # --exit-on-error: checked until every load settled
        self._startup_failed = False  # --exit-on-error found a start-up load failed: exiting, never ready
        self._keep_running = keeps_running_when_unusable(models.exit_on_error)  # a root it cannot use
        self._poll_secs = models.poll_secs
        self._next_poll = time.monotonic() + models.poll_secs
        self._last_tick = time.monotonic()
        self.shm = ClientShmRegistry(config.client_shm)
        self._next_shm_sweep = 0.0
        self._shm_sweeping = False  # a periodic check of the registered segments is on the agent's thread
        # Log and trace settings (observability extensions): kept here, pushed to every process.
        self._ingress_peers: dict[bytes, int] = {}  # identity -> pid
        self._announced_generation = self.registry.generation  # the last RepositoryChanged sent
        self.settings = SettingsHub(config.trace, self._broadcast_settings)
        self._stopping = False
        self._report_in_flight = False  # CORE_STOP_SIGNAL arrived: log Triton's in-flight lines
        self._in_flight_at_stop: list[tuple[str, int, int]] = []
        self.exit_code = 0
        self.systemd = Notifier()
        self.group = group = config.group
        regions = RegionCache()  # other processes' arenas: flags to write, condition tensors to read
        holds = HeldBlocks(regions)  # blocks the router keeps alive (ensembles, cache), lent with loans
        scheduling = config.scheduling
        self.ctx = ctx = RouterContext(
            front=self.front, back=self.back, registry=self.registry, pool=self.pool, ledger=Ledger(),
            replies=Replies(self.front, self.registry), tracer=Tracer(self.settings.trace, otlp_sink(config.trace)),
            holds=holds, loans=Loans(segment_name(group, "router"), holds),
            limiter=RateLimiter(list(scheduling.rate_limit_resources)) if scheduling.rate_limit else None,
            cache=ResponseCache(scheduling.cache_bytes, holds) if scheduling.cache_bytes > 0 else None,
        )
        self.replies, self.tracer, self.holds, self.loans = ctx.replies, ctx.tracer, ctx.holds, ctx.loans
        self.control.trace_export = self.tracer.export_stats
        self.control.response_cache = ctx.cache is not None
        self.dispatcher = Dispatcher(ctx)
        # Ensembles: steps are the router's own requests, re-entering admission on its own link.
        self.self_link = SelfLink(self.zmq, self.front_sock)
        self.admission = Admission(ctx, self.dispatcher, self.shm, self.self_link.identity, regions,
                                   self._ingress_peers)
        self.ensembles = self.admission.ensembles
        self.placement = Placement(ctx, self.lifecycle)
        self.results = Results(ctx, self.dispatcher, self.placement.settle)
        self.membership = WorkerMembership(ctx, self.dispatcher, self.results, self.placement, self.settings,
                                           self.shm, self.control.custom_metrics, group, models.load_retries)
        self.worker_drain = self.membership.drain
        self.user_readiness = UserReadiness(self.registry, self.control, self.front, self.back)
        self.runtime_lora = RuntimeLora(self.registry, self.front, self.back)
        self.membership.on_ready = self.runtime_lora.on_ready
        self.membership.on_lost = self.runtime_lora.worker_lost
        self.control_ops = router_ops(self)
        # Per-message handlers, bound once: the hot path pays no lookups through the collaborators.
        self._on_infer = self.admission.on_infer
        self._on_cancel = self.admission.cancel
        self._on_result = self.results.on_result
        self._on_item_response = self.results.on_item_response

    # --- lifecycle ---------------------------------------------------------------------

    def load_repository(self) -> None:
        """Start-up's loads, waited for: before the loop runs (tests; ``run`` does not wait)."""
        self.lifecycle.startup()

    def stop(self, *_: Any) -> None:
        self._stopping = True

    def _core_stop(self, *_: Any) -> None:
        self.worker_drain.group_stopping = True  # set here: before any worker of the stop says it leaves
        if is_triton_cli():
            # Counted here, before any worker of the stop leaves (a leaving worker's messages may come in the
            # loop's turn before it logs); logged by the loop (``_log_in_flight``), not in the handler.
            self._in_flight_at_stop = self._in_flight()
            self._report_in_flight = True

    def _in_flight(self) -> list[tuple[str, int, int]]:
        """(model, version, count) of the versions with inferences in flight: requests queued or running, and
        a sequence model's sequences still open."""
        counts = self.ctx.ledger.in_flight()
        for state in self.registry.versions():
            if isinstance(state.batcher, SequenceBatcher) and state.batcher.open:
                counts[state] = counts.get(state, 0) + len(state.batcher.open)
        return sorted(((s.model, s.version, n) for s, n in counts.items() if n), key=lambda row: row[:2])

    def _log_in_flight(self) -> None:
        """Triton's core-stop lines (InferenceServer::Stop), from the count taken as the stop began."""
        busy = self._in_flight_at_stop
        timeout = int(self.config.stop.exit_timeout_s)
        try:  # what is left of the exit timeout: the supervisor's deadline (Triton counts down from there)
            with open(os.path.join(run_dir(self.group), STOP_DEADLINE_FILE)) as f:
                timeout = max(0, int(float(f.read()) - time.monotonic()))
        except (OSError, ValueError):
            pass
        log.info("Timeout %d: Found %d model versions that have in-flight inferences", timeout, len(busy))
        for model, version, n in busy:
            log.info("Model '%s' (version %d) has %d in-flight inferences", model, version, n)

    def _starting(self) -> bool:
        """Not ready for start-up's sake: its loads are not all in, or with --exit-on-error one failed and the
        router exits at its next tick (as Triton's server, which is never ready when its creation fails; a
        client polling readiness must not see it ready in between)."""
        if self.lifecycle.starting or self._startup_failed:
            return True
        return self._startup_pending and bool(self.lifecycle.startup_outcome())

    def _check_startup(self) -> None:
        """--exit-on-error: once every start-up load settled, stop if one failed (as Triton's
        'failed to load all models'); the exit code tells the supervisor not to restart us."""
        outcome = self.lifecycle.startup_outcome()
        if outcome is None:
            return
        self._startup_pending = False
        if outcome:
            self._startup_failed = True
            log.error("error: creating server: Internal - failed to load all models (%s); "
                      "exiting (--exit-on-error=true)", outcome)
            self.exit_code = CREATE_FAILED_CODE
            self.stop()

    def _cannot_create(self, err: ConveyorError) -> None:
        """A repository root the server cannot start with: Triton's line on stderr (as its ``tritonserver``
        prints it) and an exit the supervisor does not restart. ``tritonserver --exit-on-error=false``:
        Triton's SERVER_FAILED_TO_INITIALIZE instead, once: its error logged, the server neither live nor
        ready, every model call answered UNAVAILABLE "Server not ready" (``control.failed``), no model loaded."""
        if self._keep_running:
            if not self.control.failed:
                self.control.failed = True
                log.error("%s", triton_status_text(err))
                self.settings.not_live()
            return
        print(triton_line("creating server", err), file=sys.stderr, flush=True)
        self.exit_code = CREATE_FAILED_CODE
        self.stop()

    def run(self) -> None:
        self.shutdown.grace_s, self.shutdown.exit_timeout_s = self.config.stop.drain_grace_s, \
            self.config.stop.exit_timeout_s
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(CORE_STOP_SIGNAL, self._core_stop)
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        # Bound (in __init__): workers and ingress can come while the agent reads the repository.
        self.lifecycle.begin_startup()
        front, back, own, agent = self.front_sock, self.back_sock, self.self_link.sock, self.agent.fd
        wake = WakePipe(signals=True)  # SIGTERM wakes the poll at once, not at the next tick
        poller = Poller([front, back, own, agent, wake.fd], self.spin_s)
        next_tick = self._last_tick = time.monotonic()
        more = False  # a drain stopped at its cap: poll without waiting
        # The sockets known to hold no message behind a quiet descriptor (``Poller.poll``'s ``quiet``): the
        # poll found them empty, or a drain ended on a ZMQ_EVENTS question that said so, and nothing touched
        # them since. A send may take in the socket's pending commands (a message's arrival among them), so
        # a socket this turn sent on is asked again; so is one whose drain stopped at its cap.
        quiet: list[Any] = []
        watchdog = self.systemd.interval is not None  # no watchdog (the usual case): no beat call per turn
        while True:
            if watchdog:
                self.systemd.beat()
            if self._report_in_flight:
                self._report_in_flight = False
                self._log_in_flight()
            if self._stopping:
                self.shutdown.begin()
                self.systemd.stopping("draining")
                if self.shutdown.phase(busy=self.ctx.ledger.busy) is Phase.DONE:
                    break
            ready = poller.poll(0 if more else self._poll_timeout_ms(next_tick), quiet)
            back_quiet = front_quiet = own_quiet = True
            if back in ready:
                back_quiet = not drain_peers(back, m.worker_decoder.decode, self._on_worker, "a worker")
            if front in ready:
                front_quiet = not drain_peers(front, m.ingress_decoder.decode, self._on_ingress, "an ingress")
            if own in ready:
                own_quiet = not self.self_link.drain(self.ensembles.on_response)
            more = not (back_quiet and front_quiet and own_quiet)
            if agent in ready and self.agent.drain():  # the repository agent's results: apply them
                if self.lifecycle.unusable is not None and not self._stopping:
                    self._cannot_create(self.lifecycle.unusable)
                self.placement.place()
                self.placement.settle()
                if not self._announced_ready and not self.lifecycle.starting and not self._stopping:
                    self._announced_ready = True
                    self.systemd.ready(f"serving {len(self.registry.models)} model(s)")
            if wake.fd in ready:
                wake.clear()
            now = time.monotonic()
            if now >= next_tick:
                self._tick(now)
                next_tick = now + HEARTBEAT_INTERVAL_S
            self.dispatcher.fire_timers()
            if self.registry.generation != self._announced_generation:
                self._announce_generation()
            if self.back.flush():
                back_quiet = False
            if self.front.flush():
                front_quiet = False
            quiet.clear()
            if back_quiet:
                quiet.append(back)
            if front_quiet:
                quiet.append(front)
            if own_quiet:
                quiet.append(own)
        self._log_unloads()
        self.agent.close()
        self.lifecycle.remove_overrides()
        wake.close()
        self.self_link.close()
        self.tracer.close()
        self.front_sock.close(0)
        self.back_sock.close(0)
        self.loans.close()

    def _log_unloads(self) -> None:
        """Triton's line for each version it unloads as it stops (its UnloadAllModels): those loaded still."""
        entries = [*self.registry.models.values(), *self.registry.retiring]
        for entry in entries:
            for state in entry.versions.values():
                if not state.error and (state.load_duration_ns or entry.spec.backend == "ensemble"):
                    log.info("successfully unloaded '%s' version %s", entry.spec.name, state.label)

    def _poll_timeout_ms(self, next_tick: float) -> int:
        wait_s = max(0.0, next_tick - time.monotonic())
        due_ns = self.dispatcher.next_timer_ns()
        if due_ns:
            timer_s = max(0.0, (due_ns - time.monotonic_ns()) / 1e9)
            if timer_s < wait_s:
                # Whole milliseconds only (zmq_poll counts no finer), rounded down: the loop turns without
                # waiting through the last one, so a 200 µs batch delay fires after 200 µs, not 1-2 ms.
                return int(timer_s * 1000)
        return int(wait_s * 1000) + (1 if wait_s > 0 else 0)

    # --- ingress side -------------------------------------------------------------------

    def _on_ingress(self, identity: bytes, msg: m.IngressToRouter) -> None:
        if isinstance(msg, m.InferRequest):
            if self.shutdown.started is not None and self.shutdown.refusing():  # no call while serving
                err = ConveyorError(Status.UNAVAILABLE, "the server is shutting down: retry on another instance")
                self.replies.error(identity, msg.id, msg.model, msg.version, err)
            else:
                self._on_infer(identity, msg)
        elif isinstance(msg, m.ControlRequest):
            reply = self.control_ops.handle(identity, msg)
            if reply is not None:  # None: the op answers later (a load, once the model settled)
                self.front.send(identity, m.encode(reply))
        elif isinstance(msg, m.Cancel):
            self._on_cancel(identity, msg.id)
        elif isinstance(msg, m.TraceEnd):
            self.tracer.finish(msg)
        elif isinstance(msg, m.Refused):
            count_refused(self.registry, msg)
        elif isinstance(msg, m.IngressHello):
            if msg.version != m.PROTOCOL_VERSION:
                log.error("ingress pid %d speaks protocol %d, not %d", msg.pid, msg.version, m.PROTOCOL_VERSION)
                return
            self._ingress_peers[identity] = msg.pid
            if msg.ngh2_failed:  # counted once per ingress link, however often it says hello
                self.control.ngh2_failures.add(identity)
            if msg.reply_to:
                self.dispatcher.reply_to[identity] = msg.reply_to
            else:
                self.dispatcher.reply_to.pop(identity, None)
            self.front.send(identity, self.settings.message())

    # --- worker side --------------------------------------------------------------------

    def _on_worker(self, identity: bytes, msg: m.WorkerToRouter) -> None:
        if isinstance(msg, m.WorkerHello):
            self.membership.on_hello(identity, msg)
            return
        worker = self.pool.seen(identity)
        if worker is None:
            # A worker we dropped (or from before a router restart): make it start over.
            self.back.send(identity, m.encode(m.Rehello()))
            return
        if isinstance(msg, m.BatchResult):  # the most frequent first
            self._on_result(msg)
        elif isinstance(msg, m.ItemResponse):
            self._on_item_response(identity, msg)
        elif isinstance(msg, m.ItemResponsesSent):
            self.results.on_responses_sent(identity, msg)
        elif isinstance(msg, m.ModelLoaded):
            self.membership.on_loaded(worker, msg)
        elif isinstance(msg, m.WorkerLeaving):
            self.membership.on_leaving(worker)
        elif isinstance(msg, m.InstanceClosed):
            self.lifecycle.closed(msg.model, msg.version, msg.instance)
            self.placement.settle()
        elif isinstance(msg, m.CustomMetrics):
            self.control.custom_metrics.update(identity, msg.metrics)
            self.registry.waiting.kv_reported(identity, msg.metrics)  # MAX_KV_CACHE_USAGE reads it
        elif isinstance(msg, m.ReadyChecked):
            self.user_readiness.on_checked(msg)
        elif isinstance(msg, m.LoraUpdated):
            self.runtime_lora.on_updated(identity, msg)
        elif isinstance(msg, m.PrefixesEvicted):
            self._on_evicted(identity, msg)
        if self.worker_drain.active:
            self.membership.progress_drain()

    def _on_evicted(self, identity: bytes, msg: m.PrefixesEvicted) -> None:
        """A vLLM engine evicted prompt blocks: engine placement's record forgets them there."""
        inst = self.registry.find_instance(msg.model, msg.version, msg.instance)
        if inst is None or inst.worker != identity or inst.version.placement is None:
            return
        if msg.everything:
            inst.version.placement.forget(inst)
        else:
            inst.version.placement.evicted(inst, msg.keys)

    def _tick(self, now: float) -> None:
        late = now - self._last_tick - HEARTBEAT_INTERVAL_S
        self._last_tick = now
        if late > LATE_TICK_S:
            log.warning("the router's loop was held up for %.1fs", late)
            self.pool.excuse(late)
        for worker in self.pool.silent(now):
            self.membership.drop(worker.identity, "it stopped answering")
        if self.worker_drain.active:
            self.membership.progress_drain()
        beat = m.encode(m.Heartbeat())
        for identity in self.pool.workers:
            self.back.send(identity, beat)
        for state in self.registry.every_version():
            if len(state.batcher):
                self.dispatcher.schedule(state)
        if (self.lifecycle.mode is ControlMode.POLL and now >= self._next_poll and not self.lifecycle.starting
                and not self.control.failed):
            self._next_poll = now + self._poll_secs
            self.lifecycle.begin_poll()  # applied when the agent has looked
        self.placement.settle()
        if self._startup_pending:
            self._check_startup()
        self.loans.collect(expire=True)
        self.user_readiness.expire(now)
        self.runtime_lora.expire(now)
        if self.shm and now >= self._next_shm_sweep and not self._shm_sweeping:
            self._next_shm_sweep = now + SHM_SWEEP_INTERVAL_S
            self.forget_regions(self.shm.settle())
            keys = self.shm.system_keys()
            if keys:  # opened on the agent's thread: a key may be a FIFO by now
                self._shm_sweeping = True
                self.agent.submit(Lane.SHM, lambda: look_all(keys), self._shm_swept)

    def _shm_swept(self, inodes: dict[int, int] | Exception) -> None:
        """The periodic check's outcome: regions whose segment went away or was replaced are dropped."""
        self._shm_sweeping = False
        if isinstance(inodes, Exception):
            log.warning("checking the registered shared-memory segments failed: %r", inodes)
            return
        self.forget_regions(self.shm.swept(inodes))

    def answer(self, caller: Caller, error: ConveyorError | None) -> None:
        """Answer a deferred control call: an empty result, or ``error``."""
        identity, cid = caller
        err = None if error is None else m.ErrorInfo(int(error.status), error.message)
        self.front.send(identity, m.encode(m.ControlReply(cid, error=err)))

    def _broadcast_settings(self, payload: bytes) -> None:
        """A changed ``SettingsUpdate`` to every ingress (and BLS link) and worker we know."""
        for identity in self._ingress_peers:  # one gone meanwhile: ROUTER drops the message
            self.front.send(identity, payload)
        for identity in self.pool.workers:
            self.back.send(identity, payload)

    def _announce_generation(self) -> None:
        """The repository changed this turn: every ingress and BLS link drops its signatures."""
        self._announced_generation = generation = self.registry.generation
        payload = m.encode(m.RepositoryChanged(generation))
        for identity in self._ingress_peers:
            self.front.send(identity, payload)

    def forget_regions(self, ids: list[int]) -> None:
        """Tell every worker to unmap these client registrations."""
        if ids:
            msg = m.encode(m.ForgetRegions(ids))
            for identity in self.pool.workers:
                self.back.send(identity, msg)
