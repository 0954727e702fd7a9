"""SequenceBatcher (router), SequenceConfig and SequenceSlots (worker), without sockets."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.proto.sequence_config import SequenceConfig, sequence_batched, sequence_problem
from conveyor.router.models import Instance, InstanceState
from conveyor.router.pending import Pending, shape_key
from conveyor.router.scheduling.sequences import SequenceBatcher
from conveyor.workers.backends.base import RequestItem
from conveyor.workers.sequence_state import SequenceSlots

LEVEL = "unit"

IDLE_NS = 1_000_000


def config(sequence_batching: str, max_batch_size: int = 2) -> Any:
    return parse_text(f'name: "m" max_batch_size: {max_batch_size} sequence_batching {{ {sequence_batching} }}')


def batcher(sequence_batching: str = "", max_batch_size: int = 2, instances: int = 1) -> SequenceBatcher:
    b = SequenceBatcher("m", SequenceConfig.from_config(config(
        f"max_sequence_idle_microseconds: {IDLE_NS // 1000} {sequence_batching}", max_batch_size)))
    b.sync([instance(b"w%d" % i) for i in range(instances)], 0)
    return b


def instance(worker: bytes) -> Instance:
    return Instance(cast(Any, None), 0, "cpu", InstanceState.READY, worker)


_ids = iter(range(1, 10**6))


def request(sid: int | str | None, start: bool = False, end: bool = False, at: int = 0, width: int = 1,
            deadline: int = 0, timeout_us: int = 0) -> Pending:
    params: dict[str, Any] = {} if sid is None else {"sequence_id": sid, "sequence_start": start, "sequence_end": end}
    if timeout_us:
        params["timeout"] = timeout_us
    req = m.InferRequest(next(_ids), "m", "", [m.TensorRef("INPUT", "INT32", [1, width], "r", 0, 4 * width)], [],
                         params, deadline_ns=deadline)
    return Pending(b"i", req, at, 1, shape_key(req, True))


def steps(batch: object) -> list[tuple[Any, int, bool, bool]]:
    assert isinstance(batch, list)
    return [(p.sequence.correlation_id, p.sequence.slot, p.sequence.start, p.sequence.end) for p in batch]


def only_home(b: SequenceBatcher) -> Any:
    return next(b.homes_to_run())


def test_direct_batch_holds_the_next_request_of_each_slot_in_slot_order() -> None:
    b = batcher()
    b.push(request(1, start=True))
    b.push(request(1))
    b.push(request(2, start=True))
    home = only_home(b)
    assert steps(b.next_batch(home, 0)) == [(1, 0, True, False), (2, 1, True, False)]
    assert steps(b.next_batch(home, 0)) == [(1, 0, False, False)]
    assert b.next_batch(home, 0) is None and len(b) == 0


@pytest.mark.parametrize(("params", "message"), [
    ({"sequence_id": 5}, "inference request for sequence 5 to model 'm' must specify the START flag on the first "
                         "request of the sequence"),
    ({}, "inference request to model 'm' must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 0, "sequence_start": True}, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": "", "sequence_start": True}, "must specify a non-zero or non-empty correlation ID"),
])
def test_requests_that_cannot_belong_to_a_sequence_are_refused(params: dict[str, Any], message: str) -> None:
    item = request(None)
    item.request.parameters = params
    with pytest.raises(ConveyorError) as exc:
        batcher().push(item)
    assert exc.value.status is Status.INVALID_ARG and message in exc.value.message


def test_a_negative_grpc_int64_id_is_the_uint64_it_encodes() -> None:
    b = batcher()
    b.push(request(2**64 - 1, start=True))
    b.push(request(-1, end=True))  # the same sequence
    home = only_home(b)
    assert steps(b.next_batch(home, 0)) == [(2**64 - 1, 0, True, False)]
    assert steps(b.next_batch(home, 0)) == [(2**64 - 1, 0, False, True)]


def test_end_closes_the_sequence_and_its_slot_goes_to_the_backlog() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True))
    b.push(request(2, start=True))  # no free slot: backlog
    b.push(request(2, end=True))
    b.push(request(1, end=True))
    with pytest.raises(ConveyorError):
        b.push(request(1))  # closed at once, though its END has not run yet
    home = only_home(b)
    assert steps(b.next_batch(home, 0)) == [(1, 0, True, False)]
    assert steps(b.next_batch(home, 0)) == [(1, 0, False, True)]
    assert steps(b.next_batch(home, 0)) == [(2, 0, True, False)]
    assert steps(b.next_batch(home, 0)) == [(2, 0, False, True)]
    assert b.next_batch(home, 0) is None


def test_a_new_sequence_goes_to_the_instance_with_most_free_slots() -> None:
    b = batcher(instances=2)
    for sid in (1, 2, 3):
        b.push(request(sid, start=True))
    homes = list(b.homes_to_run())
    assert [len(steps(b.next_batch(h, 0))) for h in homes] == [2, 1]


def test_an_idle_sequence_is_ended_and_its_slot_released() -> None:
    b = batcher()
    b.push(request(1, start=True, at=0))
    home = only_home(b)
    b.next_batch(home, 100)  # the idle clock restarts when the request leaves
    assert b.next_expiry_ns == 100 + IDLE_NS
    assert b.take_expired(99 + IDLE_NS) == [] and b.take_released() == []
    assert b.take_expired(100 + IDLE_NS) == []
    assert b.take_released() == [(home.instance, [0])]
    with pytest.raises(ConveyorError) as exc:
        b.push(request(1, at=200 + IDLE_NS))
    assert "must specify the START flag" in exc.value.message
    assert b.next_expiry_ns == 0  # nothing left to watch


def test_a_sequence_with_requests_queued_is_not_idle() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True))
    b.push(request(2, start=True))  # waits in the backlog for longer than the idle time
    home = only_home(b)
    b.next_batch(home, 0)
    assert b.take_expired(IDLE_NS) == []  # 1 idles out, 2 takes its slot
    assert steps(b.next_batch(home, IDLE_NS)) == [(2, 0, True, False)]


def test_a_lost_instance_fails_its_queued_requests_and_later_ones_until_start() -> None:
    b = batcher(instances=1)
    b.push(request(1, start=True))
    b.push(request(1))
    inst = only_home(b).instance
    b.next_batch(only_home(b), 0)
    inst.worker = b"w-restarted"  # the instance moved to another worker: its state is gone
    gone = b.sync([inst], 5)
    assert [(e.status, "went away" in e.message) for _, e in gone] == [(Status.UNAVAILABLE, True)]
    assert len(b) == 0
    with pytest.raises(ConveyorError) as exc:
        b.push(request(1))
    assert exc.value.status is Status.UNAVAILABLE and "was lost" in exc.value.message
    b.push(request(1, start=True))
    assert steps(b.next_batch(only_home(b), 0)) == [(1, 0, True, False)]


def test_an_instance_that_left_loses_its_sequences() -> None:
    b = batcher(instances=2)
    for sid in (1, 2):
        b.push(request(sid, start=True))
    keep = list(b.homes_to_run())[1].instance
    gone = b.sync([keep], 0)
    assert [p.sequence.correlation_id for p, _ in gone] == [1]  # type: ignore[union-attr]
    assert steps(b.next_batch(only_home(b), 0)) == [(2, 0, True, False)]


def test_direct_waits_for_the_minimum_slot_utilization_up_to_the_delay() -> None:
    b = batcher("direct { max_queue_delay_microseconds: 100 minimum_slot_utilization: 1.0 }")
    b.push(request(1, start=True, at=0))
    home = only_home(b)
    assert b.next_batch(home, 10) == 100_000
    b.push(request(2, start=True, at=20))
    assert steps(b.next_batch(home, 30)) == [(1, 0, True, False), (2, 1, True, False)]
    b.push(request(1, at=40))
    assert steps(b.next_batch(home, 100_040)) == [(1, 0, False, False)]


def test_oldest_batches_the_oldest_heads_with_preferred_sizes_and_delay() -> None:
    b = batcher("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100 }",
                max_batch_size=3)
    for sid, at in ((1, 30), (2, 10), (3, 20)):
        b.push(request(sid, start=True, at=at))
    home = only_home(b)
    assert steps(b.next_batch(home, 40)) == [(2, 1, True, False), (3, 2, True, False)]  # preferred 2, by age
    assert b.next_batch(home, 40) == 100_030  # one left: it waits for company
    b.push(request(2, at=50))
    b.push(request(3, at=60))
    assert [s[0] for s in steps(b.next_batch(home, 70))] == [1, 2]


def test_oldest_takes_one_request_per_sequence_and_equal_shapes() -> None:
    b = batcher("oldest { max_candidate_sequences: 4 }", max_batch_size=4)
    b.push(request(1, start=True, at=0))
    b.push(request(1, at=1))
    b.push(request(2, start=True, at=2, width=3))
    home = only_home(b)
    # Sequence 2's head has another shape: it cannot join; sequence 1's second request must wait its turn.
    assert steps(b.next_batch(home, 5)) == [(1, 0, True, False)]
    assert steps(b.next_batch(home, 5)) == [(1, 0, False, False)]
    assert steps(b.next_batch(home, 5)) == [(2, 1, True, False)]


def test_deadline_passes_in_the_sequence_queue() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True))
    b.push(request(2, start=True, deadline=500))  # in the backlog
    b.next_batch(only_home(b), 0)
    gone = b.take_expired(500)
    assert [e.status for _, e in gone] == [Status.DEADLINE_EXCEEDED] and len(b) == 0


def test_a_backlog_sequence_expires_at_its_earliest_request_timeout_as_tritons() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True, timeout_us=1))  # has a slot: its timeout never applies
    b.push(request(2, start=True, at=1_000, timeout_us=5))  # backlog: expires at 6_000
    b.push(request(2, at=2_000, timeout_us=3))  # 5_000: the earliest
    b.push(request(2, at=2_500, timeout_us=100))
    assert b.next_expiry_ns == 5_000
    assert b.take_expired(4_999) == []
    gone = b.take_expired(5_000)
    assert [(e.status, e.message) for _, e in gone] == \
        [(Status.UNAVAILABLE, "timeout of the corresponding sequence has been expired")] * 3
    assert len(b) == 1  # sequence 1's request, whose timeout passed long ago, still runs
    with pytest.raises(ConveyorError, match="must specify the START flag"):
        b.push(request(2, end=True, at=6_000))  # the sequence is gone
    assert steps(b.next_batch(only_home(b), 6_000)) == [(1, 0, True, False)]


def test_a_backlog_sequence_that_gets_a_slot_no_longer_expires() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True, end=True))
    b.push(request(2, start=True, timeout_us=5))
    home = only_home(b)
    assert steps(b.next_batch(home, 0)) == [(1, 0, True, True)]  # its END frees the slot for 2
    b.push(request(2, at=1_000, timeout_us=1))
    assert b.take_expired(10_000) == [] and len(b) == 2
    assert steps(b.next_batch(home, 10_000)) == [(2, 0, True, False)]


def test_cancelling_a_queued_request_cancels_its_sequence_and_frees_its_slot_as_tritons() -> None:
    b = batcher(max_batch_size=1)
    b.push(request(1, start=True))
    home = only_home(b)
    assert steps(b.next_batch(home, 0)) == [(1, 0, True, False)]  # running
    queued = [request(1), request(1)]
    for item in queued:
        b.push(item)
    b.push(request(2, start=True))  # backlog
    start3 = request(3, start=True)
    b.push(start3)
    assert b.remove_sequence(b"i", queued[1].request.id) == [queued[1], queued[0]]
    assert b.take_released() == [(home.instance, [0])]  # the worker drops the sequence's state
    with pytest.raises(ConveyorError, match="must specify the START flag"):
        b.push(request(1))
    assert steps(b.next_batch(home, 0)) == [(2, 0, True, False)]  # the slot went to the backlog
    waiting = request(3)
    b.push(waiting)
    assert b.remove_sequence(b"i", waiting.request.id) == [waiting, start3]  # from the backlog
    assert len(b) == 0 and b.remove_sequence(b"i", 12345) == []


def test_cancel_removes_a_queued_request() -> None:
    b = batcher()
    b.push(request(1, start=True))
    item = request(1)
    b.push(item)
    assert b.remove(b"i", item.request.id) is item and len(b) == 1


# --- config ---------------------------------------------------------------------------


def test_defaults_are_direct_with_one_second_idle_and_max_batch_size_slots() -> None:
    seq = SequenceConfig.from_config(config("", max_batch_size=8))
    assert (seq.oldest, seq.max_idle_ns, seq.slots) == (False, 1_000_000_000, 8)
    assert SequenceConfig.from_config(config("oldest { max_candidate_sequences: 3 }")).slots == 3
    assert SequenceConfig.from_config(config("", max_batch_size=0)).slots == 1


@pytest.mark.parametrize(("block", "problem"), [
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]', "exactly one of"),
    ('control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 1 ] } ] } ]',
     "exactly 2"),
    ('control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },'
     '{ name: "B" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]', "multiple"),
    ('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]',
     "unexpected control data type"),
    ('state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ -1 ] '
     'initial_state { data_type: TYPE_INT32 dims: [ -1 ] zero_data: true name: "z" } } ]', "variable dimensions"),
    ('state [ { input_name: "I" output_name: "O" data_type: TYPE_INT32 dims: [ 1 ] '
     'initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "z" } } ]', "does not match"),
    ("oldest { preferred_batch_size: [ 9 ] }", "preferred batch size"),
])
def test_configs_triton_refuses_are_refused(block: str, problem: str) -> None:
    assert problem in sequence_problem(config(block))


def test_an_iterative_sequence_is_each_request_on_its_own() -> None:
    """``iterative_sequence``: loaded (Triton's request-rescheduling QA models use it), and its
    requests are not scheduled as sequences: the Python backend reschedules them itself."""
    iterative = config("iterative_sequence: true")
    assert sequence_problem(iterative) == ""
    assert not sequence_batched(iterative) and sequence_batched(config(""))


# --- worker state -----------------------------------------------------------------------

_STATEFUL = """
control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
                { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
state [ { input_name: "STATE" output_name: "NEW_STATE" data_type: TYPE_FP32 dims: [ 2 ]
          initial_state { data_type: TYPE_FP32 dims: [ 2 ] data_file: "init" name: "from file" } } ]
"""


def item(slot: int, start: bool = False, end: bool = False, sid: int = 7) -> m.BatchItem:
    return m.BatchItem(0, [], [], sequence=m.SequenceStep(slot, start, end, sid))


def test_worker_feeds_the_initial_state_then_each_slots_own(tmp_path: Any) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init").write_bytes(np.array([1.0, 2.0], np.float32).tobytes())
    slots = SequenceSlots(config(_STATEFUL), str(tmp_path))
    inputs: dict[str, Any] = {}
    batch = [item(0, start=True, sid=7), item(1, start=True, sid=8)]
    slots.add_batch_inputs(inputs, batch)
    assert inputs["START"].tolist() == [[True], [True]] and inputs["CORRID"].tolist() == [[7], [8]]
    assert inputs["STATE"].tolist() == [[1.0, 2.0], [1.0, 2.0]]
    assert slots.wanted(["OUT"]) == ["NEW_STATE", "OUT"]
    slots.keep_batch_states(batch, {"NEW_STATE": np.array([[3, 4], [5, 6]], np.float32)})
    inputs = {}
    later = [item(1, sid=8), item(0, end=True, sid=7)]
    slots.add_batch_inputs(inputs, later)
    assert inputs["START"].tolist() == [[False], [False]]
    assert inputs["STATE"].tolist() == [[5.0, 6.0], [3.0, 4.0]]
    slots.keep_batch_states(later, {"NEW_STATE": np.zeros((2, 2), np.float32)})
    assert sorted(slots.slots) == [1]  # slot 0's sequence ended
    slots.forget([1])
    assert slots.slots == {}


def test_a_padded_batch_runs_a_not_ready_row_in_each_empty_slot_and_hands_back_only_its_items(tmp_path: Any) -> None:
    # --sequence-slot-padding: Triton's null requests, in the rows of the empty slots below the highest in use.
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "init").write_bytes(np.array([1.0, 2.0], np.float32).tobytes())
    ready = '{ name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },'
    slots = SequenceSlots(config(_STATEFUL.replace("control_input [ ", "control_input [ " + ready), 4), str(tmp_path))
    batch = [item(1, start=True, sid=8), item(3, start=True, sid=9)]
    inputs: dict[str, Any] = {"INPUT": np.array([[5], [6]], np.int32), "TEXT": np.array([[b"a"], [b"b"]], object)}
    rows = slots.pad_batch(inputs, batch, 4)
    assert rows == [1, 3]
    slots.add_batch_inputs(inputs, batch, rows, 4)
    assert inputs["INPUT"].tolist() == [[0], [5], [0], [6]]
    assert inputs["TEXT"].tolist() == [[b""], [b"a"], [b""], [b"b"]]
    assert inputs["READY"].tolist() == [[0], [1], [0], [1]] and inputs["START"].tolist() == [[False], [True]] * 2
    assert inputs["CORRID"].tolist() == [[0], [8], [0], [9]] and inputs["STATE"].shape == (4, 2)
    out = slots.unpad({"OUT": np.arange(4), "NEW_STATE": np.arange(8, dtype=np.float32).reshape(4, 2)}, rows, 4)
    assert out["OUT"].tolist() == [1, 3]
    slots.keep_batch_states(batch, out)
    assert slots.slots[3]["STATE"].tolist() == [[6.0, 7.0]]
    # Nothing to pad (the items fill the rows), or slots the batch cannot be spread over: it runs as it is.
    assert slots.pad_batch({"INPUT": np.zeros((2, 1))}, batch, 2) is None
    assert slots.pad_batch({"INPUT": np.zeros((2, 1))}, [item(3), item(1)], 4) is None


def test_the_router_asks_for_padding_only_when_told_and_only_for_direct_batches_with_a_gap() -> None:
    for padding, strategy, want in ((True, "", 2), (False, "", 0), (True, "oldest { max_candidate_sequences: 2 }", 0)):
        b = SequenceBatcher("m", SequenceConfig.from_config(config(strategy)), slot_padding=padding)
        b.sync([instance(b"w")], 0)
        b.push(request(1, start=True))
        b.push(request(2, start=True))
        home = only_home(b)
        b.next_batch(home, 0)  # both slots' first requests
        b.push(request(2))
        batch = b.next_batch(home, 0)
        assert isinstance(batch, list) and b.padded_rows(batch) == want
    # A higher slot whose request has another shape waits for the next batch, and still counts in this one's rows.
    b = SequenceBatcher("m", SequenceConfig.from_config(config("")), slot_padding=True)
    b.sync([instance(b"w")], 0)
    b.push(request(1, start=True))
    b.push(request(2, start=True, width=3))
    batch = b.next_batch(only_home(b), 0)
    assert steps(batch) == [(1, 0, True, False)] and isinstance(batch, list) and b.padded_rows(batch) == 2


def test_worker_refuses_a_missing_initial_state_file(tmp_path: Any) -> None:
    with pytest.raises(ConveyorError) as exc:
        SequenceSlots(config(_STATEFUL), str(tmp_path))
    assert exc.value.status is Status.UNAVAILABLE and "data_file" in exc.value.message


def test_worker_controls_and_state_of_a_model_without_batching(tmp_path: Any) -> None:
    slots = SequenceSlots(config(_STATEFUL.replace('data_file: "init"', "zero_data: true"), max_batch_size=0),
                          str(tmp_path))
    inputs: dict[str, Any] = {}
    slots.add_batch_inputs(inputs, [item(0, start=True)])
    assert inputs["START"].shape == (1,) and inputs["CORRID"].shape == (1,)
    assert inputs["STATE"].tolist() == [0.0, 0.0]  # no batch dimension
    slots.keep_batch_states([item(0, start=True)], {"NEW_STATE": np.array([1, 2], np.float32)})
    inputs = {}
    slots.add_batch_inputs(inputs, [item(0)])
    assert inputs["STATE"].tolist() == [1.0, 2.0]



def test_worker_sequence_of_a_decoupled_request_backend(tmp_path: Any) -> None:
    """A decoupled request backend answers through its streams and returns no outcomes: the
    requests get their steps and controls, and an END slot still lets its state go."""
    slots = SequenceSlots(config(_STATEFUL.replace('data_file: "init"', "zero_data: true")), str(tmp_path))
    first, last = item(0, start=True), item(0, end=True)
    requests = [RequestItem("", {}, [], {}) for _ in range(2)]
    slots.add_request_inputs(requests, [first, last])
    assert [r.sequence for r in requests] == [first.sequence, last.sequence]
    assert requests[0].inputs["START"].tolist() == [[True]]
    slots.slots[0] = {"STATE": np.ones((1, 2), np.float32)}
    slots.keep_request_states([first, last], [])
    assert slots.slots == {}

def test_the_delay_hooks_hold_every_slot_until_the_slots_and_the_backlog_hold_their_counts() -> None:
    b = batcher(max_batch_size=1)  # one slot: a second sequence waits in the backlog
    b.held_until, b.backlog_held_until = 2, 1  # Triton's TRITONSERVER_(BACKLOG_)DELAY_SCHEDULER
    b.push(request(1, start=True))
    b.push(request(1))
    assert b.next_batch(only_home(b), 0) is None  # two in the slot, none in the backlog yet
    b.push(request(2, start=True))
    assert steps(b.next_batch(only_home(b), 0)) == [(1, 0, True, False)]
    assert b.held_until == b.backlog_held_until == 0  # as always from then on
