"""The adaptive batching controller, fed synthetic arrivals and execution times
(no clock, no server), and the batcher that applies its plan."""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf import text_format

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.router.pending import Pending
from conveyor.router.scheduling.adaptive import MAX_HOLD, AdaptiveBatcher, AdaptiveController, Plan, latency_target_ns
from conveyor.router.spec.adaptive import adaptive_problem
from conveyor.router.spec.validate import validate

LEVEL = "unit"

MS = 1_000_000


class Load:
    """Feeds a controller executions whose throughput depends on the delay in use:
    ``rate(delay_ms)`` rows/s, as a stand-in for the clients and the model."""

    def __init__(self, controller: AdaptiveController, rate: Callable[[float], float], rows: int = 4) -> None:
        self.c, self.rate, self.rows, self.now = controller, rate, rows, 0

    def run(self, seconds: float) -> None:
        end = self.now + int(seconds * 1e9)
        while self.now < end:
            per_second = self.rate(self.c.delay_ns / MS)
            self.now += int(self.rows / per_second * 1e9)
            self.c.executed(self.now, self.rows)


def test_nothing_measured_yet_means_no_wait_and_full_batches_leave_at_once() -> None:
    assert AdaptiveController(5 * MS, 8).plan(0) == Plan(8, 0, 8)


def test_the_delay_levels_stop_at_the_target() -> None:
    assert AdaptiveController(3 * MS, 8).levels_ns[-1] == 3 * MS
    assert AdaptiveController(900_000, 8).levels_ns == [0]  # below the first step: never wait


def test_when_waiting_does_not_pay_the_delay_stays_at_zero() -> None:
    # Closed loop at a low concurrency: every microsecond of wait is lost throughput.
    c = AdaptiveController(8 * MS, 16)
    Load(c, lambda d: 2000 / (1 + d / 4), rows=2).run(30)
    assert c.level == 0 and c._hold == MAX_HOLD  # probes failed, so they became rare


def test_lone_rows_further_apart_than_the_next_delay_are_never_kept_waiting() -> None:
    # Concurrency 1: one row per batch, 4 ms apart. Waiting 1 ms could catch nothing: no probe at all.
    c = AdaptiveController(8 * MS, 16)
    probes = 0
    load = Load(c, lambda d: 250 / (1 + d / 4), rows=1)
    for _ in range(300):
        load.run(0.1)
        probes += c.probing is not None
    assert probes == 0 and c.level == 0


def test_when_larger_batches_pay_the_delay_climbs_to_the_best_level() -> None:
    # Closed loop at high concurrency: throughput rises with the delay up to 6 ms, then falls.
    c = AdaptiveController(20 * MS, 16)
    Load(c, lambda d: 500 + 60 * min(d, 6) - 40 * max(d - 6, 0)).run(30)
    assert c.levels_ns[c.level] == 6 * MS


def test_at_equal_throughput_the_shorter_wait_wins() -> None:
    # Open loop below capacity: throughput is the arrival rate whatever the delay.
    c = AdaptiveController(8 * MS, 16)
    c.level = 6
    Load(c, lambda d: 400).run(30)
    assert c.level == 0


def test_a_change_of_load_moves_the_delay_again() -> None:
    c = AdaptiveController(20 * MS, 16)
    load = Load(c, lambda d: 500 + 60 * min(d, 6) - 40 * max(d - 6, 0))
    load.run(30)
    assert c.level > 0
    load.rate = lambda d: 250 / (1 + d / 4)
    load.rows = 1
    load.run(60)
    assert c.level == 0


def test_a_window_interrupted_by_a_long_pause_is_thrown_away() -> None:
    c = AdaptiveController(8 * MS, 16)
    c.executed(0, 4)
    c.executed(1 * MS, 4)
    c.executed(3_000 * MS, 4)  # 3 s later: the load stopped meanwhile
    assert c.current_rate == 0 and c._rows == 0


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


def test_the_batcher_waits_up_to_the_delay_and_a_full_batch_leaves_at_once() -> None:
    t = 10 * MS
    batcher = AdaptiveBatcher(4, 5 * MS)
    controller = batcher.adaptive
    assert controller is not None
    controller.level = controller.levels_ns.index(2 * MS)
    controller._plan = controller._make_plan()
    for i in range(3):
        batcher.push(pending(i, t + i * 100_000))  # 0.1 ms apart
    assert batcher.next_batch(t + 300_000) == t + 2 * MS  # 3 of 4 rows: wait until the oldest waited 2 ms
    batcher.push(pending(3, t + 400_000))
    batch = batcher.next_batch(t + 400_000)
    assert isinstance(batch, list) and len(batch) == 4
