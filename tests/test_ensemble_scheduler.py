"""The ensemble scheduler on its own: which step starts when, and who holds which
block (release flags in real shared memory), without a server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from conveyor.proto import messages as m
from conveyor.proto.model_config import parse_text
from conveyor.router.batcher import DynamicBatcher
from conveyor.router.ensemble import EnsembleScheduler
from conveyor.router.ensemble_plan import build_plan
from conveyor.router.ensemble_state import EnsembleVersion
from conveyor.router.held_blocks import HeldBlocks
from conveyor.router.loans import Loans
from conveyor.router.stats import ModelStats
from conveyor.shm.arena import HELD, OUTSTANDING, RELEASED, Arena
from conveyor.shm.naming import segment_name

DIAMOND = '''
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "MID" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "first" input_map { key: "X" value: "A" } output_map { key: "Y" value: "MID" } },
  { model_name: "left" input_map { key: "X" value: "MID" } output_map { key: "Y" value: "l" } },
  { model_name: "right" input_map { key: "X" value: "MID" } output_map { key: "Y" value: "r" } },
  { model_name: "last" input_map [ { key: "X" value: "l" }, { key: "Z" value: "r" } ]
    output_map { key: "Y" value: "OUT" } }
] }
'''


@dataclass
class Harness:
    worker: Arena
    loans: Loans
    scheduler: EnsembleScheduler
    state: EnsembleVersion
    submitted: list[m.InferRequest] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    replies: list[m.InferResponse] = field(default_factory=list)
    next_flag: int = 0

    def request(self, *outputs: str) -> None:
        ref = m.TensorRef("A", "INT32", [1, 4], "/ingress", 0, 16)
        self.scheduler.start(b"ingress", m.InferRequest(7, "diamond", "", [ref], [m.OutputSpec(o) for o in outputs]),
                             self.state)

    def step(self, model: str) -> m.InferRequest:
        return next(r for r in self.submitted if r.model == model)

    def answer(self, model: str, error: str = "") -> m.Release:
        """The step's worker answers: its output ``Y`` in a fresh block with its own flag."""
        req = self.step(model)
        flag = m.Release(self.worker.name, self.next_flag)
        self.next_flag += 1
        if error:
            self.scheduler.on_response(m.InferResponse(req.id, model, "1", error=m.ErrorInfo(1, error)))
        else:
            out = m.TensorRef("Y", "INT32", [1, 4], self.worker.name, 1024 + 64 * flag.offset, 16)
            self.scheduler.on_response(m.InferResponse(req.id, model, "1", [out], release=[flag]))
        return flag

    def flag(self, release: m.Release) -> int:
        arena = self.worker if release.region == self.worker.name else self.loans._open()
        return int(arena.array[release.offset])


@pytest.fixture()
def harness() -> Iterator[Harness]:
    group = f"u{os.getpid()}"
    worker = Arena(segment_name(group, "worker"), 1 << 16)
    holds = HeldBlocks()
    loans = Loans(segment_name(group, "router"), holds, slots=64)
    config = parse_text(DIAMOND)
    state = EnsembleVersion("diamond", 1, "", config, ModelStats("diamond", "1"), DynamicBatcher(0, [], 0, False),
                            plan=build_plan(config))
    h = Harness(worker, loans, None, state)  # type: ignore[arg-type]
    h.scheduler = EnsembleScheduler(lambda req, stats: h.submitted.append(req), h.cancelled.append,
                                    lambda identity, resp: h.replies.append(resp), holds, loans, lambda: 1)
    yield h
    loans.close()
    worker.close()


def test_steps_start_when_their_inputs_exist(harness: Harness) -> None:
    harness.request("OUT")
    assert [r.model for r in harness.submitted] == ["first"]
    first = harness.step("first")
    assert [(t.name, t.region) for t in first.inputs] == [("X", "/ingress")]  # renamed, not moved
    mid = harness.answer("first")
    assert sorted(r.model for r in harness.submitted) == ["first", "left", "right"]  # side by side
    assert harness.step("left").inputs[0].region == harness.worker.name  # zero copy: the worker's block
    assert harness.flag(mid) == HELD
    left = harness.answer("left")
    assert harness.flag(mid) == HELD  # "right" still reads it
    right = harness.answer("right")
    assert harness.flag(mid) == RELEASED  # nobody needs it any more: the worker may reuse it
    assert [r.model for r in harness.submitted][-1] == "last"
    assert harness.flag(left) == HELD and harness.flag(right) == HELD
    out = harness.answer("last")
    assert harness.flag(left) == RELEASED and harness.flag(right) == RELEASED
    (reply,) = harness.replies
    assert reply.error is None and [t.name for t in reply.outputs] == ["OUT"]
    (loan,) = reply.release
    assert harness.flag(out) == HELD and harness.flag(loan) == OUTSTANDING
    harness.loans._open().array[loan.offset] = RELEASED  # the ingress copied the response out
    assert harness.loans.collect() == 1
    assert harness.flag(out) == RELEASED
    assert harness.state.stats.success.count == 1


def test_an_intermediate_that_is_also_an_output_is_lent(harness: Harness) -> None:
    harness.request("OUT", "MID")
    mid = harness.answer("first")
    harness.answer("left")
    harness.answer("right")
    harness.answer("last")
    assert harness.flag(mid) == HELD  # the response still shows it
    (loan,) = harness.replies[0].release
    harness.loans._open().array[loan.offset] = RELEASED
    harness.loans.collect()
    assert harness.flag(mid) == RELEASED


def test_a_failed_step_answers_once_the_running_ones_did(harness: Harness) -> None:
    harness.request("OUT")
    mid = harness.answer("first")
    harness.answer("left", error="left broke")
    assert harness.cancelled == [harness.step("right").id]
    assert harness.replies == []  # "right" may still read the inputs: wait for it
    right = harness.answer("right")
    (reply,) = harness.replies
    assert reply.error is not None and reply.error.message == "left broke"
    assert reply.release == []
    assert harness.flag(mid) == RELEASED and harness.flag(right) == RELEASED
    assert not any(r.model == "last" for r in harness.submitted)
    assert harness.state.stats.fail.count == 1


def test_a_client_cancel_stops_the_run(harness: Harness) -> None:
    harness.request("OUT")
    assert harness.scheduler.cancel(b"ingress", 7)
    assert harness.cancelled == [harness.step("first").id]
    harness.answer("first")
    (reply,) = harness.replies
    assert reply.error is not None and "cancelled" in reply.error.message
    assert len(harness.scheduler) == 0
