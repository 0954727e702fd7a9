"""Workers joining, lost and leaving, as the router core sees them: placement, the
requests a lost worker had, a drained worker let go (a real ``Router``, in-process sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import Status
from conveyor.router.models import InstanceState
from tests.support.router_core import RouterCore, write_model

LEVEL = "unit"

W1, W2 = b"worker-1", b"worker-2"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[RouterCore]:
    write_model(tmp_path, "pair", instances=2)
    write_model(tmp_path, "everywhere", instances=0)
    write_model(tmp_path, "stream", extra="model_transaction_policy { decoupled: true }")
    c = RouterCore(tmp_path)
    yield c
    c.close()


def _instances(core: RouterCore, model: str) -> list[tuple[InstanceState, bytes | None]]:
    return [(i.state, i.worker) for i in core.router.registry.models[model].versions[1].instances]


def test_instances_spread_over_the_workers_that_join(core: RouterCore) -> None:
    loads = core.join(W1)
    assert sorted(load.model for load in loads) == ["everywhere", "pair", "pair", "stream"]
    for load in loads:
        core.from_worker(W1, m.ModelLoaded(load.model, load.version, load.instance))
    # Only the model without an instance_group gets one more instance, on the new worker.
    assert [load.model for load in core.join(W2)] == ["everywhere"]
    assert _instances(core, "pair") == [(InstanceState.READY, W1)] * 2
    assert sorted(w or b"" for _, w in _instances(core, "everywhere")) == [W1, W2]


def test_a_lost_worker_fails_exactly_its_requests(core: RouterCore) -> None:
    core.serve(W1)
    core.serve(W2)  # one instance of "everywhere" on each
    first, second = core.infer("everywhere"), core.infer("everywhere")
    [on_w1], [on_w2] = core.batches(W1), core.batches(W2)
    lost = {item.id for item in on_w1.items}
    assert lost | {item.id for item in on_w2.items} == {first, second}

    core.router.membership.drop(W1, "it stopped answering")
    core.turn()
    failed = core.responses()
    assert {r.id for r in failed} == lost
    assert all(r.error is not None and r.error.status == int(Status.UNAVAILABLE)
               and "the worker running this request exited" in r.error.message for r in failed)
    assert len(core.ledger) == 1 and core.ledger.batches_on(W1) == []
    # Its "pair" instances go to the worker left; the request there is untouched and answered.
    assert sorted(msg.model for msg in core.to_worker(W2) if isinstance(msg, m.LoadModel)) == ["pair", "pair", "stream"]
    core.answer(W2, on_w2)
    assert [r.error for r in core.responses()] == [None]
    assert not core.ledger.busy


def test_a_lost_worker_ends_each_open_decoupled_request_once(core: RouterCore) -> None:
    core.serve(W1)
    rid = core.infer("stream")
    [batch] = core.batches(W1)
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=False))
    core.answer(W1, batch)  # execute returned; the request streams on
    assert [(r.id, r.final) for r in core.responses()] == [(rid, False)]
    assert len(core.ledger) == 1

    core.router.membership.drop(W1, "it exited")
    core.turn()
    [end] = core.responses()
    assert end.id == rid and end.final and end.error is not None
    assert not core.ledger.busy


def test_a_decoupled_batch_is_forgotten_after_its_last_final_response(core: RouterCore) -> None:
    core.serve(W1)
    rid = core.infer("stream")
    [batch] = core.batches(W1)
    core.answer(W1, batch)
    assert core.ledger.batch(batch.batch) is not None  # its request has had no final response yet
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))
    assert [(r.id, r.final) for r in core.responses()] == [(rid, True)]
    assert not core.ledger.busy
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))  # a late one: dropped
    assert core.responses() == []


def test_a_leaving_worker_goes_once_its_replacement_serves_and_its_batch_is_answered(core: RouterCore) -> None:
    core.serve(W1)
    core.serve(W2)
    rid = core.infer("stream")  # its one instance is on the first worker
    [batch] = core.batches(W1)
    core.from_worker(W1, m.WorkerLeaving("scaled down"))
    replacements = [msg for msg in core.to_worker(W2) if isinstance(msg, m.LoadModel)]
    assert sorted(load.model for load in replacements) == ["pair", "pair", "stream"]
    for load in replacements:
        core.from_worker(W2, m.ModelLoaded(load.model, load.version, load.instance))
    assert core.ledger.runs_on(W1)
    assert not any(isinstance(msg, m.LeaveGranted) for msg in core.to_worker(W1))

    core.answer(W1, batch)
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))
    assert [r.id for r in core.responses()] == [rid]
    assert any(isinstance(msg, m.LeaveGranted) for msg in core.to_worker(W1))
    assert W1 not in core.router.pool.workers and not core.ledger.busy


def test_a_request_answered_after_execute_stays_open_until_its_response(core: RouterCore) -> None:
    """A Python model in the default mode may answer after execute returned (its response
    sender): the worker marks that item pending, and the router waits for its ItemResponse."""
    core.serve(W1)
    core.serve(W2)
    first, second = core.infer("everywhere"), core.infer("everywhere")
    [on_w1], [on_w2] = core.batches(W1), core.batches(W2)
    late_id = on_w1.items[0].id
    core.from_worker(W1, m.BatchResult(on_w1.batch, [m.ItemResult(late_id, pending=True)], 1, 1, 1))
    assert core.responses() == [] and core.ledger.batch(on_w1.batch) is not None
    core.from_worker(W1, m.ItemResponse(on_w1.batch, 0, final=True))
    assert [(r.id, r.final, r.error) for r in core.responses()] == [(late_id, True, None)]
    assert core.ledger.batch(on_w1.batch) is None
    core.answer(W2, on_w2)
    assert [r.id for r in core.responses()] == [({first, second} - {late_id}).pop()]
    assert not core.ledger.busy


def test_instances_carry_tritons_names(tmp_path: Path) -> None:
    groups = 'instance_group [ { count: 2 kind: KIND_CPU }, { name: "g" count: 1 } ]'
    write_model(tmp_path, "named", instances=0, extra=groups)
    write_model(tmp_path, "plain", instances=0)
    c = RouterCore(tmp_path)
    try:
        loads = c.join(W1) + c.join(W2)
        assert sorted((load.model, load.name) for load in loads) == [
            ("named", "g_0"), ("named", "named_0_0"), ("named", "named_0_1"),
            ("plain", "plain_0"), ("plain", "plain_1"),
        ]
    finally:
        c.close()


def test_a_worker_lost_twice_while_loading_an_instance_fails_its_load(core: RouterCore) -> None:
    """Once, its instances are placed again (the worker may have died of another model loading
    beside them); the second time, an instance still loading there fails to load."""
    assert [load for load in core.join(W1) if load.model == "pair"]
    core.router.membership.drop(W1, "it was killed")
    core.turn()
    version = core.router.registry.models["pair"].versions[1]
    assert [i.state for i in version.instances] == [InstanceState.UNPLACED] * 2
    assert [load for load in core.join(W2) if load.model == "pair"]
    core.router.membership.drop(W2, "it was killed")
    core.turn()
    assert [i.state for i in version.instances] == [InstanceState.FAILED] * 2
    assert "the worker process loading model instance 'pair_0_0' exited (it was killed)" in version.instances[0].error
