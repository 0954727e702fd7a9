"""Runtime LoRA adapters in a real router (tests/support/router_core.py): a load reaches every
serving instance and is answered once all have it; an instance that becomes ready later (a worker
restarted) gets it before its first batch; a worker lost meanwhile is not waited for; a failed load is
undone; vLLM's refusals, as values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.lora_book import AdapterBook
from tests.support.router_core import RouterCore, write_model

LEVEL = "unit"

ALLOW = 'parameters { key: "ALLOW_RUNTIME_LORA_UPDATING" value: { string_value: "true" } }'
W1, W2 = b"worker-1", b"worker-2"


@pytest.fixture
def core(tmp_path: Path) -> Iterator[RouterCore]:
    write_model(tmp_path, "llm", instances=0, extra=ALLOW)  # one instance on every worker
    write_model(tmp_path, "plain", instances=0)
    c = RouterCore(tmp_path)
    yield c
    c.close()


def _control(core: RouterCore, op: str, **args: Any) -> m.ControlReply | None:
    core.from_ingress(m.ControlRequest(7, op, args))
    replies = [r for r in core.to_ingress() if isinstance(r, m.ControlReply)]
    return replies[0] if replies else None


def _updates(core: RouterCore, worker: bytes) -> list[m.LoraUpdate]:
    return [msg for msg in core.to_worker(worker) if isinstance(msg, m.LoraUpdate)]


def test_a_load_reaches_every_instance_and_an_instance_ready_later_gets_it_first(core: RouterCore) -> None:
    core.serve(W1)
    core.serve(W2)
    generation = core.router.registry.generation
    assert _control(core, "lora_load", model="llm", name="delta", path="/a/delta") is None  # waits for both
    asked = {w: _updates(core, w) for w in (W1, W2)}
    assert all([(u.name, u.path) for u in got] == [("delta", "/a/delta")] for got in asked.values())
    core.from_worker(W1, m.LoraUpdated(asked[W1][0].check))
    assert [r for r in core.to_ingress() if isinstance(r, m.ControlReply)] == []
    core.from_worker(W2, m.LoraUpdated(asked[W2][0].check))
    (reply,) = [r for r in core.to_ingress() if isinstance(r, m.ControlReply)]
    assert reply.error is None and reply.result == {"message": "Success: LoRA adapter 'delta' added successfully."}
    assert core.router.registry.generation > generation  # every ingress reads the adapters again
    assert core.router.control_ops.call("lora_adapters", {})["adapters"] == {
        "delta": {"model": "llm", "path": "/a/delta"}}

    # worker 2 restarts: its new instance gets the adapter (nobody waits: check 0) before any batch
    core.router.membership.drop(W2, "it restarted")
    loads = [x for x in core.join(W2) if x.model == "llm"]
    core.from_worker(W2, m.ModelLoaded("llm", loads[0].version, loads[0].instance))
    core.infer("llm")
    core.infer("llm")
    got = core.to_worker(W2)
    first = next(msg for msg in got if isinstance(msg, (m.LoraUpdate, m.ExecBatch)))
    assert isinstance(first, m.LoraUpdate) and any(isinstance(msg, m.ExecBatch) for msg in got)
    assert (first.name, first.path, first.check) == ("delta", "/a/delta", 0)


def test_a_load_waiting_on_a_worker_that_dies_is_answered_by_the_others(core: RouterCore) -> None:
    """Not at the control timeout: the lost worker's instances get the adapter when placed again."""
    core.serve(W1)
    core.serve(W2)
    _control(core, "lora_load", model="llm", name="delta", path="/a/delta")
    core.from_worker(W1, m.LoraUpdated(_updates(core, W1)[0].check))
    assert [r for r in core.to_ingress() if isinstance(r, m.ControlReply)] == []
    core.router.membership.drop(W2, "it exited")  # as the router's pid check finds it gone
    core.turn()
    (reply,) = [r for r in core.to_ingress() if isinstance(r, m.ControlReply)]
    assert reply.error is None and "added successfully" in reply.result["message"]


def test_a_failed_load_is_undone_and_answered_with_the_first_failure(core: RouterCore) -> None:
    core.serve(W1)
    core.serve(W2)
    _control(core, "lora_load", model="llm", name="delta", path="/nowhere")
    asked = {w: _updates(core, w)[0] for w in (W1, W2)}
    core.from_worker(W1, m.LoraUpdated(asked[W1].check))
    why = "Loading lora delta failed: No adapter found for /nowhere"
    core.from_worker(W2, m.LoraUpdated(asked[W2].check, m.ErrorInfo(int(Status.NOT_FOUND), why)))
    (reply,) = [r for r in core.to_ingress() if isinstance(r, m.ControlReply)]
    assert reply.error == m.ErrorInfo(int(Status.NOT_FOUND), why)
    for w in (W1, W2):  # dropped everywhere (check 0: nobody waits)
        assert [(u.name, u.path, u.check) for u in _updates(core, w)] == [("delta", "", 0)]
    assert core.router.control_ops.call("lora_adapters", {})["adapters"] == {}


def test_refusals(core: RouterCore) -> None:
    core.serve(W1)
    reply = _control(core, "lora_load", model="plain", name="x", path="/p")
    assert reply is not None and reply.error is not None and reply.error.status == Status.INVALID_ARG
    assert "ALLOW_RUNTIME_LORA_UPDATING" in reply.error.message
    reply = _control(core, "lora_load", model="nope", name="x", path="/p")
    assert reply is not None and reply.error is not None and reply.error.status == Status.NOT_FOUND
    reply = _control(core, "lora_load", model="llm", name="plain", path="/p")
    assert reply is not None and reply.error is not None
    assert reply.error.message == "The lora adapter 'plain' conflicts with a served base model."
    reply = _control(core, "lora_unload", name="ghost")
    assert reply is not None and reply.error == m.ErrorInfo(int(Status.NOT_FOUND),
                                                            "The lora adapter 'ghost' cannot be found.")


def test_unload_forgets_it_and_each_instance_drops_it(core: RouterCore) -> None:
    core.serve(W1)
    _control(core, "lora_load", model="llm", name="delta", path="/a/delta")
    core.from_worker(W1, m.LoraUpdated(_updates(core, W1)[0].check))
    core.to_ingress()
    reply = _control(core, "lora_unload", name="delta")
    assert reply is not None and reply.result["model"] == "llm"
    assert [(u.name, u.path) for u in _updates(core, W1)] == [("delta", "")]
    reply = _control(core, "lora_unload", name="delta")
    assert reply is not None and reply.error is not None and reply.error.status == Status.NOT_FOUND


def _refusal(fn: Any) -> tuple[Status, str]:
    with pytest.raises(ConveyorError) as err:
        fn()
    return err.value.status, err.value.message


def test_the_book_checks_as_vllm_does() -> None:
    book = AdapterBook()
    assert _refusal(lambda: book.check_load("", "/p", "m", False, {"m"})) == (
        Status.INVALID_ARG, "Both 'lora_name' and 'lora_path' must be provided.")
    book.check_load("a", "/p", "m", False, {"m"})
    assert book.begin("a", "m", "/p") is None
    # a second load while the first is under way: try again later
    assert _refusal(lambda: book.check_load("a", "/q", "m", True, {"m"}))[0] is Status.UNAVAILABLE
    assert _refusal(lambda: book.check_unload("a"))[0] is Status.UNAVAILABLE
    assert book.listing() == {}  # not listed until every instance has it
    book.confirm("a")
    assert book.listing() == {"a": {"model": "m", "path": "/p"}}
    assert _refusal(lambda: book.check_load("a", "/q", "m", False, {"m"})) == (
        Status.INVALID_ARG, "The lora adapter 'a' has already been loaded. If you want to load the adapter "
                            "in place, set 'load_inplace' to True.")
    assert _refusal(lambda: book.check_load("a", "/q", "other", True, {"m"}))[0] is Status.INVALID_ARG
    book.check_load("a", "/q", "m", True, {"m"})  # in place, same model
    previous = book.begin("a", "m", "/q")
    book.restore("a", previous)  # that load failed: the adapter it was to replace stays
    assert book.listing() == {"a": {"model": "m", "path": "/p"}}
    assert [a.name for a in book.of_model("m")] == ["a"] and book.of_model("other") == []
    assert book.remove("a").model == "m"
    assert _refusal(lambda: book.check_unload("a")) == (Status.NOT_FOUND, "The lora adapter 'a' cannot be found.")
    assert _refusal(lambda: book.check_unload(""))[0] is Status.INVALID_ARG
