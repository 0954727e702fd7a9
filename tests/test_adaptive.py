"""The adaptive batching controller, fed synthetic arrivals and execution times
(no clock, no server), and the batcher that applies its plan."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.router.adaptive import AdaptiveController, Plan, adaptive_problem, latency_target_ns
from conveyor.router.adaptive_batcher import AdaptiveBatcher
from conveyor.router.pending import Pending
from conveyor.router.repository import validate

MS = 1_000_000


def controller(target_ms: float, max_batch: int = 8, gap_ms: float = 0.0, **exec_ms: float) -> AdaptiveController:
    c = AdaptiveController(int(target_ms * MS), max_batch)
    if gap_ms:
        c.arrived(1, 1)
        c.arrived(1 + int(gap_ms * MS), 1)
    for size, ms in exec_ms.items():
        c.executed(int(size.removeprefix("b")), int(ms * MS))
    return c


def test_nothing_measured_yet_means_batches_of_one_at_once() -> None:
    assert controller(5).plan(0) == Plan(1, 0, 1)


def test_low_load_sends_each_request_at_once() -> None:
    # 100 ms between requests: waiting for a second one would blow any 5 ms target.
    c = controller(5, gap_ms=100, b1=1, b8=2)
    assert c.plan(0).batch_size == 1


def test_high_load_grows_the_batch_while_the_target_holds() -> None:
    c = controller(5, gap_ms=0.1, b1=1, b8=2)  # 7 * 0.1 ms to fill + 2 ms to run: fits
    assert c.plan(0) == Plan(8, 3 * MS, 8)  # the oldest may wait target - e(8)


def test_unmeasured_sizes_are_interpolated_or_scaled_linearly_past_the_largest() -> None:
    assert controller(5, b2=2, b6=4).estimate_ns(3) == 2.5 * MS
    c = controller(5, gap_ms=0.1, b2=2)
    assert c.estimate_ns(4) == 4 * MS and c.estimate_ns(1) == 2 * MS  # one size known: no fixed cost assumed
    # B: b=4: 0.3 + 4 <= 5; b=5: 0.4 + 5 > 5. M: e(5) = 5 <= 5, e(6) > 5
    assert c.plan(0) == Plan(4, 1 * MS, 5)


def test_past_the_largest_measured_size_the_fitted_line_is_followed() -> None:
    c = controller(5, b1=2, b2=2.5, b3=3)  # 1.5 ms per execution + 0.5 ms per row
    assert c.estimate_ns(8) == pytest.approx(5.5 * MS)
    assert controller(5, b1=3, b2=2).estimate_ns(4) == 2.5 * MS  # a falling line is taken as flat


def test_a_size_not_executed_for_a_while_is_forgotten() -> None:
    c = controller(5, b1=1, b2=50)  # one slow outlier at 2 rows: M = 1
    assert c.plan(0).max_batch_size == 1
    for _ in range(100):
        c.executed(1, 1 * MS)
    assert 2 in c.exec_ns and c.plan(0).max_batch_size == 1
    c.executed(1, 1 * MS)
    assert 2 not in c.exec_ns and c.plan(0).max_batch_size == 5  # e(b) = b ms again: 2 is tried


def test_execution_times_are_averaged_per_batch_size() -> None:
    c = controller(5, b4=2)
    c.executed(4, 4 * MS)
    assert c.estimate_ns(4) == pytest.approx(2 * MS + 0.3 * 2 * MS)


def test_the_ceiling_follows_the_demand_seen() -> None:
    c = controller(50, gap_ms=0.1, b1=1, b8=2)
    assert c.plan(0).batch_size == 8
    c.batch_left(3, 0)  # left on its delay with 3 rows: no more came in time
    assert c.plan(0).batch_size == 3
    c.batch_left(3, 0)  # full, nothing behind it: stays
    assert c.plan(0).batch_size == 3
    c.batch_left(3, 5)  # full with requests behind it: one more
    assert c.plan(0).batch_size == 4


def test_arrival_gaps_are_smoothed_and_re_planned_as_time_passes() -> None:
    c = controller(5, gap_ms=0.1, b1=1, b8=2)
    assert c.plan(0).batch_size == 8
    c.arrived(1 + int(0.1 * MS) + 50 * MS, 1)  # a 50 ms pause
    assert c.plan(0).batch_size == 8  # the plan is kept for up to a millisecond
    assert c.plan(2 * MS).batch_size == 1  # g is now about 5 ms


def config(text: str) -> mc.ModelConfig:
    base = 'name: "m" max_batch_size: 8 input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] ' \
           'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }] '
    return text_format.Parse(base + text, mc.ModelConfig())


def target(value: str) -> str:
    return f'parameters {{ key: "conveyor.latency_target_us" value {{ string_value: "{value}" }} }}'


def test_the_target_parameter_is_checked_at_load() -> None:
    assert latency_target_ns(config(target("5000") + " dynamic_batching {}")) == 5 * MS
    assert validate(config(target("5000") + " dynamic_batching {}")) == ""
    assert "must be a positive number of microseconds, got 'fast'" in adaptive_problem(config(target("fast")))
    assert "needs dynamic_batching" in validate(config(target("5000")))
    assert latency_target_ns(config("")) == 0


def pending(request_id: int, arrival_ns: int) -> Pending:
    req = m.InferRequest(request_id, "m", "", [m.TensorRef("x", "FP32", [1, 1], "r", 0, 4)], [])
    return Pending(b"i", req, arrival_ns, 1, ("x", "FP32", 1))


def test_the_batcher_waits_for_the_planned_size_then_leaves_on_the_delay() -> None:
    t = 10 * MS
    batcher = AdaptiveBatcher(4, 5 * MS)
    batcher.push(pending(1, t))
    assert [p.request.id for p in batcher.next_batch(t)] == [1]  # type: ignore[union-attr]
    controller = batcher.adaptive
    assert controller is not None
    controller.executed(1, 1 * MS)
    controller.executed(4, 2 * MS)
    for i in range(2, 4):
        batcher.push(pending(i, t + i * 100_000))  # 0.1 ms apart
    now = t + 400_000
    wake = batcher.next_batch(now)  # B = 4 (e(4) = 2 ms), 2 queued: wait until the oldest waited 3 ms
    assert wake == t + 200_000 + 3 * MS
    batch = batcher.next_batch(int(wake))  # type: ignore[arg-type]
    assert isinstance(batch, list) and len(batch) == 2
    assert controller.ceiling == 2  # only 2 came in time


def test_requests_that_queued_behind_busy_instances_leave_together_up_to_the_largest_batch() -> None:
    batcher = AdaptiveBatcher(16, 5 * MS)
    controller = batcher.adaptive
    assert controller is not None
    controller.executed(1, 1 * MS)
    controller.executed(2, int(1.5 * MS))  # 0.5 ms + 0.5 ms per row: M = 9
    controller.ceiling = 2  # B = 2
    for i in range(12):
        batcher.push(pending(i, 10 * MS + i))
    plan = controller.plan(10 * MS + 20)
    assert (plan.batch_size, plan.max_batch_size) == (2, 9)
    batch = batcher.next_batch(10 * MS + 20)
    assert isinstance(batch, list) and len(batch) == 9
