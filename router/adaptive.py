"""Adaptive batching (a Conveyor extension): the model names a latency target
and the router picks the batch size and the queue delay itself.

    parameters { key: "conveyor.latency_target_us" value { string_value: "5000" } }

Triton ignores parameters it does not know, so such a config still loads there
(with its static ``dynamic_batching`` settings). In Conveyor the target
replaces ``preferred_batch_size`` and ``max_queue_delay_microseconds``; queue
policies and priority levels still apply.

The rule, re-evaluated as measurements arrive:

* ``e(b)``: execution time of a batch of ``b`` rows (the worker's input, infer
  and output time), an EWMA per size. A size not measured yet is interpolated
  between the measured sizes around it. Above the largest measured size it
  follows the least-squares line ``a + k * b`` through the measured sizes (a
  fixed cost per execution plus a cost per row), never below the largest
  measured time; with one size ``s`` measured, ``e(s) * b / s`` (pessimistic:
  no fixed cost). So the controller grows into sizes it expects to afford, then
  measures them. Nothing measured yet: batches of 1. A size not executed for
  ``FORGET_AFTER`` executions is forgotten: one slow outlier (the machine
  was busy) must not bar that size for ever, since a barred size is never
  measured again.
* ``g``: time between row arrivals, an EWMA.
* ``c``: a ceiling following the demand the batcher saw: a batch that had to
  leave on its delay with ``n`` rows sets ``c = n`` (more did not come in
  time); a full batch that left rows queued behind it raises ``c`` by one.
* Batch size ``B`` (what a batch waits for): grow ``b`` from 1 up to
  ``min(c, M)`` while its oldest request should finish in time:
  ``(b - 1) * g + e(b) <= target`` (filling it takes ``(b - 1) * g``). At least 1.
* Largest batch ``M``: the largest ``b <= max_batch_size`` with
  ``e(b) <= target`` (at least 1). Requests that queued while the instances
  were busy have waited already: once ``B`` rows are there, the batch leaves at
  once with up to ``M`` rows.
* Queue delay ``D = target - e(B)`` (at least 0): a batch that has not reached
  ``B`` leaves when its oldest request has waited this long, in time to finish
  within the target.

So at low load ``B`` is 1 and requests leave at once; as load grows, batches
grow while the target allows, and under overload they are as large as the
target lets one execution be (which also measures those sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc

LATENCY_TARGET_PARAMETER = "conveyor.latency_target_us"
EXEC_ALPHA = 0.3  # weight of a new execution time in its size's EWMA
GAP_ALPHA = 0.1  # weight of a new inter-arrival gap
FORGET_AFTER = 100  # executions of other sizes after which a size's time is estimated afresh
REPLAN_NS = 1_000_000  # arrivals move g continuously: re-plan at most this often between other events


def latency_target_ns(config: mc.ModelConfig) -> int:
    """The configured target in ns; 0 when the model has none (or it is invalid: see ``adaptive_problem``)."""
    param = config.parameters.get(LATENCY_TARGET_PARAMETER)
    if param is None:
        return 0
    try:
        return max(int(param.string_value), 0) * 1000
    except ValueError:
        return 0


def adaptive_problem(config: mc.ModelConfig) -> str:
    """Why the model's latency target cannot be used, or ''."""
    param = config.parameters.get(LATENCY_TARGET_PARAMETER)
    if param is None:
        return ""
    value = param.string_value.strip()
    if not value.isdigit() or int(value) <= 0:
        return f"parameter '{LATENCY_TARGET_PARAMETER}' must be a positive number of microseconds, got '{value}'"
    if not config.HasField("dynamic_batching"):
        return f"parameter '{LATENCY_TARGET_PARAMETER}' needs dynamic_batching (and max_batch_size > 0)"
    return ""


def _line(times: dict[int, float], rows: int) -> float:
    """The least-squares line through ``times`` (size -> ns), at ``rows``; slope at least 0."""
    n = len(times)
    mean_b = sum(times) / n
    mean_e = sum(times.values()) / n
    spread = sum((b - mean_b) ** 2 for b in times)
    slope = max(sum((b - mean_b) * (e - mean_e) for b, e in times.items()) / spread, 0.0)
    return mean_e + slope * (rows - mean_b)


@dataclass(frozen=True, slots=True)
class Plan:
    batch_size: int  # B: leave once this many rows are queued
    delay_ns: int  # D: or once the oldest waited this long
    max_batch_size: int = 1  # M: never more rows than this


class AdaptiveController:
    """The rule above, fed by the router; deterministic (every input carries its time)."""

    def __init__(self, target_ns: int, max_batch_size: int) -> None:
        self.target_ns = target_ns
        self.max_batch_size = max(max_batch_size, 1)
        self.exec_ns: dict[int, float] = {}
        self._measured_at: dict[int, int] = {}  # size -> execution number of its last measurement
        self._executions = 0
        self.gap_ns = 0.0  # 0: not measured yet
        self.ceiling = self.max_batch_size
        self._last_arrival: int | None = None
        self._plan = Plan(1, 0, 1)
        self._planned_at = 0
        self._stale = True

    # --- observations --------------------------------------------------------------------

    def arrived(self, now_ns: int, rows: int) -> None:
        if self._last_arrival is not None:
            gap = (now_ns - self._last_arrival) / max(rows, 1)
            self.gap_ns = gap if not self.gap_ns else self.gap_ns + GAP_ALPHA * (gap - self.gap_ns)
        self._last_arrival = now_ns

    def executed(self, rows: int, ns: int) -> None:
        old = self.exec_ns.get(rows)
        self.exec_ns[rows] = float(ns) if old is None else old + EXEC_ALPHA * (ns - old)
        self._executions += 1
        self._measured_at[rows] = self._executions
        for size, at in list(self._measured_at.items()):
            if self._executions - at > FORGET_AFTER:
                del self._measured_at[size], self.exec_ns[size]
        self._stale = True

    def batch_left(self, rows: int, left_queued: int) -> None:
        """A batch of ``rows`` left; ``left_queued`` requests still wait behind it."""
        planned = self._plan.batch_size
        if rows < planned:
            self.ceiling = max(rows, 1)  # it left on its delay: that many came in time
        elif left_queued and self.ceiling < self.max_batch_size:
            self.ceiling += 1  # more came than a batch held
        else:
            return
        self._stale = True

    # --- decision ------------------------------------------------------------------------

    def plan(self, now_ns: int) -> Plan:
        if self._stale or now_ns - self._planned_at >= REPLAN_NS:
            self._plan = self._compute()
            self._planned_at = now_ns
            self._stale = False
        return self._plan

    def estimate_ns(self, rows: int) -> float | None:
        """``e(rows)``: measured; else interpolated between the measured sizes around it;
        else scaled from the largest measured size below; else the smallest measured
        size's time (a smaller batch costs no more). None: nothing measured."""
        times = self.exec_ns
        known = times.get(rows)
        if known is not None:
            return known
        if not times:
            return None
        below = max((s for s in times if s < rows), default=0)
        above = min((s for s in times if s > rows), default=0)
        if below and above:
            return times[below] + (times[above] - times[below]) * (rows - below) / (above - below)
        if not below:
            return times[above]
        if len(times) == 1:
            return times[below] * rows / below
        return max(_line(times, rows), times[below])

    def _compute(self) -> Plan:
        target = self.target_ns
        first = self.estimate_ns(1)
        if first is None:
            return Plan(1, 0, 1)
        exec_ns = [first] + [self.estimate_ns(b) or first for b in range(2, self.max_batch_size + 1)]
        largest = 1
        while largest < self.max_batch_size and exec_ns[largest] <= target:
            largest += 1
        best = 1
        while best < min(self.ceiling, largest) and best * self.gap_ns + exec_ns[best] <= target:
            best += 1
        return Plan(best, max(int(target - exec_ns[best - 1]), 0), largest)
