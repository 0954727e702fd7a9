"""The router core on one request's way: admitted, queued, dispatched, answered,
cancelled; what the ``Ledger`` holds after each step (a real ``Router``, in-process sockets)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import Status
from conveyor.router.models import DEEP_IN_FLIGHT, DEEP_PIPELINE_DEPTH, PIPELINE_DEPTH
from tests.support.router_core import RouterCore, write_model

LEVEL = "unit"

W1 = b"worker-1"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[RouterCore]:
    write_model(tmp_path, "plain")
    # Requests wait up to 10 s for a fuller batch: one stays queued.
    write_model(tmp_path, "slow_batching", extra="dynamic_batching { max_queue_delay_microseconds: 10000000 }")
    write_model(tmp_path, "timing_out", extra="dynamic_batching { max_queue_delay_microseconds: 10000000 "
                "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1 } }")
    c = RouterCore(tmp_path)
    c.serve(W1)
    yield c
    c.close()


def test_a_request_queued_dispatched_and_answered_leaves_no_trace(core: RouterCore) -> None:
    rid = core.infer("plain")
    [batch] = core.batches(W1)
    assert [item.id for item in batch.items] == [rid]
    assert len(core.ledger) == 1 and core.ledger.busy  # on the worker now
    assert core.ledger.running_at(b"ingress-1", rid) == (batch.batch, 0)

    core.answer(W1, batch)
    [resp] = core.responses()
    assert (resp.id, resp.model, resp.error) == (rid, "plain", None)
    assert len(core.ledger) == 0 and not core.ledger.busy
    assert core.ledger.batch(batch.batch) is None


def test_a_failed_batch_answers_each_request_with_the_workers_error(core: RouterCore) -> None:
    first, second = core.infer("plain"), core.infer("plain")
    batches = core.batches(W1)
    for batch in batches:
        core.answer(W1, batch, m.ErrorInfo(int(Status.INTERNAL), "the model raised"))
    errors = {r.id: r.error for r in core.responses()}
    assert set(errors) == {first, second}
    assert all(e is not None and e.message == "the model raised" for e in errors.values())
    assert not core.ledger.busy


def test_a_late_second_answer_for_a_batch_is_ignored(core: RouterCore) -> None:
    core.infer("plain")
    [batch] = core.batches(W1)
    core.answer(W1, batch)
    core.answer(W1, batch)
    assert len(core.responses()) == 1


def test_a_cancelled_queued_request_is_answered_cancelled_and_never_runs(core: RouterCore) -> None:
    rid = core.infer("slow_batching")
    assert core.batches(W1) == []  # waiting for a fuller batch
    assert len(core.ledger) == 1
    core.from_ingress(m.Cancel(rid))
    [resp] = core.responses()
    assert resp.id == rid and resp.error is not None and resp.error.status == int(Status.CANCELLED)
    assert not core.ledger.busy
    core.router.dispatcher.schedule(core.router.registry.resolve("slow_batching", ""))
    core.turn()
    assert core.batches(W1) == []


def test_a_cancelled_running_request_reaches_its_worker(core: RouterCore) -> None:
    rid = core.infer("plain")
    [batch] = core.batches(W1)
    core.from_ingress(m.Cancel(rid))
    assert [msg for msg in core.to_worker(W1) if isinstance(msg, m.CancelItem)] == [m.CancelItem(batch.batch, 0)]
    assert core.responses() == []  # the worker still answers it
    core.answer(W1, batch, m.ErrorInfo(int(Status.CANCELLED), "cancelled"))
    assert [r.id for r in core.responses()] == [rid]
    assert not core.ledger.busy


def test_a_cancel_for_an_unknown_request_changes_nothing(core: RouterCore) -> None:
    rid = core.infer("plain")
    core.from_ingress(m.Cancel(rid + 100))
    assert len(core.ledger) == 1 and core.responses() == []


def test_a_queue_timeout_answers_the_request_and_forgets_it(core: RouterCore) -> None:
    rid = core.infer("timing_out")  # its queue policy: 1 us, expired by the next look
    core.router.dispatcher.schedule(core.router.registry.resolve("timing_out", ""))
    core.turn()
    [resp] = core.responses()
    assert resp.id == rid and resp.error is not None
    assert not core.ledger.busy and core.batches(W1) == []


def test_an_unknown_model_is_refused_without_being_queued(core: RouterCore) -> None:
    rid = core.infer("missing")
    [resp] = core.responses()
    assert resp.id == rid and resp.error is not None and resp.error.status == int(Status.NOT_FOUND)
    assert not core.ledger.busy


def test_an_instance_takes_more_batches_ahead_only_while_many_requests_are_in_flight(core: RouterCore) -> None:
    """A model without dynamic batching: its worker holds the running batch and the next one; once
    DEEP_IN_FLIGHT requests per instance are queued or running, it may hold DEEP_PIPELINE_DEPTH."""
    ids = [core.infer("plain") for _ in range(DEEP_IN_FLIGHT - 1)]
    assert [b.items[0].id for b in core.batches(W1)] == ids[:PIPELINE_DEPTH]  # the rest wait here
    ids.append(core.infer("plain"))
    sent = core.batches(W1)
    assert [b.items[0].id for b in sent] == ids[PIPELINE_DEPTH:DEEP_PIPELINE_DEPTH]  # the oldest first
    state = core.router.registry.resolve("plain", "")
    assert len(state.batcher) == DEEP_IN_FLIGHT - DEEP_PIPELINE_DEPTH
    assert state.instances[0].running == DEEP_PIPELINE_DEPTH
