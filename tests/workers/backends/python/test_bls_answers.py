"""The waiting side of a BLS call: cancellation of the requests it was made for
wakes it, and an abandoned call releases every response, queued or late."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from conveyor.proto import messages as m
from conveyor.workers.backends.python import pb_utils
from conveyor.workers.backends.python.bls_answers import CANCELLED, Answers, AsyncAnswers, CancelWatch
from conveyor.workers.backends.python.pb_utils import bls
from conveyor.workers.item_stream import ItemStream

LEVEL = "unit"


def stream(index: int) -> ItemStream:
    """A request's real stream; cancelling it needs none of its output machinery."""
    batch = m.ExecBatch(1, "m", "1", 0, [m.BatchItem(i, [], []) for i in range(index + 1)])
    return ItemStream(batch, index, None, None, lambda _: None, lambda _: None)  # type: ignore[arg-type]


def requests(*streams: ItemStream) -> list[Any]:
    tensor = pb_utils.Tensor("IN", np.zeros(1))
    return [pb_utils.InferenceRequest.received("m", 1, [tensor], [], "", {}, s) for s in streams]


def response(rid: int) -> m.InferResponse:
    return m.InferResponse(rid, "m", "1", release=[m.Release("r", rid)])


def test_a_call_wakes_once_every_request_of_its_batch_is_cancelled() -> None:
    a, b = stream(0), stream(1)
    fired: list[str] = []
    bls.enter_execute(requests(a, b))
    try:
        watch = CancelWatch.for_caller(lambda: fired.append("woken"))
    finally:
        bls.enter_execute(None)
    assert watch is not None and not watch.fired
    a.cancel()
    assert fired == []  # b's client still waits for the batch's answer
    b.cancel()
    assert fired == ["woken"] and watch.fired
    watch.close()
    c = stream(2)
    c.cancel()
    bls.enter_execute(requests(c))
    try:
        assert CancelWatch.for_caller(lambda: None).fired
    finally:
        bls.enter_execute(None)
    assert CancelWatch.for_caller(lambda: None) is None  # outside execute: not tied to a request


def test_an_abandoned_call_releases_what_was_queued_and_what_comes_later() -> None:
    released: list[int] = []
    answers = Answers(lambda msg: released.extend(r.offset for r in msg.release))
    answers.put(response(1))
    answers.put(CANCELLED)
    assert answers.get().id == 1 and answers.get() is CANCELLED
    answers.put(response(2))
    answers.abandon()
    answers.put(response(3))
    assert released == [2, 3]


def test_async_answers_release_late_responses_on_the_loop() -> None:
    released: list[int] = []

    async def run() -> None:
        answers = AsyncAnswers(lambda msg: released.extend(r.offset for r in msg.release))
        answers.put(response(1))
        assert (await answers.get()).id == 1
        answers.abandon()
        answers.put(response(2))  # from the worker's main thread, after the caller left
        await asyncio.sleep(0)

    asyncio.run(run())
    assert released == [2]
