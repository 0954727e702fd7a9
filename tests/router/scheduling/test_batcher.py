"""DynamicBatcher policy, without sockets."""

from __future__ import annotations

import pytest

from conveyor.proto import messages as m
from conveyor.router.pending import Pending, shape_key
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.delay_hooks import BACKLOG_DELAY_ENV, DELAY_ENV, backlog_held_until, held_until

LEVEL = "unit"


def pending(rid: int, rows: int = 1, width: int = 16, at: int = 0, deadline: int = 0) -> Pending:
    req = m.InferRequest(rid, "m", "", [m.TensorRef("A", "FP32", [rows, width], "r", 0, 4 * rows * width)], [],
                         deadline_ns=deadline)
    return Pending(b"i", req, at, rows, shape_key(req, True))


def test_unbatched_model_runs_one_at_a_time() -> None:
    b = DynamicBatcher(0, [], 0, enabled=False)
    b.push(pending(1))
    b.push(pending(2))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1]


def test_takes_everything_queued_up_to_max_batch_size() -> None:
    b = DynamicBatcher(4, [], 0, enabled=True)
    for i in range(6):
        b.push(pending(i))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [0, 1, 2, 3]
    rest = b.next_batch(0)
    assert isinstance(rest, list) and [p.request.id for p in rest] == [4, 5]


def test_waits_for_the_queue_delay_then_leaves() -> None:
    b = DynamicBatcher(8, [4], 1000, enabled=True)
    b.push(pending(1, at=0))
    assert b.next_batch(10) == 1000  # wake me at the head's deadline
    batch = b.next_batch(1000)
    assert isinstance(batch, list) and len(batch) == 1


def test_preferred_size_leaves_at_once() -> None:
    b = DynamicBatcher(8, [2], 10**9, enabled=True)
    b.push(pending(1))
    b.push(pending(2))
    b.push(pending(3))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1, 2]


def test_the_batch_the_next_request_would_push_past_every_preferred_size_leaves_at_once() -> None:
    # Triton's qa/L0_batcher test_multi_batch_sum_gt_max_preferred: preferred [2, 6], 3 rows then 4 rows run as
    # two batches, the 3 at once and the 4 after its own queue delay.
    b = DynamicBatcher(8, [2, 6], 10**9, enabled=True)
    b.push(pending(1, rows=3, at=0))
    b.push(pending(2, rows=4, at=10))
    batch = b.next_batch(20)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1]
    assert b.next_batch(30) == 10 + 10**9
    batch = b.next_batch(10 + 10**9)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [2]


def test_a_first_request_over_every_preferred_size_leaves_alone() -> None:
    b = DynamicBatcher(8, [2, 6], 10**9, enabled=True)
    b.push(pending(1, rows=7))
    b.push(pending(2, rows=1))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1]


def test_past_the_queue_delay_the_whole_batch_leaves_beyond_the_preferred_sizes() -> None:
    b = DynamicBatcher(8, [2, 6], 1000, enabled=True)
    b.push(pending(1, rows=3, at=0))
    b.push(pending(2, rows=4, at=0))
    batch = b.next_batch(1000)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1, 2]


def test_different_shapes_do_not_batch_together() -> None:
    b = DynamicBatcher(8, [], 10**9, enabled=True)
    b.push(pending(1, width=16))
    b.push(pending(2, width=8))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1]


def test_rows_count_against_max_batch_size() -> None:
    b = DynamicBatcher(4, [], 0, enabled=True)
    b.push(pending(1, rows=3))
    b.push(pending(2, rows=2))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1]


def test_expired_requests_leave_the_queue() -> None:
    b = DynamicBatcher(4, [], 0, enabled=True)
    b.push(pending(1, deadline=5))
    b.push(pending(2))
    gone = b.take_expired(10)
    assert [p.request.id for p, _ in gone] == [1] and len(b) == 1


def test_cancel_removes_the_request() -> None:
    b = DynamicBatcher(4, [], 0, enabled=True)
    b.push(pending(1))
    assert b.remove(b"i", 1) is not None and len(b) == 0


def test_the_delay_schedulers_hold_lets_nothing_leave_until_its_count_then_ends() -> None:
    b = DynamicBatcher(4, [], 0, enabled=True)
    b.held_until = 3  # Triton's TRITONSERVER_DELAY_SCHEDULER (router/scheduling/delay_hooks.py)
    b.push(pending(1))
    b.push(pending(2))
    assert b.next_batch(0) is None
    b.push(pending(3))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [1, 2, 3]
    b.push(pending(4))
    alone = b.next_batch(0)  # the hold is over
    assert isinstance(alone, list) and [p.request.id for p in alone] == [4]


def test_the_delay_hooks_read_the_environment_as_tritons_atoi(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, count in (("3", 3), ("12abc", 12), (" 4", 4), ("x", 0), ("-2", 0), ("", 0)):
        monkeypatch.setenv(DELAY_ENV, value)
        monkeypatch.setenv(BACKLOG_DELAY_ENV, value)
        assert (held_until("m"), backlog_held_until("m")) == (count, count), value
    monkeypatch.delenv(DELAY_ENV)
    assert held_until("m") == 0
