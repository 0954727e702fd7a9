"""A request of Triton's vLLM contract (generate, generate_stream, ModelStreamInfer) moved to another engine
when its worker dies (ingress/tensor_migration.py): what is read from its tensors, the resumed request
(the prompt's ids and those generated in ``input_ids``, ``max_tokens`` and ``min_tokens`` less what came,
in the ``sampling_parameters`` input or the request's parameters), the counts of a resumed engine's
responses rewritten as the client's request's, and a stream read on across the move, or ended with the
worker's error and why. Against a fake data plane that answers as the router and a vLLM worker would; the
real thing: tests/workers/backends/vllm/test_engine_placement_e2e.py (a worker killed under greedy streams)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncGenerator
from typing import Any, cast

import numpy as np
import pytest

from conveyor.ingress import migration as shared
from conveyor.ingress import tensor_migration as tm
from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, OutputTensor, SendTurn, StreamError
from conveyor.proto.datatypes import deserialize_bytes, element_count, pack_bytes
from conveyor.proto.errors import ConveyorError, Status, WorkerLost
from conveyor.proto.migration import MIGRATION, OUTPUT_IDS, PROMPT_IDS, RESUMABLE
from conveyor.proto.request_checks import InferInput, ShmPlacement, check_inputs
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"

LOST = "the worker running this request exited (it stopped answering)"


def _sig(max_migrations: int = 1) -> ModelSignature:
    """A vLLM model's signature as the router gives it (the backend's inputs and outputs)."""
    inputs = {"text_input": ("BYTES", (1,)), "stream": ("BOOL", (1,)), "sampling_parameters": ("BYTES", (1,)),
              "exclude_input_in_output": ("BOOL", (1,)), "input_ids": ("INT32", (-1,)),
              "return_num_input_tokens": ("BOOL", (1,)), "return_cumulative_logprob": ("BOOL", (1,)),
              "return_prompt_logprobs": ("BOOL", (1,))}
    outputs = {"text_output": "BYTES", "num_input_tokens": "UINT32", "cumulative_logprob": "FP32"}
    return ModelSignature("llm", 0, {n: TensorSpec(n, dt, dims, n != "text_input") for n, (dt, dims) in inputs.items()},
                          {n: TensorSpec(n, dt, (-1,)) for n, dt in outputs.items()}, decoupled=True,
                          plain_infer=True, max_migrations=max_migrations)


def _call(sampling: dict[str, Any] | None, stream: bool = True, parameters: dict[str, Any] | None = None,
          raw: bool = False) -> InferCall:
    """A generate request as the HTTP ingress makes it (arrays), or as gRPC's (``raw``: wire bytes)."""
    def text(name: str, value: str) -> InferInput:
        if raw:
            return InferInput(name, "BYTES", [1], pack_bytes([value.encode()]))
        return InferInput(name, "BYTES", [1], np.array([value.encode()], dtype=object))

    def flag(name: str, value: bool) -> InferInput:
        return InferInput(name, "BOOL", [1], bytes([value]) if raw else np.array([value]))

    inputs = [text("text_input", "Once upon"), flag("stream", stream), flag("return_num_input_tokens", True)]
    if sampling is not None:
        inputs.append(text("sampling_parameters", json.dumps(sampling)))
    return InferCall("llm", "", inputs, None, "rid", dict(parameters or {}))


def _planned(sampling: dict[str, Any] | None, **kw: Any) -> tuple[InferCall, tm.TensorMigration]:
    max_migrations = kw.pop("max_migrations", 1)
    call = _call(sampling, **kw)
    resume = tm.plan(call, _sig(max_migrations))
    assert resume is not None
    return call, resume


def _input(call: InferCall, name: str) -> list[Any]:
    found = next(i for i in call.inputs if i.name == name)
    if found.datatype == "BYTES" and isinstance(found.data, np.ndarray) and found.data.dtype == np.uint8:
        return list(deserialize_bytes(found.data.tobytes(), element_count(found.shape)))  # sent: its wire form
    values = tm._values(found)
    assert values is not None
    return values


@pytest.mark.parametrize(("params", "why"), [
    ({"n": "2"}, "n > 1"),
    ({"guided_decoding": {"choice": ["a", "b"]}}, "structured outputs"),  # Triton's backend's name
    ({"seed": "7", "temperature": "0.5"}, "seed"),  # request parameters: numbers as text
    ({"frequency_penalty": "0.5"}, "penalties"),
    ({"bad_words": ["dragon"]}, "bad words"),
    ({"truncate_prompt_tokens": 8}, "truncates its prompt"),
])
def test_what_cannot_go_on_exactly_says_why(params: dict[str, Any], why: str) -> None:
    reason = shared.blocker(params)
    assert reason is not None and why in reason


def test_numbers_as_text_that_go_on() -> None:
    assert shared.blocker({"n": "1", "seed": "3", "temperature": "0", "presence_penalty": "0.0"}) is None


def test_a_resumable_stream_asks_for_its_token_ids_and_others_do_not() -> None:
    call, resume = _planned({"max_tokens": 8, "temperature": 0})
    assert call.parameters == {RESUMABLE: True} and resume.stream
    call, resume = _planned({"max_tokens": 8}, stream=False)  # one answer, at the end
    assert call.parameters == {} and not resume.stream
    call, resume = _planned({"max_tokens": 8, "stop": ["\n"]})  # may still be sent again before it answers
    assert call.parameters == {} and resume.blocker is not None
    call, resume = _planned(None, parameters={"max_tokens": 8, "stop": "x"}, raw=True)  # gRPC: the wire's bytes
    assert call.parameters == {"max_tokens": 8, "stop": "x"} and resume.stream and resume.blocker is not None
    assert tm.plan(_call({"max_tokens": 8}), _sig(max_migrations=0)) is None  # MAX_MIGRATIONS 0: off
    in_shm = _call({"max_tokens": 8})
    in_shm.inputs[0] = InferInput("text_input", "BYTES", [1], None, shm=ShmPlacement("region", 0, 16))
    assert tm.plan(in_shm, _sig()) is None  # not read here: it does not move


def test_the_resumed_request_is_the_prompt_and_the_tokens_so_far_with_fewer_to_go() -> None:
    _, resume = _planned({"max_tokens": 10, "min_tokens": 4, "temperature": 0, "prompt_logprobs": 1})
    first: dict[str, Any] = {PROMPT_IDS: [1, 50, 51], OUTPUT_IDS: [7]}
    resume.observe(first)
    assert first == {}  # taken out: never shown to the client
    resume.observe({OUTPUT_IDS: [8, 9]})
    moved = resume.moved(WorkerLost(LOST))
    assert moved is not None
    assert _input(moved, "input_ids") == [1, 50, 51, 7, 8, 9] and _input(moved, "text_input") == [b""]
    assert json.loads(_input(moved, "sampling_parameters")[0]) == {"max_tokens": 7, "min_tokens": 1, "temperature": 0}
    assert _input(moved, "stream") == [True] and _input(moved, "return_num_input_tokens") == [True]
    assert moved.parameters == {RESUMABLE: True, MIGRATION: 1} and moved.id == "rid"
    with pytest.raises(WorkerLost, match=r"MAX_MIGRATIONS 1") as exc:  # the limit: one move
        resume.moved(WorkerLost(LOST))
    assert exc.value.status is Status.UNAVAILABLE and exc.value.message.startswith(LOST)


def test_sampling_in_the_parameters_and_the_engines_default_max_tokens() -> None:
    _, resume = _planned(None, parameters={"temperature": "0", "prompt_logprobs": 1}, raw=True)
    resume.observe({PROMPT_IDS: [1, 2], OUTPUT_IDS: [5, 6, 7]})
    moved = resume.moved(WorkerLost(LOST))
    assert moved is not None
    assert moved.parameters == {"temperature": "0", "max_tokens": 13, RESUMABLE: True, MIGRATION: 1}  # vLLM's 16
    assert _input(moved, "input_ids") == [1, 2, 5, 6, 7]
    assert [i.name for i in moved.inputs if i.name == "sampling_parameters"] == []


def test_a_request_that_answered_nothing_yet_is_sent_again_as_it_was() -> None:
    call, resume = _planned({"max_tokens": 5, "n": 2}, max_migrations=2)
    check_inputs(_sig(), call.inputs)  # sent: its BYTES arrays now in their wire form
    moved = resume.moved(WorkerLost(LOST))
    assert moved is not None and moved.parameters == {MIGRATION: 1}
    assert _input(moved, "text_input") == [b"Once upon"] and _input(moved, "stream") == [True]
    check_inputs(_sig(), moved.inputs)  # the request as it came, which can be sent again
    resume.observe({})  # then it answered: now it cannot move
    with pytest.raises(WorkerLost, match="n > 1 choices"):
        resume.moved(WorkerLost(LOST))


def _result(text: str, params: dict[str, Any], prompt_tokens: int, cumulative: float,
            final: bool = False) -> InferResult:
    def tensor(name: str, datatype: str, raw: bytes) -> OutputTensor:
        return OutputTensor(name, datatype, [1], np.frombuffer(raw, dtype=np.uint8))

    outputs = [tensor("text_output", "BYTES", pack_bytes([text.encode()])),
               tensor("num_input_tokens", "UINT32", struct.pack("<I", prompt_tokens)),
               tensor("cumulative_logprob", "FP32", struct.pack("<f", cumulative))]
    return InferResult("llm", "1", "rid", outputs, params, [], cast(Any, None), final)


class _Engines:
    """A data plane whose first engine dies after two tokens, as the router reports it, and whose
    second answers the resumed request from where it stands (``refusals`` times refusing it first)."""

    def __init__(self, refusals: int = 0) -> None:
        self.calls: list[InferCall] = []
        self.turns: list[SendTurn | None] = []
        self.refusals = refusals

    async def infer_stream(self, call: InferCall,
                           turn: SendTurn | None = None) -> AsyncGenerator[InferResult | StreamError, None]:
        self.calls.append(call)
        self.turns.append(turn)
        check_inputs(_sig(), call.inputs)  # as the data plane sends a call: its BYTES inputs become their wire form
        if len(self.calls) == 1:
            yield _result(" there", {PROMPT_IDS: [1, 2, 3], OUTPUT_IDS: [10]}, 3, -1.0)
            yield _result(" was", {OUTPUT_IDS: [11]}, 3, -1.5)
            yield StreamError(WorkerLost(LOST), True)
            return
        if len(self.calls) <= 1 + self.refusals:
            message = "Request for unknown model: 'llm' has no available versions"
            if len(self.calls) % 2:  # refused by the signature cache before a request is sent
                raise ConveyorError(Status.UNAVAILABLE, message)
            yield StreamError(ConveyorError(Status.UNAVAILABLE, message), True)
            return
        yield _result(" a", {PROMPT_IDS: [1, 2, 3, 10, 11], OUTPUT_IDS: [12]}, 5, -0.25)
        yield _result(" king", {OUTPUT_IDS: [13]}, 5, -0.75, final=True)


def _read(engines: _Engines, call: InferCall, resume: tm.TensorMigration) -> list[Any]:
    async def read() -> list[Any]:
        out: list[Any] = []
        async for item in tm.resumed_stream(cast(DataPlane, engines), call, resume, cast(SendTurn, "turn")):
            if isinstance(item, StreamError):
                out.append(item)
                continue
            values = {o.name: o.as_array().reshape(-1)[0] for o in item.outputs}
            out.append((values["text_output"].decode(), int(values["num_input_tokens"]),
                        float(values["cumulative_logprob"]), dict(item.parameters)))
        return out

    return asyncio.run(read())


def test_a_stream_reads_on_across_the_move_as_one_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared, "RETRY_FIRST_S", 0.001)
    engines = _Engines(refusals=2)  # its only engine: the restarted worker loads it again
    call, resume = _planned({"max_tokens": 4, "temperature": 0})
    found = _read(engines, call, resume)
    assert [f[0] for f in found] == [" there", " was", " a", " king"]
    assert [f[1] for f in found] == [3, 3, 3, 3]  # the client's prompt, whichever engine answered
    assert [f[2] for f in found] == [-1.0, -1.5, -1.75, -2.25]  # summed over both engines
    assert all(f[3] == {} for f in found)  # the token ids never reach the client
    assert len(engines.calls) == 4 and engines.turns == ["turn", None, None, None]  # the stream's turn once
    assert _input(engines.calls[-1], "input_ids") == [1, 2, 3, 10, 11]
    assert json.loads(_input(engines.calls[-1], "sampling_parameters")[0])["max_tokens"] == 2
    assert resume.moves == 1  # waiting is no move


@pytest.mark.parametrize(("sampling", "why"), [
    ({"max_tokens": 4, "stop": ["zzz"]}, "it has stop strings"),
    ({"max_tokens": 4, "temperature": 0}, "it moved 1 time(s) already (MAX_MIGRATIONS 1)"),
])
def test_a_stream_that_cannot_move_ends_with_the_error_and_why(sampling: dict[str, Any], why: str) -> None:
    call, resume = _planned(sampling)
    if "MAX_MIGRATIONS" in why:
        resume.moves = 1  # as if it had moved once already
    found = _read(_Engines(), call, resume)
    assert [f[0] for f in found[:2]] == [" there", " was"]
    error = found[2]
    assert isinstance(error, StreamError) and error.final and len(found) == 3
    assert error.error.message.startswith(f"{LOST}; not resumed on another engine: {why}")


def test_a_refusal_as_it_came_is_no_move() -> None:
    class Refusing(_Engines):
        async def infer_stream(self, call: InferCall,
                               turn: SendTurn | None = None) -> AsyncGenerator[InferResult | StreamError, None]:
            self.calls.append(call)
            yield StreamError(ConveyorError(Status.UNAVAILABLE, "the queue is full"), True)

    engines = Refusing()
    call, resume = _planned({"max_tokens": 4})
    found = _read(engines, call, resume)
    assert len(found) == 1 and found[0].error.message == "the queue is full" and len(engines.calls) == 1


@pytest.mark.parametrize(("config", "expected"), [
    ('backend: "vllm" input { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }', 1),  # the default
    ('backend: "vllm" input { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] } '
     'parameters { key: "MAX_MIGRATIONS" value: { string_value: "3" } }', 3),
    ('backend: "vllm" input { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] } '
     'parameters { key: "MAX_MIGRATIONS" value: { string_value: "0" } }', 0),
    ('backend: "vllm" input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }', 0),  # takes no token ids
    ('backend: "python" input { name: "input_ids" data_type: TYPE_INT32 dims: [ -1 ] }', 0),  # not vLLM's
])
def test_the_signature_says_how_often_a_request_moves(config: str, expected: int) -> None:
    from google.protobuf import text_format

    from conveyor.proto import model_config_pb2 as mc
    from conveyor.router.models import max_migrations

    assert max_migrations(text_format.Parse(config, mc.ModelConfig())) == expected
    assert ModelSignature.from_wire({"name": "m", "max_batch_size": 0, "inputs": [], "outputs": [],
                                     "max_migrations": expected}).max_migrations == expected


def test_counts_after_a_move_as_it_was_are_that_engines_and_after_a_resume_the_clients() -> None:
    _, resume = _planned({"max_tokens": 4, "temperature": 0}, max_migrations=2)
    assert resume.moved(WorkerLost(LOST)) is not None  # nothing answered: the same request again
    first = _result(" there", {PROMPT_IDS: [1, 2, 3], OUTPUT_IDS: [10]}, 3, -1.0)
    resume.observe(first.parameters)
    resume.adjust(first)  # the engine that took it as it was: its counts are the client's request's
    assert resume.prompt_tokens == 3 and resume.cumulative == -1.0
    assert resume.moved(WorkerLost(LOST)) is not None  # then from the token ids
    later = _result(" was", {PROMPT_IDS: [1, 2, 3, 10], OUTPUT_IDS: [11]}, 4, -0.5)
    resume.observe(later.parameters)
    resume.adjust(later)
    values = {o.name: o.as_array().reshape(-1)[0] for o in later.outputs}
    assert int(values["num_input_tokens"]) == 3 and float(values["cumulative_logprob"]) == -1.5
