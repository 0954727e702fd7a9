"""The ``Ledger`` on its own, and the control table: one op table, arguments checked once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from conveyor.proto import messages as m
from conveyor.proto.control import Args, NoArgs
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router import user_readiness
from conveyor.router.control_table import ControlTable, Deferred, Op
from conveyor.router.ledger import Ledger, Running
from conveyor.router.models import build_entry
from conveyor.router.pending import Pending
from conveyor.router.repository.scan import load_spec
from tests.support.router_core import INGRESS, RouterCore, write_model

LEVEL = "unit"


def _pending(rid: int) -> Pending:
    return Pending(INGRESS, m.InferRequest(rid, "plain", "", [], []), 0, 1, ())


def test_the_ledger_follows_a_batch_from_queue_to_answer(tmp_path: Path) -> None:
    write_model(tmp_path, "plain")
    state = build_entry(load_spec("plain", str(tmp_path / "plain"), autocomplete=False)).versions[1]
    ledger = Ledger()
    ledger.queued(INGRESS, 1, state)
    ledger.queued(INGRESS, 2, state)
    assert ledger.queued_versions() == {state} and len(ledger) == 2
    run = Running(state.instances[0], [_pending(1), _pending(2)], 0)
    ledger.started(7, run)
    assert ledger.running_at(INGRESS, 2) == (7, 1) and ledger.unqueued(INGRESS, 2) is None
    assert ledger.busy_instances() == {id(state.instances[0])}
    ledger.returned(7, run)
    assert len(ledger) == 0 and not ledger.busy and ledger.batch(7) is None


def test_a_decoupled_batch_stays_until_its_last_item_closed(tmp_path: Path) -> None:
    write_model(tmp_path, "plain")
    state = build_entry(load_spec("plain", str(tmp_path / "plain"), autocomplete=False)).versions[1]
    ledger = Ledger()
    run = Running(state.instances[0], [_pending(1), _pending(2)], 0, open=[True, True])
    ledger.started(3, run)
    ledger.closed(3, run, 0)  # a final response while execute still runs
    ledger.returned(3, run)
    assert ledger.batch(3) is run and ledger.running_at(INGRESS, 2) == (3, 1)
    ledger.closed(3, run, 1)
    assert not ledger.busy and len(ledger) == 0


class Echo(Args, frozen=True):
    text: str
    times: int = 1


def _not_found(_: NoArgs) -> None:
    raise ConveyorError(Status.NOT_FOUND, "no such thing")


def _table(answered: list[tuple[bytes, int]]) -> ControlTable:
    return ControlTable({
        "echo": Op(Echo, lambda a: a.text * a.times),
        "fails": Op(NoArgs, _not_found),
        "later": Deferred(NoArgs, lambda _, caller: answered.append(caller)),
    })


@pytest.mark.parametrize(("args", "error"), [
    ({}, "bad arguments for 'echo': Object missing required field `text`"),
    ({"text": 3}, "bad arguments for 'echo': Expected `str`, got `int` - at `$.text`"),
    ({"text": "a", "loud": True}, "bad arguments for 'echo': Object contains unknown field `loud`"),
])
def test_bad_arguments_are_invalid_arg_before_the_handler_runs(args: dict[str, object], error: str) -> None:
    reply = _table([]).handle(b"x", m.ControlRequest(5, "echo", args))
    assert reply == m.ControlReply(5, error=m.ErrorInfo(int(Status.INVALID_ARG), error))


def test_ops_answer_at_once_fail_with_their_status_or_answer_later() -> None:
    answered: list[tuple[bytes, int]] = []
    table = _table(answered)
    assert table.handle(b"x", m.ControlRequest(1, "echo", {"text": "ab", "times": 2})) == m.ControlReply(1, "abab")
    failed = table.handle(b"x", m.ControlRequest(2, "fails", {}))
    assert failed == m.ControlReply(2, error=m.ErrorInfo(int(Status.NOT_FOUND), "no such thing"))
    unknown = table.handle(b"x", m.ControlRequest(3, "nope", {}))
    assert unknown is not None and unknown.error == m.ErrorInfo(int(Status.INVALID_ARG),
                                                                "unknown control operation 'nope'")
    assert table.handle(b"x", m.ControlRequest(4, "later", {})) is None and answered == [(b"x", 4)]


def test_the_router_answers_its_control_ops_through_the_table(tmp_path: Path) -> None:
    write_model(tmp_path, "plain")
    core = RouterCore(tmp_path)
    try:
        core.serve(b"worker-1")
        core.from_ingress(m.ControlRequest(1, "model_ready", {"model": "plain"}))
        core.from_ingress(m.ControlRequest(2, "model_ready", {"name": "plain"}))
        core.from_ingress(m.ControlRequest(3, "transport", {}))
        ready, bad, transport = core.to_ingress()
        assert ready == m.ControlReply(1, True)
        assert isinstance(bad, m.ControlReply) and bad.error is not None
        assert bad.error.status == int(Status.INVALID_ARG)
        assert transport == m.ControlReply(3, {"dispatched": 0, "direct": 0})
    finally:
        core.close()


def test_a_model_that_decides_its_readiness_is_asked(tmp_path: Path) -> None:
    """A Python model with is_ready() (ModelLoaded.user_ready): model_ready asks its instance
    (ReadyCheck) and answers with what it says, or not ready after TIMEOUT_S."""
    write_model(tmp_path, "own")
    core = RouterCore(tmp_path)
    try:
        for load in core.join(b"worker-1"):
            core.from_worker(b"worker-1", m.ModelLoaded(load.model, load.version, load.instance, user_ready=True))
        core.from_ingress(m.ControlRequest(1, "model_ready", {"model": "own"}))
        assert core.to_ingress() == []  # asked, not answered yet
        [check] = [msg for msg in core.to_worker(b"worker-1") if isinstance(msg, m.ReadyCheck)]
        assert check.model == "own"
        core.from_worker(b"worker-1", m.ReadyChecked(check.check, True))
        assert core.to_ingress() == [m.ControlReply(1, True)]

        core.from_ingress(m.ControlRequest(2, "model_ready", {"model": "own"}))
        [check] = [msg for msg in core.to_worker(b"worker-1") if isinstance(msg, m.ReadyCheck)]
        core.router.user_readiness.expire(time.monotonic() + user_readiness.TIMEOUT_S + 1)
        core.turn()
        assert core.to_ingress() == [m.ControlReply(2, False)]
        core.from_worker(b"worker-1", m.ReadyChecked(check.check, True))  # too late: dropped
        assert core.to_ingress() == []
    finally:
        core.close()


def test_a_start_up_that_failed_under_exit_on_error_is_never_ready(tmp_path: Path) -> None:
    """As Triton's server, whose creation fails: between the failed start-up load and the router's exit (its
    next tick), readiness says no; a client polling it (Triton's OpenAI fixture) sees the exit, not a start."""
    from conveyor.router.config import RouterConfig
    from conveyor.router.lifecycle import ControlMode, ModelControlConfig
    from conveyor.router.server import Router

    n = os.getpid()
    models = ModelControlConfig(mode=ControlMode.EXPLICIT, load_at_start=("nowhere",), exit_on_error=True)
    router = Router(RouterConfig((str(tmp_path),), f"inproc://test-exit-front-{n}", f"inproc://test-exit-back-{n}",
                                 group=f"test-exit-{n}", spin_s=0, models=models))
    try:
        router.load_repository()
        assert not router.control.server_ready()  # no model at all, but the one asked for is missing
        router._check_startup()
        assert router.exit_code != 0 and not router.control.server_ready()
    finally:
        router.self_link.close()
        router.front_sock.close(0)
        router.back_sock.close(0)
        router.loans.close()
        router.agent.close()
