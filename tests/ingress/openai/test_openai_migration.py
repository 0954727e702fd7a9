"""The OpenAI ingress's side of a request moved to another engine when its worker dies (migration.py): which
requests may move, what the resumed request is (the prompt's ids and those generated, ``max_tokens`` and
``min_tokens`` less what came), the limit, and the steps of a stream read on across the move as one
answer. Against a fake data plane that answers as the router and a vLLM worker would; the real thing:
tests/workers/backends/vllm/test_engine_placement_e2e.py (a worker killed under greedy streams)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncGenerator
from typing import Any, cast

import numpy as np
import orjson
import pytest

from conveyor.ingress import migration as shared
from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, OutputTensor, StreamError
from conveyor.ingress.openai import migration
from conveyor.ingress.openai.catalog import LlmModel, Target
from conveyor.ingress.openai.contract import contract_of
from conveyor.ingress.openai.generation import engine_call, steps
from conveyor.proto.datatypes import deserialize_bytes, element_count, pack_bytes
from conveyor.proto.errors import ConveyorError, Status, WorkerLost
from conveyor.proto.migration import MIGRATION, OUTPUT_IDS, PROMPT_IDS, RESUMABLE, max_migrations_of
from conveyor.proto.request_checks import check_inputs
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"

LOST = "the worker running this request exited (it stopped answering)"


def _model(max_migrations: int = 1) -> LlmModel:
    """A vLLM model's signature as the router gives it (the backend's inputs and outputs)."""
    inputs = {"text_input": ("BYTES", (1,)), "stream": ("BOOL", (1,)), "sampling_parameters": ("BYTES", (1,)),
              "exclude_input_in_output": ("BOOL", (1,)), "input_ids": ("INT32", (-1,)),
              "return_num_input_tokens": ("BOOL", (1,)), "return_num_output_tokens": ("BOOL", (1,)),
              "return_finish_reason": ("BOOL", (1,)), "return_logprobs": ("BOOL", (1,)),
              "return_prompt_logprobs": ("BOOL", (1,))}
    outputs = {"text_output": "BYTES", "finish_reason": "BYTES", "num_input_tokens": "UINT32",
               "num_output_tokens": "UINT32"}
    sig = ModelSignature("llm", 0, {n: TensorSpec(n, dt, dims, n != "text_input") for n, (dt, dims) in inputs.items()},
                         {n: TensorSpec(n, dt, (-1,)) for n, dt in outputs.items()}, decoupled=True)
    contract = contract_of(sig)
    assert contract is not None
    return LlmModel("llm", sig, contract, "/nowhere", {}, 0, max_migrations=max_migrations)


def _planned(params: dict[str, Any], stream: bool = True, max_migrations: int = 1,
             prompt: str = "Once upon") -> tuple[InferCall, migration.Resume | None]:
    target = Target(_model(max_migrations), None)
    call = engine_call(target, prompt, params, stream, "rid")
    return call, migration.plan(target, prompt, params, stream, call)


def _input(call: InferCall, name: str) -> list[Any]:
    found = next(i for i in call.inputs if i.name == name)
    data = found.data
    assert isinstance(data, np.ndarray)
    if found.datatype == "BYTES" and data.dtype == np.uint8:  # sent: its wire form
        return list(deserialize_bytes(data.tobytes(), element_count(found.shape)))
    return list(data.reshape(-1))


def _sampling(call: InferCall) -> dict[str, Any]:
    return cast(dict[str, Any], orjson.loads(_input(call, "sampling_parameters")[0]))


def _ids(call: InferCall) -> list[int]:
    return [int(t) for t in _input(call, "input_ids")]


@pytest.mark.parametrize(("params", "why"), [
    ({"n": 2}, "n > 1"),
    ({"structured_outputs": {"regex": "[a-z]+"}}, "structured outputs"),
    ({"seed": 7, "temperature": 0.8}, "seed"),
    ({"seed": 7}, "seed"),  # vLLM's default temperature (1) samples
    ({"stop": ["\n"]}, "stop strings"),
    ({"frequency_penalty": 0.5}, "penalties"),
    ({"presence_penalty": -1.0}, "penalties"),
])
def test_what_cannot_go_on_exactly_says_why(params: dict[str, Any], why: str) -> None:
    reason = shared.blocker({"n": 1, "max_tokens": 16, **params})
    assert reason is not None and why in reason


def test_greedy_and_plain_sampling_go_on() -> None:
    assert shared.blocker({"n": 1, "max_tokens": 16, "temperature": 0, "seed": 3}) is None  # greedy ignores it
    assert shared.blocker({"n": 1, "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "min_tokens": 2,
                              "repetition_penalty": 1.1, "logprobs": 2, "stop": []}) is None


def test_a_resumable_stream_asks_for_its_token_ids_and_others_do_not() -> None:
    call, resume = _planned({"n": 1, "max_tokens": 8})
    assert resume is not None and call.parameters == {RESUMABLE: True}
    call, resume = _planned({"n": 2, "max_tokens": 8})  # may still be sent again before it answers
    assert resume is not None and call.parameters == {}
    call, resume = _planned({"n": 1, "max_tokens": 8}, stream=False)  # one answer, at the end: no ids to keep
    assert resume is not None and call.parameters == {}
    call, resume = _planned({"n": 1, "max_tokens": 8}, max_migrations=0)  # MAX_MIGRATIONS 0: off
    assert resume is None and call.parameters == {}


def test_the_resumed_request_is_the_prompt_and_the_tokens_so_far_with_fewer_to_go() -> None:
    _, resume = _planned({"n": 1, "max_tokens": 10, "min_tokens": 4, "temperature": 0, "logprobs": 1,
                          "prompt_logprobs": 1})
    assert resume is not None
    first: dict[str, Any] = {PROMPT_IDS: [1, 50, 51], OUTPUT_IDS: [7]}
    resume.observe(first)
    assert first == {}  # taken out: never shown to the client
    resume.observe({OUTPUT_IDS: [8, 9]})
    call = resume.moved(WorkerLost(LOST))
    assert call is not None
    assert _ids(call) == [1, 50, 51, 7, 8, 9]
    assert _input(call, "text_input")[0] == b""
    sampling = _sampling(call)
    assert sampling["max_tokens"] == 7 and sampling["min_tokens"] == 1 and sampling["logprobs"] == 1
    assert "prompt_logprobs" not in sampling  # shown with the first engine's first response
    assert call.parameters == {RESUMABLE: True, MIGRATION: 1} and call.id == "rid"
    with pytest.raises(WorkerLost, match=r"MAX_MIGRATIONS 1") as exc:  # the limit: one move
        resume.moved(WorkerLost(LOST))
    assert exc.value.status is Status.UNAVAILABLE and exc.value.message.startswith(LOST)


def test_min_tokens_already_reached_is_zero_and_a_whole_answer_needs_no_move() -> None:
    _, resume = _planned({"n": 1, "max_tokens": 3, "min_tokens": 2})
    assert resume is not None
    resume.observe({PROMPT_IDS: [1, 2], OUTPUT_IDS: [5, 6]})
    assert resume.remaining() == {"n": 1, "max_tokens": 1, "min_tokens": 0}
    resume.observe({OUTPUT_IDS: [7]})  # every token came; only the final response was lost
    assert resume.moved(WorkerLost(LOST)) is None


def test_a_request_that_answered_nothing_yet_is_sent_again_as_it_was_whatever_it_asks() -> None:
    _, resume = _planned({"n": 2, "max_tokens": 5, "structured_outputs": {"choice": ["a", "b"]}}, max_migrations=2)
    assert resume is not None
    call = resume.moved(WorkerLost(LOST))
    assert call is not None and _sampling(call)["n"] == 2 and call.parameters == {MIGRATION: 1}
    assert _input(call, "text_input")[0] == b"Once upon"
    resume.observe({})  # then it answered: now it cannot move
    with pytest.raises(WorkerLost, match="n > 1 choices"):
        resume.moved(WorkerLost(LOST))


def test_max_migrations_reads_the_parameter() -> None:
    assert max_migrations_of("") == 1  # the default
    assert [max_migrations_of(t) for t in ("0", "3", "16")] == [0, 3, 16]
    assert [max_migrations_of(t) for t in ("-1", "x", "17", "1.5")] == [-1, -1, -1, -1]  # refused at load


def _result(text: str, params: dict[str, Any], final: bool = False, prompt_tokens: int | None = None,
            finish: str = "None") -> InferResult:
    def tensor(name: str, datatype: str, raw: bytes) -> OutputTensor:
        return OutputTensor(name, datatype, [1], np.frombuffer(raw, dtype=np.uint8))

    outputs = [tensor("text_output", "BYTES", pack_bytes([text.encode()])),
               tensor("finish_reason", "BYTES", pack_bytes([finish.encode()])),
               tensor("num_output_tokens", "UINT32", struct.pack("<I", len(params.get(OUTPUT_IDS, []))))]
    if prompt_tokens is not None:
        outputs.append(tensor("num_input_tokens", "UINT32", struct.pack("<I", prompt_tokens)))
    return InferResult("llm", "1", "rid", outputs, params, [], cast(Any, None), final)


class _Engines:
    """A data plane whose first engine dies after two tokens, as the router reports it, and whose
    second answers the resumed request from where it stands."""

    def __init__(self) -> None:
        self.calls: list[InferCall] = []

    async def infer_stream_batches(self, call: InferCall) -> AsyncGenerator[list[InferResult | StreamError], None]:
        self.calls.append(call)
        check_inputs(_model(1).signature, call.inputs)  # sent: BYTES inputs in their wire form
        if len(self.calls) == 1:
            yield [_result(" there", {PROMPT_IDS: [1, 2, 3], OUTPUT_IDS: [10]}, prompt_tokens=3)]
            yield [_result(" was", {OUTPUT_IDS: [11]})]
            yield [StreamError(WorkerLost(LOST), True)]
            return
        yield [_result(" a", {PROMPT_IDS: [1, 2, 3, 10, 11], OUTPUT_IDS: [12]}, prompt_tokens=5)]
        yield [_result(" king", {OUTPUT_IDS: [13]}, final=True, finish="length")]


def test_a_stream_reads_on_across_the_move_as_one_answer() -> None:
    engines = _Engines()
    call, resume = _planned({"n": 1, "max_tokens": 4, "temperature": 0})

    async def read() -> list[Any]:
        return [step async for step in steps(cast(DataPlane, engines), call, 1, resume=resume)]

    found = asyncio.run(read())
    assert "".join(s.texts[0] for s in found) == " there was a king"
    assert [s.finish[0] for s in found] == [None, None, None, "length"]
    assert [s.prompt_tokens for s in found if s.prompt_tokens is not None] == [3, 3]  # the original prompt's
    assert sum(s.output_tokens for s in found) == 4
    assert _ids(engines.calls[1]) == [1, 2, 3, 10, 11] and _sampling(engines.calls[1])["max_tokens"] == 2


def test_without_a_plan_the_workers_death_ends_the_stream() -> None:
    engines = _Engines()
    call, _ = _planned({"n": 1, "max_tokens": 4}, max_migrations=0)

    async def read() -> list[Any]:
        return [step async for step in steps(cast(DataPlane, engines), call, 1)]

    with pytest.raises(ConveyorError, match="worker running this request exited"):
        asyncio.run(read())
    assert len(engines.calls) == 1


class _OneEngine(_Engines):
    """The model's only engine dies; its worker's restart then refuses the moved request (UNAVAILABLE, as
    the router and the signature cache do while no version is ready) ``refusals`` times before answering."""

    def __init__(self, refusals: int, status: Status = Status.UNAVAILABLE) -> None:
        super().__init__()
        self.refusals, self.status = refusals, status

    async def infer_stream_batches(self, call: InferCall) -> AsyncGenerator[list[InferResult | StreamError], None]:
        if 1 <= len(self.calls) <= self.refusals:
            self.calls.append(call)
            check_inputs(_model(1).signature, call.inputs)
            message = "Request for unknown model: 'llm' has no available versions"
            if len(self.calls) % 2:  # refused by the signature cache before a request is sent
                raise ConveyorError(self.status, message)
            yield [StreamError(ConveyorError(self.status, message), True)]
            return
        async for batch in super().infer_stream_batches(call):
            yield batch


def _read(engines: _Engines, call: InferCall, resume: migration.Resume | None) -> list[Any]:
    async def read() -> list[Any]:
        return [step async for step in steps(cast(DataPlane, engines), call, 1, resume=resume)]

    return asyncio.run(read())


def test_a_moved_stream_waits_for_its_only_engine_to_be_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "RETRY_FIRST_S", 0.001)
    engines = _OneEngine(refusals=4)
    call, resume = _planned({"n": 1, "max_tokens": 4, "temperature": 0})
    found = _read(engines, call, resume)
    assert "".join(s.texts[0] for s in found) == " there was a king"
    assert len(engines.calls) == 6 and _ids(engines.calls[-1]) == [1, 2, 3, 10, 11]
    assert resume is not None and resume.moves == 1  # waiting is no move


def test_the_wait_for_the_model_is_bounded_and_only_for_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(shared, "RETURN_WAIT_S", 0.05)
    call, resume = _planned({"n": 1, "max_tokens": 4, "temperature": 0})
    with pytest.raises(ConveyorError, match="has no available versions") as exc:
        _read(_OneEngine(refusals=10_000), call, resume)
    assert exc.value.status == Status.UNAVAILABLE
    engines = _OneEngine(refusals=3, status=Status.INVALID_ARG)
    call, resume = _planned({"n": 1, "max_tokens": 4, "temperature": 0})
    with pytest.raises(ConveyorError, match="has no available versions"):
        _read(engines, call, resume)
    assert len(engines.calls) == 2  # refused once: no wait
