"""The shared core of the router's clients (``proto/pending_calls.py``): responses reach their
caller up to the final one, a caller that left still has its memory freed, and a lost router
ends every open call."""

from __future__ import annotations

from conveyor.proto import messages as m
from conveyor.proto.pending_calls import PendingCalls

LEVEL = "unit"


def test_responses_go_to_their_request_until_the_final_one() -> None:
    calls, got, freed = PendingCalls(), [], []  # type: ignore[var-annotated]
    calls.add(1, got.append, on_final=lambda: freed.append(1))
    calls.add(2, got.append)
    assert calls.deliver(m.InferResponse(1, "x", "1", final=False))
    assert freed == []  # a decoupled request may read its inputs until the final response
    assert calls.deliver(m.InferResponse(1, "x", "1"))
    assert freed == [1]
    assert not calls.deliver(m.InferResponse(1, "x", "1"))  # ended: a late answer is not delivered
    assert [r.id for r in got] == [1, 1]
    assert calls.open_requests() == [2]


def test_a_caller_that_left_has_its_responses_redirected() -> None:
    calls, waiting, orphans, freed = PendingCalls(), [], [], []  # type: ignore[var-annotated]
    calls.add(7, waiting.append, on_final=lambda: freed.append(7))
    assert calls.redirect(7, orphans.append)
    calls.deliver(m.InferResponse(7, "x", "1", release=[m.Release("seg", 3)]))
    assert waiting == [] and [r.release for r in orphans] == [[m.Release("seg", 3)]]
    assert freed == [7]  # the input block is freed all the same
    assert not calls.redirect(7, orphans.append)


def test_fail_ends_open_requests_and_control_calls_with_the_error() -> None:
    calls, got, replies = PendingCalls(), [], []  # type: ignore[var-annotated]
    calls.add(1, got.append)
    calls.add(2, got.append)
    calls.add_control(9, replies.append)
    error = m.ErrorInfo(14, "the router restarted")
    assert calls.fail([2, 3], error) == [2]
    calls.fail_all(error)
    assert sorted(r.id for r in got) == [1, 2] and all(r.error == error and r.final for r in got)
    assert [r.id for r in replies] == [9] and replies[0].error == error
    assert len(calls) == 0


def test_a_callback_that_raises_does_not_stop_the_link() -> None:
    calls, got = PendingCalls(), []  # type: ignore[var-annotated]

    def broken(_: m.InferResponse) -> None:
        raise RuntimeError("boom")

    calls.add(1, broken)
    calls.add(2, got.append)
    assert calls.deliver(m.InferResponse(1, "x", "1"))
    assert calls.deliver(m.InferResponse(2, "x", "1"))
    assert [r.id for r in got] == [2]
    calls.add_control(5, lambda reply: None)
    calls.forget_control(5)
    calls.deliver_control(m.ControlReply(5))  # given up: dropped without a word

