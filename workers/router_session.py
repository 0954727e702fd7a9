"""The worker's side of its link to the router: the DEALER socket and this turn's outbox
to it, the hello and registration, heartbeats, leaving on purpose (``WorkerLeaving`` until
``LeaveGranted``), and the models' custom metrics sent as they change.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import zmq

from conveyor.deploy.runtime.sd_notify import Notifier
from conveyor.proto import messages as m
from conveyor.proto.framing import Outbox
from conveyor.workers.backends.python.pb_utils import metrics as pb_metrics
from conveyor.workers.config import WorkerConfig
from conveyor.workers.devices import DeviceMap

log = logging.getLogger("conveyor.workers.worker")  # the name the worker's log lines always had

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
# Series published lazily (the vLLM engine's statistics, changed at every engine step) go at most this
# often: sent on each step's turn, they woke the loop and the router ~100 times a second per engine.
LAZY_METRICS_S = 0.1
HEARTBEAT_S = 1.0


class RouterSession:
    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], config: WorkerConfig, devices: DeviceMap,
                 gpu_backends: list[str], systemd: Notifier) -> None:
        """Reads ``config``'s router endpoint and exit timeout."""
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(config.router_endpoint)
        # What this loop turn sends, flushed at its end: one message per peer.
        self.out = Outbox(self.sock)
        self.devices = devices
        self.gpu_backends = gpu_backends
        self.exit_timeout_s = config.exit_timeout_s
        self.systemd = systemd
        self.registered = False
        self._last_heard = time.monotonic()
        self._quiet_logged = False
        self._next_beat = 0.0  # the first turn beats
        self._leave_by: float | None = None  # set once WorkerLeaving is sent
        self._next_metrics = 0.0
        self._next_lazy = 0.0

    def hello(self) -> None:
        self.out.send(m.encode(m.WorkerHello(m.PROTOCOL_VERSION, os.getpid(), socket.gethostname(),
                                              self.devices.reported(), gpu_backends=self.gpu_backends)))

    def heard(self, msg: m.RouterToWorker) -> None:
        """A message from the router while not registered (``heard_at`` counts every message)."""
        if not self.registered and not isinstance(msg, m.Rehello):
            # The router answers a hello at once: anything but Rehello means it knows us.
            self.registered = True
            self.systemd.ready("registered with the router")

    def heard_at(self, now: float) -> None:
        """The loop turn that ends at ``now`` took messages from the router (stamped once a turn, not per
        message: the silence it measures is counted in tens of seconds)."""
        self._last_heard = now
        self._quiet_logged = False

    def rehello(self) -> None:
        """A router that does not know this worker (it restarted): start over with it."""
        self._last_heard = time.monotonic()
        self.registered = False
        self.hello()
        self.send_metrics(time.monotonic(), everything=True)  # the new router knows none of them

    def leave(self, now: float) -> bool:
        """Hand the work back before exiting: the router answers LeaveGranted once it
        sends us nothing more and every batch it gave us has come back. True: stop now."""
        if self._leave_by is None:
            if not self.registered:
                return True  # the router knows nothing of ours: nothing to hand back
            self.out.send(m.encode(m.WorkerLeaving("stopping")))
            self._leave_by = now + self.exit_timeout_s
            self.systemd.stopping("draining: finishing in-flight batches")
            log.info("leaving: waiting for the router to move this worker's instances")
        elif now > self._leave_by:
            log.warning("the router did not let this worker go within %.0fs: exiting", self.exit_timeout_s)
            return True
        return False

    def heartbeat(self, now: float) -> None:
        """A heartbeat when one is due; a silent router logged once per silence."""
        if now < self._next_beat:
            return
        self.out.send(m.encode(m.Heartbeat()))
        self._next_beat = now + HEARTBEAT_S
        if now - self._last_heard > ROUTER_QUIET_S and not self._quiet_logged:
            self._quiet_logged = True
            log.warning("no word from the router for %.0fs: keeping this worker's instances (a "
                        "router that restarted answers a heartbeat with Rehello)", ROUTER_QUIET_S)

    # --- custom metrics ---------------------------------------------------------------------

    def poll_ms(self) -> int:
        """How long the loop may sleep: until the custom metrics are due when some changed."""
        registry = pb_metrics.REGISTRY
        if registry.dirty:
            due = self._next_metrics
        elif registry.lazy_dirty:
            due = self._next_lazy
        else:
            return 250
        return max(0, min(250, int((due - time.monotonic()) * 1000) + 1))

    def metrics_due(self, now: float) -> None:
        registry = pb_metrics.REGISTRY
        if (registry.dirty and now >= self._next_metrics) or (registry.lazy_dirty and now >= self._next_lazy):
            self.send_metrics(now)

    def send_metrics(self, now: float, everything: bool = False) -> None:
        """The models' custom metrics that changed (all of them for a new router), at
        most every ``METRICS_FLUSH_S``: a model may update them on every request."""
        self._next_metrics = now + METRICS_FLUSH_S
        self._next_lazy = now + LAZY_METRICS_S
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
