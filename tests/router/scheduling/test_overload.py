"""MAX_WAITING_REQUESTS and MAX_KV_CACHE_USAGE on a real router core (in-process sockets): the
count moves by one per admission and once per request that stops waiting (answered, failed,
cancelled, expired, its first response, its worker lost), a request past a limit is refused at
once and counted, and a reload's new limit sees the requests the old entry still holds."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from conveyor.ingress.prometheus import render
from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import Status
from conveyor.proto.metric_series import OverloadReason
from conveyor.router.lifecycle import Answer, ControlMode, ModelControlConfig, ModelLifecycle
from conveyor.router.models import InstanceState, VersionState
from conveyor.router.registry import ModelRegistry
from conveyor.router.repository.default_groups import filled_config
from conveyor.router.scheduling.overload import OverloadLimits, limits_only_change
from conveyor.router.spec.overload import MAX_KV_PARAMETER, MAX_WAITING_PARAMETER, overload_problem
from tests.support.router_core import RouterCore, write_model

LEVEL = "unit"

W1 = b"worker-1"
LIMIT = 3


def _parameters(**values: str) -> str:
    return "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in values.items())


@pytest.fixture
def core(tmp_path: Path) -> Iterator[RouterCore]:
    # One instance, no dynamic batching: it holds the running request and the next (PIPELINE_DEPTH).
    write_model(tmp_path, "limited", extra=_parameters(MAX_WAITING_REQUESTS=str(LIMIT)))
    # Requests wait up to 10 s for a fuller batch: they stay queued in the router.
    write_model(tmp_path, "queued", extra="dynamic_batching { max_queue_delay_microseconds: 10000000 }\n"
                + _parameters(MAX_WAITING_REQUESTS=str(LIMIT)))
    write_model(tmp_path, "stream", extra="model_transaction_policy { decoupled: true }\n"
                + _parameters(MAX_WAITING_REQUESTS="1"))
    write_model(tmp_path, "engine", extra=_parameters(MAX_KV_CACHE_USAGE="0.5"))
    write_model(tmp_path, "free")
    c = RouterCore(tmp_path)
    c.serve(W1)
    yield c
    c.close()


def _state(core: RouterCore, model: str) -> VersionState:
    return core.router.registry.resolve(model, "")


def _refused(resp: m.InferResponse) -> bool:
    return resp.error is not None and resp.error.status == int(Status.UNAVAILABLE)


def test_the_limits_are_read_from_the_config_and_bad_values_refuse_the_load() -> None:
    config = mc.ModelConfig(name="m")
    assert OverloadLimits.from_config(config) == OverloadLimits() and not OverloadLimits().any
    config.parameters[MAX_WAITING_PARAMETER].string_value = "16"
    config.parameters[MAX_KV_PARAMETER].string_value = " 0.9 "
    assert OverloadLimits.from_config(config) == OverloadLimits(16, 0.9)
    assert overload_problem(config) == ""
    for bad in ("0", "-1", "ten", "1.5"):
        config.parameters[MAX_WAITING_PARAMETER].string_value = bad
        assert MAX_WAITING_PARAMETER in overload_problem(config)
    config.parameters[MAX_WAITING_PARAMETER].string_value = "4"
    for bad in ("0", "1.01", "-0.5", "nan", "most"):
        config.parameters[MAX_KV_PARAMETER].string_value = bad
        assert MAX_KV_PARAMETER in overload_problem(config)


def test_a_config_that_changes_only_the_limits_is_told_apart() -> None:
    old = mc.ModelConfig(name="m", backend="python")
    old.parameters[MAX_WAITING_PARAMETER].string_value = "16"
    new = mc.ModelConfig()
    new.CopyFrom(old)
    assert not limits_only_change(old, new)  # the same: nothing to apply
    new.parameters[MAX_WAITING_PARAMETER].string_value = "4"
    new.parameters[MAX_KV_PARAMETER].string_value = "0.9"
    assert limits_only_change(old, new)
    del new.parameters[MAX_WAITING_PARAMETER]
    assert limits_only_change(old, new)  # unset: no limit
    new.parameters["MAX_MIGRATIONS"].string_value = "3"  # the ingresses' (proto/migration.py)
    assert limits_only_change(old, new)
    new.parameters["other"].string_value = "x"
    assert not limits_only_change(old, new)
    new.max_batch_size = 8
    del new.parameters["other"]
    assert not limits_only_change(old, new)


def test_past_the_limit_a_request_is_refused_at_once_and_counted(core: RouterCore) -> None:
    state = _state(core, "limited")
    ids = [core.infer("limited") for _ in range(LIMIT)]
    assert [b.items[0].id for b in core.batches(W1)] == ids[:2]  # running and next; the third queued
    assert state.waiting.count == LIMIT and core.responses() == []

    rid = core.infer("limited")
    [resp] = core.responses()
    assert resp.id == rid and _refused(resp)
    assert resp.error is not None and resp.error.message == (
        f"[request id: <id_unknown>] Exceeds maximum waiting requests: {LIMIT} requests already wait for "
        f"model 'limited' (parameter MAX_WAITING_REQUESTS {LIMIT})")
    assert state.waiting.count == LIMIT and len(core.ledger) == LIMIT  # never queued
    assert state.waiting.refusals == {OverloadReason.WAITING.value: 1, OverloadReason.KV_CACHE.value: 0}
    assert state.stats.fail.count == 1 and state.latency.wire()["failures"]["REJECTED"] == 1  # as Triton's queue full
    # A model without limits is not touched by another's.
    core.infer("free")
    assert [r.error for r in core.responses()] == []


def test_a_refusal_costs_the_same_behind_2000_waiting_requests_as_behind_3(tmp_path: Path) -> None:
    """O(1): the check reads counters; nothing walks the queue (best of 5 rounds, against a
    model whose queue is short, in the same process: the machine's noise cancels out)."""
    batching = "dynamic_batching { max_queue_delay_microseconds: 10000000 }\n"
    write_model(tmp_path, "deep", extra=batching + _parameters(MAX_WAITING_REQUESTS="2000"))
    write_model(tmp_path, "shallow", extra=batching + _parameters(MAX_WAITING_REQUESTS="3"))
    c = RouterCore(tmp_path)
    try:
        c.serve(W1)
        for model, count in (("deep", 2000), ("shallow", 3)):
            for _ in range(count):
                c.infer(model)
        assert c.responses() == [] and len(c.ledger) == 2003

        def refusals(model: str) -> float:
            best = float("inf")
            for _ in range(5):
                began = time.perf_counter()
                for _ in range(100):
                    c.infer(model)
                best = min(best, time.perf_counter() - began)
                assert len(c.responses()) == 100
            return best

        shallow, deep = refusals("shallow"), refusals("deep")
        assert deep < 3 * shallow, (deep, shallow)
    finally:
        c.close()


def test_an_answer_frees_a_place(core: RouterCore) -> None:
    state = _state(core, "limited")
    for _ in range(LIMIT):
        core.infer("limited")
    first, _ = core.batches(W1)
    core.answer(W1, first)
    assert state.waiting.count == LIMIT - 1
    core.infer("limited")
    assert all(r.error is None for r in core.responses())
    assert state.waiting.count == LIMIT


def test_an_error_a_cancel_and_a_lost_worker_each_free_their_place(core: RouterCore) -> None:
    state = _state(core, "limited")
    ids = [core.infer("limited") for _ in range(LIMIT)]
    running, behind = core.batches(W1)
    core.answer(W1, running, m.ErrorInfo(int(Status.INTERNAL), "the model raised"))
    assert state.waiting.count == LIMIT - 1
    core.from_ingress(m.Cancel(ids[2]))  # dispatched behind the next now, or still queued: either way it ends
    for batch in core.batches(W1):
        core.answer(W1, batch, m.ErrorInfo(int(Status.CANCELLED), "cancelled"))
    assert state.waiting.count == 1  # ``behind`` is still on the worker
    core.router.membership.drop(W1, "it exited")
    core.turn()
    assert state.waiting.count == state.waiting.running == 0 and not core.ledger.busy
    assert {r.id for r in core.responses()} == set(ids)
    del behind


def test_a_queued_request_cancelled_or_past_its_deadline_frees_its_place(core: RouterCore) -> None:
    state = _state(core, "queued")
    rid = core.infer("queued")
    core.from_ingress(m.Cancel(rid))
    assert state.waiting.count == 0
    tensor = m.TensorRef("IN", "INT32", [1, 4], "conveyor.test.ingress", 0, 16)
    soon = time.monotonic_ns() + 20_000_000
    for rid in (100, 101):
        core.from_ingress(m.InferRequest(rid, "queued", "", [tensor], [m.OutputSpec("OUT")], deadline_ns=soon))
    assert state.waiting.count == 2
    time.sleep(0.03)
    core.turn()  # the router's timer for the earliest expiry
    expired = [r for r in core.responses() if r.id in (100, 101)]
    assert len(expired) == 2 and all(r.error and r.error.status == int(Status.DEADLINE_EXCEEDED) for r in expired)
    assert state.waiting.count == 0 and not core.ledger.busy


def test_a_decoupled_request_stops_waiting_at_its_first_response(core: RouterCore) -> None:
    waiting = _state(core, "stream").waiting  # MAX_WAITING_REQUESTS 1
    core.infer("stream")
    [batch] = core.batches(W1)
    second = core.infer("stream")
    [resp] = core.responses()
    assert resp.id == second and _refused(resp)
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=False))  # the engine runs it
    assert waiting.count == 0
    core.answer(W1, batch)  # execute returned: the instance takes the next; the first still streams
    core.infer("stream")
    [after] = core.batches(W1)
    assert waiting.count == 1
    # Answered straight to the ingress: the worker's note of its first response does the same.
    core.from_worker(W1, m.ItemResponsesSent(after.batch, 0, [m.ResponseCount(1, 1, 0, True)]))
    assert waiting.count == 0
    core.answer(W1, after)
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))
    core.from_worker(W1, m.ItemResponsesSent(after.batch, 0, [], final=True))
    assert waiting.count == waiting.running == 0 and not core.ledger.busy
    assert [r.error for r in core.responses()] == [None, None]


def test_a_request_ended_before_its_first_response_stops_waiting_once(core: RouterCore) -> None:
    waiting = _state(core, "stream").waiting
    core.infer("stream")
    [batch] = core.batches(W1)
    core.from_worker(W1, m.BatchResult(batch.batch, [], 1, 1, 1, error=m.ErrorInfo(int(Status.INTERNAL), "died")))
    assert waiting.count == waiting.running == 0 and not core.ledger.busy
    [resp] = core.responses()
    assert resp.final and resp.error is not None


def test_a_final_response_before_execute_returns_counts_once(core: RouterCore) -> None:
    waiting = _state(core, "stream").waiting
    core.infer("stream")
    [batch] = core.batches(W1)
    assert waiting.running == 1
    core.from_worker(W1, m.ItemResponse(batch.batch, 0, final=True))
    core.answer(W1, batch)
    assert waiting.count == waiting.running == 0 and not core.ledger.busy


def _kv(value: float, removed: bool = False) -> m.CustomMetrics:
    return m.CustomMetrics([m.CustomMetric(m.KV_USAGE_FAMILY, "KV-cache usage", 1, {"model": "engine", "version": "1"},
                                           value, removed=removed)])


def test_past_the_reported_kv_cache_use_a_request_is_refused(core: RouterCore) -> None:
    state = _state(core, "engine")
    core.infer("engine")
    [running] = core.batches(W1)
    assert [r.error for r in core.responses()] == []  # nothing reported: no refusal
    core.from_worker(W1, _kv(0.5))
    rid = core.infer("engine")
    [resp] = core.responses()
    assert resp.id == rid and _refused(resp) and resp.error is not None
    assert "Exceeds maximum KV-cache usage: 50% of the KV cache of model 'engine' is in use " \
           "(parameter MAX_KV_CACHE_USAGE 0.5)" in resp.error.message
    assert state.waiting.refusals[OverloadReason.KV_CACHE.value] == 1
    core.from_worker(W1, _kv(0.2))
    core.infer("engine")
    assert [r.error for r in core.responses()] == []
    for batch in [running, *core.batches(W1)]:
        core.answer(W1, batch)
    core.responses()
    # Nothing runs: an engine's last report (an idle engine reports no more) refuses nothing.
    core.from_worker(W1, _kv(0.9))
    assert state.waiting.running == 0
    core.infer("engine")
    assert [r.error for r in core.responses()] == []
    core.router.membership.drop(W1, "it exited")  # its engine's report goes with it
    core.turn()
    assert state.waiting.kv_usage == 0.0 and state.waiting.running == 0


def test_a_reload_keeps_the_count_and_applies_its_new_limit(core: RouterCore) -> None:
    registry = core.router.registry
    old = _state(core, "limited")
    for _ in range(LIMIT):
        core.infer("limited")
    spec = copy.deepcopy(registry.models["limited"].spec)
    spec.config.parameters[MAX_WAITING_PARAMETER].string_value = "5"
    entry = registry.build(spec)
    new = entry.versions[1]
    assert new.waiting is old.waiting and new.limits == OverloadLimits(5)
    assert new.waiting.count == LIMIT  # the old entry's requests count against the new limit
    # What settling a staged reload does once its instances are ready: it serves, the old one retires.
    for inst in new.instances:
        inst.state, inst.worker = old.instances[0].state, W1
    registry.retiring.append(registry.models["limited"])
    registry.models["limited"] = entry
    ids = [core.infer("limited") for _ in range(3)]
    assert [r.id for r in core.responses() if _refused(r)] == ids[2:]  # 3 + 2 under 5
    assert old.waiting.count == 5
    while batches := core.batches(W1):  # the old entry finishes its queue; every answer frees a place
        for batch in batches:
            core.answer(W1, batch)
    assert old.waiting.count == old.waiting.running == 0 and not core.ledger.busy


def test_metrics_show_the_waiting_count_and_the_refusals_by_reason(core: RouterCore) -> None:
    for _ in range(LIMIT + 2):
        core.infer("limited")
    text = render(core.router.control.metrics())
    assert f'conveyor_waiting_requests{{model="limited",version="1"}} {LIMIT}' in text
    assert 'conveyor_overload_refusals_total{model="limited",reason="max_waiting_requests",version="1"} 2' in text
    assert 'conveyor_overload_refusals_total{model="limited",reason="max_kv_cache_usage",version="1"} 0' in text
    assert 'conveyor_overload_refusals_total{model="free",reason="max_waiting_requests",version="1"} 0' in text


def _serving_lifecycle(repo: Path) -> ModelLifecycle:
    lifecycle = ModelLifecycle(ModelRegistry(), [str(repo)],
                               ModelControlConfig(ControlMode.EXPLICIT, ("limited",), strict_config=True))
    lifecycle.startup()
    for inst in lifecycle.registry.models["limited"].versions[1].instances:  # what its worker's ModelLoaded does
        inst.state, inst.worker = InstanceState.READY, W1
    return lifecycle


def _load(lifecycle: ModelLifecycle, config: mc.ModelConfig) -> list[Answer]:
    """The repository's load with ``config``, applied; the calls answered (a reload: once it serves)."""
    lifecycle.load("limited", "caller", json_format.MessageToJson(config))
    lifecycle.agent.wait(30)
    return lifecycle.settle(set()).answers


def test_the_config_a_client_read_with_a_new_limit_applies_in_place(tmp_path: Path) -> None:
    write_model(tmp_path, "limited", extra=_parameters(MAX_WAITING_REQUESTS=str(LIMIT)))
    lifecycle = _serving_lifecycle(tmp_path)
    try:
        registry = lifecycle.registry
        entry = registry.models["limited"]
        state = entry.versions[1]
        # As GET /v2/models/limited/config shows it: its instance group named (the file names none).
        shown = filled_config(entry.spec.config, state)
        assert shown != entry.spec.config
        shown.parameters[MAX_WAITING_PARAMETER].string_value = "5"
        assert [a.error for a in _load(lifecycle, shown)] == [None]  # answered at once
        assert registry.models["limited"] is entry and not registry.staging and not registry.retiring
        assert state.limits == OverloadLimits(5) and state.instances[0].state is InstanceState.READY
        # Anything else changed too: a reload, staged beside the serving entry.
        shown.parameters["note"].string_value = "more than a limit"
        assert _load(lifecycle, shown) == []  # answered once its instances serve
        assert registry.staging["limited"] is not entry
        assert registry.staging["limited"].versions[1].waiting is state.waiting
    finally:
        lifecycle.agent.close()
