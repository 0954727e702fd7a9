"""Priority levels, queue policies and response ordering, without sockets."""

from __future__ import annotations

import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.router.pending import Pending, shape_key
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.scheduling.ordering import ResponseOrder
from conveyor.router.scheduling.priority_queues import PriorityQueues
from conveyor.router.scheduling.queue_policy import QueuePolicy, SchedulingPolicy
from conveyor.router.spec.queue_policy import scheduling_problem

LEVEL = "unit"

MS = 1_000_000


def request(rid: int, at: int = 0, rows: int = 1, deadline: int = 0, **params: int) -> Pending:
    req = m.InferRequest(rid, "m", "", [m.TensorRef("A", "FP32", [rows, 4], "r", 0, 16 * rows)], [],
                         parameters=dict(params), deadline_ns=deadline)
    return Pending(b"i", req, at, rows, shape_key(req, True))


def policy_of(text: str) -> SchedulingPolicy:
    return SchedulingPolicy.from_config(parse_text(f"max_batch_size: 8\ndynamic_batching {{ {text} }}"))


def ids(queues: PriorityQueues) -> list[int]:
    return [p.request.id for p in queues.in_order()]


def test_higher_priority_is_served_first_fifo_within_a_level() -> None:
    q = PriorityQueues(policy_of("priority_levels: 3 default_priority_level: 2"), cap=0)
    q.push(request(1))  # default level 2
    q.push(request(2, priority=3))
    q.push(request(3, priority=1))
    q.push(request(4, priority=2))
    q.push(request(5, priority=1))
    assert ids(q) == [3, 5, 1, 4, 2]
    assert [q.pop().request.id for _ in range(5)] == [3, 5, 1, 4, 2]


def test_priority_zero_or_out_of_range_means_the_default_level() -> None:
    # Triton does the same (InferenceRequest::SetPriority): no error.
    policy = policy_of("priority_levels: 2 default_priority_level: 2")
    assert policy.level_of(0) == 2 and policy.level_of(7) == 2 and policy.level_of(None) == 2
    assert policy.level_of(1) == 1 and policy.level_of(True) == 2


def test_as_many_levels_as_a_uint64_holds_cost_only_the_levels_in_use() -> None:
    # Triton's qa/L0_model_queue test_max_priority_levels: 2^64 - 1 levels, the default one past 2^32.
    q = PriorityQueues(policy_of(f"priority_levels: {2**64 - 1} default_priority_level: {2**32}"), cap=0)
    q.push(request(1))  # level 2^32
    q.push(request(2, priority=2**63))
    q.push(request(3, priority=1))
    assert ids(q) == [3, 1, 2]
    assert len(q.levels) == 3
    assert [q.pop().request.id for _ in range(3)] == [3, 1, 2]
    assert [level.level for level in q.levels] == [2**32]  # the levels made for requests went with them


def test_level_max_queue_size_refuses_at_once_with_tritons_words() -> None:
    q = PriorityQueues(policy_of("""priority_levels: 2 default_priority_level: 2
        priority_queue_policy { key: 2 value: { max_queue_size: 1 } }"""), cap=0)
    q.push(request(1))
    with pytest.raises(ConveyorError) as exc:
        q.push(request(2, priority=2))
    assert exc.value.status is Status.UNAVAILABLE and "Exceeds maximum queue size" in exc.value.message
    q.push(request(3, priority=1))  # level 1 has no limit
    assert len(q) == 2


def test_server_wide_cap_applies_without_a_configured_limit() -> None:
    q = PriorityQueues(SchedulingPolicy(), cap=2)
    q.push(request(1))
    q.push(request(2))
    with pytest.raises(ConveyorError) as exc:
        q.push(request(3))
    assert exc.value.status is Status.UNAVAILABLE and "--max-queue-size" in exc.value.message
    q.pop()
    q.push(request(4))  # room again


def test_reject_fails_a_timed_out_request() -> None:
    q = PriorityQueues(policy_of("default_queue_policy { default_timeout_microseconds: 1000 }"), cap=0)
    q.push(request(1, at=0))
    q.push(request(2, at=5 * MS))
    assert q.next_expiry_ns == 1 * MS
    assert q.take_expired(MS - 1) == []
    gone = q.take_expired(MS)
    assert [(p.request.id, e.status, e.message) for p, e in gone] == [
        (1, Status.UNAVAILABLE, "Request timeout expired")
    ]
    assert ids(q) == [2] and q.next_expiry_ns == 6 * MS


def test_delay_moves_a_timed_out_request_behind_its_level() -> None:
    q = PriorityQueues(policy_of("""priority_levels: 2 default_priority_level: 1
        default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 }"""), cap=0)
    q.push(request(1, at=0))
    q.push(request(2, at=5 * MS, priority=2))
    q.push(request(3, at=5 * MS))
    assert q.take_expired(2 * MS) == []  # delayed, not failed
    assert ids(q) == [3, 1, 2]  # behind level 1's waiting request, still ahead of level 2
    assert len(q) == 3 and q.next_expiry_ns == 6 * MS
    assert q.take_expired(7 * MS) == []
    assert ids(q) == [1, 3, 2] and q.next_expiry_ns == 0  # in the order they timed out


def test_timeout_parameter_only_shortens_the_default_when_allowed() -> None:
    allowed = QueuePolicy(default_timeout_ns=10 * MS, allow_timeout_override=True)
    assert allowed.timeout_ns(1000) == 1 * MS
    assert allowed.timeout_ns(50_000) == 10 * MS  # can't lengthen it
    assert allowed.timeout_ns(None) == 10 * MS
    assert QueuePolicy(default_timeout_ns=10 * MS).timeout_ns(1000) == 10 * MS
    assert QueuePolicy(allow_timeout_override=True).timeout_ns(1000) == 0  # no default timeout: none


def test_client_deadline_is_never_delayed() -> None:
    q = PriorityQueues(policy_of("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 }"),
                       cap=0)
    q.push(request(1, at=0, deadline=3 * MS))
    assert q.take_expired(2 * MS) == [] and len(q) == 1  # delayed by its policy
    gone = q.take_expired(3 * MS)
    assert [(p.request.id, e.status) for p, e in gone] == [(1, Status.DEADLINE_EXCEEDED)] and len(q) == 0


def test_cancel_finds_delayed_requests_too() -> None:
    q = PriorityQueues(policy_of("default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1 }"),
                       cap=0)
    q.push(request(1, at=0))
    q.take_expired(MS)
    assert q.remove(b"i", 1) is not None and len(q) == 0 and q.next_expiry_ns == 0


def test_batches_follow_priority_and_wait_for_the_oldest_member() -> None:
    b = DynamicBatcher(4, [4], 10 * MS, enabled=True, policy=policy_of("priority_levels: 2 default_priority_level: 2"))
    b.push(request(1, at=0))
    b.push(request(2, at=1 * MS))
    b.push(request(3, at=2 * MS, rows=2, priority=1))
    batch = b.next_batch(3 * MS)
    assert isinstance(batch, list) and [p.request.id for p in batch] == [3, 1, 2]
    b.push(request(4, at=4 * MS, priority=1))
    b.push(request(5, at=3 * MS))
    assert b.next_batch(5 * MS) == 13 * MS  # the delay counts from the oldest request in the batch


def test_the_largest_preferred_size_that_can_be_formed_leaves_at_once() -> None:
    b = DynamicBatcher(8, [2, 4], 10 * MS, enabled=True)
    for i in range(3):
        b.push(request(i))
    batch = b.next_batch(0)
    assert isinstance(batch, list) and len(batch) == 2
    assert b.next_batch(0) == 10 * MS  # one left, no preferred size: wait


def test_after_the_delay_everything_that_fits_leaves() -> None:
    b = DynamicBatcher(8, [2], 10 * MS, enabled=True)
    for i in range(5):
        b.push(request(i))
    batch = b.next_batch(10 * MS)
    assert isinstance(batch, list) and len(batch) == 5


def test_responses_leave_in_dispatch_order() -> None:
    order = ResponseOrder()
    first, second, third = order.ticket(), order.ticket(), order.ticket()
    assert order.release(third, b"c", b"3") == []
    assert order.release(second, b"b", b"2") == []
    assert order.held == 2
    assert order.release(first, b"a", b"1") == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    assert order.held == 0


@pytest.mark.parametrize(
    ("dynamic_batching", "problem"),
    [
        ("preferred_batch_size: [ 16 ]", "dynamic batching preferred size must be <= max batch size for m"),
        ("priority_levels: 2", "default priority level must be in range [1, 2] for m"),
        ("priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value: { } }",
         "priority queue policy must have priority level in range [1, 2] for m"),
        ("preserve_ordering: true priority_levels: 2 default_priority_level: 1",
         "Only one priority level is allowed when 'preserve_ordering' is true for m"),
        ("preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 }",
         "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
        ("priority_levels: 2 default_priority_level: 2 preferred_batch_size: [ 2, 8 ]", ""),
    ],
)
def test_config_checks_match_tritons(dynamic_batching: str, problem: str) -> None:
    config = parse_text(f'name: "m"\nmax_batch_size: 8\ndynamic_batching {{ {dynamic_batching} }}')
    assert scheduling_problem(config) == problem
