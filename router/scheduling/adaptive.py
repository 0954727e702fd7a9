"""Adaptive batching (a Conveyor extension): the model names a latency target
and the router finds the queue delay itself.

    parameters { key: "conveyor.latency_target_us" value { string_value: "8000" } }

Triton ignores parameters it does not know, so such a config still loads there
(with its static ``dynamic_batching`` settings). In Conveyor the target
replaces ``preferred_batch_size`` and ``max_queue_delay_microseconds``; queue
policies and priority levels still apply.

Why a search and not a model: the best static delay depends on the load *and*
on how clients behave. Under open-loop arrivals below capacity every delay gives
the same throughput and the shortest is best; under a closed loop (each client
waits for its answer, as perf_analyzer and most services do) a longer delay
makes larger batches, which raises throughput *and* lowers latency, up to a
point that depends on the model's cost per batch and per row and on what else
runs on the machine. An earlier version modelled arrivals and execution times
and planned from them; on a shared machine the measured times were too noisy
and its open-loop model was wrong for closed-loop clients (see
docs/SCHEDULING.md). So the controller measures what it optimises:

* Batches leave at once when ``max_batch_size`` rows are queued, else when the
  oldest request has waited the delay ``D`` (Triton's static rule, with ``D``
  chosen here).
* ``D`` is one of ``LEVELS_US`` up to the target (the target caps the wait a
  batch adds; it is where the search stops, not a promise under overload).
* Throughput is measured in windows (at least ``WINDOW_NS`` and
  ``WINDOW_BATCHES`` executions): rows executed per second. The controller
  alternates between windows at its level and, now and then, a window at a
  neighbour level (up and down in turn). It moves to the neighbour when that
  window did more than ``GAIN`` better, or, for the lower neighbour, when it was
  no more than ``GAIN`` worse: at equal throughput the shorter wait wins.
* A failed probe doubles the number of windows before the next one (up to
  ``MAX_HOLD``), so a settled load pays little for the search; a move resets it.
* No probe upwards when it cannot pay: the last window's batches all held one
  row and rows came further apart than the higher delay (concurrency 1, or a
  light load). Waiting would only add latency there, so the search does not
  spend windows on it.
* A window that ran too long (``STALE_NS``: the load stopped or changed) is
  thrown away; with nothing measured, the delay is 0 (batches of what is
  queued, at once).

``AdaptiveBatcher`` is the dynamic batcher that applies the controller's plan
(its delay and batch sizes) instead of the config's.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.pending import Pending
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP, SchedulingPolicy
from conveyor.router.spec.adaptive import LATENCY_TARGET_PARAMETER

LEVELS_US = (0, 1000, 2000, 3000, 4000, 6000, 8000, 12000, 16000, 24000, 32000, 48000, 64000)
WINDOW_NS = 300_000_000  # a throughput window lasts at least this long ...
WINDOW_BATCHES = 8  # ... and holds at least this many executions
SETTLE_NS = 20_000_000  # after a change of delay, executions this soon are not counted (old batches)
STALE_NS = 2_000_000_000  # a window longer than this is thrown away
GAIN = 0.05  # a relative throughput difference below this is noise
MAX_HOLD = 8  # windows between probes, at most


def latency_target_ns(config: mc.ModelConfig) -> int:
    """The configured target in ns; 0 when the model has none (or it is invalid: see ``adaptive_problem``)."""
    param = config.parameters.get(LATENCY_TARGET_PARAMETER)
    if param is None:
        return 0
    try:
        return max(int(param.string_value), 0) * 1000
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class Plan:
    batch_size: int  # leave at once when this many rows are queued
    delay_ns: int  # or once the oldest waited this long
    max_batch_size: int = 1  # never more rows than this


class AdaptiveController:
    """The search above, fed by the router; deterministic (every input carries its time)."""

    def __init__(self, target_ns: int, max_batch_size: int) -> None:
        self.max_batch_size = max(max_batch_size, 1)
        self.levels_ns = [us * 1000 for us in LEVELS_US if us * 1000 <= target_ns] or [0]
        self.level = 0  # index into levels_ns: the delay in use between probes
        self.probing: int | None = None  # the level of the window being measured, when it is a probe
        self.current_rate = 0.0  # rows/s of the last window at ``level`` (0: none yet)
        self._up_next = True  # the direction of the next probe
        self._hold = 1  # windows at ``level`` before the next probe
        self._held = 0
        self._window_start: int | None = None  # first counted execution's time
        self._settle_until = 0
        self._rows = 0
        self._batches = 0
        self._lone_rows_gap_ns = 0.0  # last window: mean gap between rows when every batch held one row, else 0
        self._plan = self._make_plan()

    # --- observations --------------------------------------------------------------------

    def executed(self, now_ns: int, rows: int) -> None:
        """A batch of ``rows`` finished at ``now_ns``."""
        if now_ns < self._settle_until:
            return
        if self._window_start is None:
            self._window_start = now_ns  # this batch opens the window; the rows after it count
            return
        self._rows += rows
        self._batches += 1
        took = now_ns - self._window_start
        if took > STALE_NS:
            self._restart_window(now_ns)
        elif took >= WINDOW_NS and self._batches >= WINDOW_BATCHES:
            self._lone_rows_gap_ns = took / self._rows if self._rows == self._batches else 0.0
            self._window_done(self._rows * 1e9 / took, now_ns)

    # --- decision ------------------------------------------------------------------------

    def plan(self, now_ns: int) -> Plan:
        return self._plan

    @property
    def delay_ns(self) -> int:
        return self._plan.delay_ns

    def _window_done(self, rate: float, now_ns: int) -> None:
        if self.probing is None:
            self.current_rate = rate
            self._held += 1
            if self._held >= self._hold:
                self._start_probe()
        else:
            probe, self.probing = self.probing, None
            current = self.current_rate
            better = rate > current * (1 + GAIN) or (probe < self.level and rate >= current * (1 - GAIN))
            if better:
                self.level, self.current_rate, self._hold = probe, rate, 1
            else:
                self._hold = min(self._hold * 2, MAX_HOLD)
            self._held = 0
        self._plan = self._make_plan()
        self._restart_window(now_ns, settle=True)

    def _start_probe(self) -> None:
        top = len(self.levels_ns) - 1
        up = self._up_next if 0 < self.level < top else self.level == 0
        if up and self.level < top and self._lone_rows_gap_ns > self.levels_ns[self.level + 1]:
            up = False  # nothing would join a waiting batch
        if top == 0 or (not up and self.level == 0):
            self._held = 0
            return
        self._up_next = not up
        self.probing = self.level + 1 if up else self.level - 1

    def _restart_window(self, now_ns: int, settle: bool = False) -> None:
        self._window_start = None
        self._rows = self._batches = 0
        self._settle_until = now_ns + SETTLE_NS if settle else 0

    def _make_plan(self) -> Plan:
        level = self.level if self.probing is None else self.probing
        return Plan(self.max_batch_size, self.levels_ns[level], self.max_batch_size)


class AdaptiveBatcher(DynamicBatcher):
    def __init__(
        self, max_batch_size: int, target_ns: int, policy: SchedulingPolicy | None = None,
        queue_cap: int = DEFAULT_QUEUE_CAP,
    ) -> None:
        super().__init__(max_batch_size, [], 0, True, policy, queue_cap)
        self.adaptive = AdaptiveController(target_ns, self.max_batch_size)
        self._applied: Plan | None = None

    def next_batch(self, now_ns: int) -> list[Pending] | int | None:
        controller = self.adaptive
        assert controller is not None
        plan = controller.plan(now_ns)
        if plan is not self._applied:
            self._applied = plan
            self.preferred = frozenset(range(plan.batch_size, plan.max_batch_size + 1))
            self.max_preferred = self.max_batch_size = plan.max_batch_size
            self.max_delay_ns = plan.delay_ns
        return super().next_batch(now_ns)
