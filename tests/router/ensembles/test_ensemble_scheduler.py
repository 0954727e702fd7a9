"""The ensemble scheduler on its own: which step starts when, and who holds which
block (release flags in real shared memory), without a server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from conveyor.proto import messages as m
from conveyor.proto.model_config import parse_text
from conveyor.router.ensembles.levels import build_levels
from conveyor.router.ensembles.scheduler import EnsembleScheduler
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.ensembles.step_limits import StepLimit
from conveyor.router.observability.stats import ModelStats
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.shared_memory.held_blocks import HeldBlocks
from conveyor.router.shared_memory.loans import Loans
from conveyor.router.spec.ensemble_plan import build_plan
from conveyor.shm.arena import HELD, OUTSTANDING, RELEASED, Arena
from conveyor.shm.naming import segment_name

LEVEL = "unit"

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
    assert reply.error is not None and reply.error.message == "in ensemble 'diamond', left broke"
    assert reply.release == []
    assert harness.flag(mid) == RELEASED and harness.flag(right) == RELEASED
    assert not any(r.model == "last" for r in harness.submitted)
    assert harness.state.stats.fail.count == 2  # as Triton counts a failed ensemble (ENSEMBLE_FAILURE_COUNTS)


def test_a_client_cancel_stops_the_run(harness: Harness) -> None:
    harness.request("OUT")
    assert harness.scheduler.cancel(b"ingress", 7)
    assert harness.cancelled == [harness.step("first").id]
    harness.answer("first")
    (reply,) = harness.replies
    assert reply.error is not None and "cancelled" in reply.error.message
    assert len(harness.scheduler) == 0



def test_max_inflight_requests_holds_a_step_until_its_step_has_a_slot(harness: Harness) -> None:
    """A limit of 1: a second request's first step waits for the first request's; a cancelled request's waiting
    step never runs (its run ends at once), and the slot goes to the next one waiting."""
    harness.state.step_limits = [StepLimit(1) for _ in range(4)]
    ref = m.TensorRef("A", "INT32", [1, 4], "/ingress", 0, 16)
    for rid in (7, 8, 9):
        harness.scheduler.start(b"ingress", m.InferRequest(rid, "diamond", "", [ref], [m.OutputSpec("OUT")]),
                                harness.state)
    assert [r.model for r in harness.submitted] == ["first"]  # requests 8 and 9 wait for the slot
    assert harness.scheduler.cancel(b"ingress", 8)
    (cancelled,) = harness.replies
    assert cancelled.id == 8 and cancelled.error is not None and "cancelled" in cancelled.error.message
    assert harness.cancelled == []  # nothing of it ran: nothing to stop
    harness.answer("first")  # request 7's: request 9's first step takes the slot
    assert sorted(r.model for r in harness.submitted) == ["first", "first", "left", "right"]
    assert harness.state.step_limits[0].inflight == 1 and not harness.state.step_limits[0].waiting
    assert len(harness.scheduler) == 2


# --- a decoupled step: "gen" streams, "post" runs once per response --------------------------

STREAM = '''
name: "stream"
platform: "ensemble"
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "gen" input_map { key: "X" value: "A" } output_map { key: "Y" value: "tok" } },
  { model_name: "post" input_map { key: "X" value: "tok" } output_map { key: "Y" value: "OUT" } }
] }
'''


@pytest.fixture()
def stream() -> Iterator[Harness]:
    group = f"s{os.getpid()}"
    worker = Arena(segment_name(group, "worker"), 1 << 16)
    holds = HeldBlocks()
    loans = Loans(segment_name(group, "router"), holds, slots=64)
    config = parse_text(STREAM)
    plan = build_plan(config)
    state = EnsembleVersion("stream", 1, "", config, ModelStats("stream", "1"), DynamicBatcher(0, [], 0, False),
                            plan=plan, levels=build_levels(plan, [0]))
    h = Harness(worker, loans, None, state)  # type: ignore[arg-type]
    h.scheduler = EnsembleScheduler(lambda req, stats: h.submitted.append(req), h.cancelled.append,
                                    lambda identity, resp: h.replies.append(resp), holds, loans, lambda: 1)
    yield h
    loans.close()
    worker.close()


def send(h: Harness, final: bool = False, data: bool = True) -> m.Release | None:
    """The decoupled step "gen" sends one response (a fresh block), or only its final flag."""
    req = h.step("gen")
    if not data:
        h.scheduler.on_response(m.InferResponse(req.id, "gen", "1", final=True))
        return None
    flag = m.Release(h.worker.name, h.next_flag)
    h.next_flag += 1
    out = m.TensorRef("Y", "INT32", [4], h.worker.name, 1024 + 64 * flag.offset, 16)
    h.scheduler.on_response(m.InferResponse(req.id, "gen", "1", [out], release=[flag], final=final))
    return flag


def post(h: Harness, index: int, error: str = "") -> m.Release:
    """The ``index``-th "post" step (one per response of gen) answers."""
    req = [r for r in h.submitted if r.model == "post"][index]
    flag = m.Release(h.worker.name, h.next_flag)
    h.next_flag += 1
    if error:
        h.scheduler.on_response(m.InferResponse(req.id, "post", "1", error=m.ErrorInfo(1, error)))
    else:
        out = m.TensorRef("Y", "INT32", [4], h.worker.name, 1024 + 64 * flag.offset, 16)
        h.scheduler.on_response(m.InferResponse(req.id, "post", "1", [out], release=[flag]))
    return flag


def give_back_loans(h: Harness) -> None:
    for reply in h.replies:
        for loan in reply.release:
            h.loans._open().array[loan.offset] = RELEASED  # the ingress copied the response out
    h.loans.collect()


def test_each_response_runs_the_next_steps_and_answers_in_order(stream: Harness) -> None:
    stream.request("OUT")
    first, second = send(stream), send(stream)
    assert first is not None and second is not None
    posts = [r for r in stream.submitted if r.model == "post"]
    assert [p.inputs[0].offset for p in posts] == [1024, 1024 + 64]  # each reads its own response, in place
    assert stream.flag(first) == HELD and stream.flag(second) == HELD
    out2 = post(stream, 1)  # the second response is transformed first...
    assert stream.replies == []  # ...and waits for the first
    assert stream.flag(second) == RELEASED  # nothing reads it any more
    out1 = post(stream, 0)
    assert [(r.outputs[0].offset, r.final) for r in stream.replies] == [(1024 + 64 * out1.offset, False),
                                                                       (1024 + 64 * out2.offset, False)]
    send(stream, data=False)  # gen is done: only the final flag is left to send
    assert [r.final for r in stream.replies] == [False, False, True] and stream.replies[2].outputs == []
    give_back_loans(stream)
    assert all(stream.flag(f) == RELEASED for f in (first, second, out1, out2))
    assert len(stream.scheduler) == 0 and len(stream.loans) == 0
    assert stream.state.stats.success.count == 1


def test_the_final_flag_rides_on_the_last_response(stream: Harness) -> None:
    stream.request("OUT")
    send(stream, final=True)  # the decoupled step's last response carries its final flag
    assert stream.replies == []
    post(stream, 0)
    ((reply,),) = [stream.replies]
    assert reply.final and [t.name for t in reply.outputs] == ["OUT"]


def test_no_response_sends_the_final_flag_alone(stream: Harness) -> None:
    stream.request("OUT")
    send(stream, data=False)
    ((reply,),) = [stream.replies]
    assert reply.final and reply.error is None and reply.outputs == []


def test_a_failed_step_mid_stream_is_sent_at_once_and_ends_the_request(stream: Harness) -> None:
    stream.request("OUT")
    first, second, third = send(stream), send(stream), send(stream)
    assert first is not None and second is not None and third is not None
    post(stream, 0)
    made = post(stream, 2)  # made but not sent (its turn comes after the second's)
    post(stream, 1, error="post broke")
    assert [(r.error is None, r.final) for r in stream.replies] == [(True, False), (False, False)]
    assert stream.replies[1].error is not None and stream.replies[1].error.message == "in ensemble 'stream', post broke"
    assert stream.cancelled == [stream.step("gen").id]  # the stream is asked to stop
    late = send(stream)  # it may still send: dropped at once
    assert late is not None and stream.flag(late) == RELEASED
    assert stream.flag(made) == RELEASED  # the response never sent gave its loan back
    send(stream, data=False)
    assert [(r.error, r.final) for r in stream.replies[2:]] == [(None, True)]
    give_back_loans(stream)
    assert all(stream.flag(f) == RELEASED for f in (first, second, third))
    assert len(stream.loans) == 0 and len(stream.scheduler) == 0
    assert stream.state.stats.fail.count == 2  # as Triton counts a failed ensemble


def test_a_client_cancel_stops_the_decoupled_step(stream: Harness) -> None:
    stream.request("OUT")
    tok = send(stream)
    assert stream.scheduler.cancel(b"ingress", 7)
    gen, post0 = stream.step("gen"), next(r for r in stream.submitted if r.model == "post")
    assert sorted(stream.cancelled) == sorted([gen.id, post0.id])
    post(stream, 0)
    send(stream, data=False)
    assert [r.final for r in stream.replies] == [False, True]
    assert stream.replies[0].error is not None and "cancelled" in stream.replies[0].error.message
    assert tok is not None and stream.flag(tok) == RELEASED and len(stream.scheduler) == 0
