"""How a vLLM model's tokens reach the OpenAI ingress and leave it: the backend's steps in the
responses' parameters (``proto/stream_steps.py``) read as its tensors are, and the responses a busy
reader finds waiting joined into one chunk (``generation.joined``) with the same text, logprobs,
finish reasons and usage as one chunk each. The real engine: tests/ingress/openai/test_openai_vllm_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any, cast

import msgspec
import numpy as np
import orjson

from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, OutputTensor, StreamError
from conveyor.ingress.openai.endpoints import ChatCompletions, Completions, EndpointOptions, Job
from conveyor.ingress.openai.generation import Step, TokenLogprob, _step, joined, steps
from conveyor.proto.stream_steps import STEP
from conveyor.workers.backends.base import WireTensor
from conveyor.workers.backends.vllm import outputs

LEVEL = "unit"

RETURNS = frozenset(("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens",
                     "return_num_cached_tokens", "return_logprobs", "return_prompt_logprobs"))


def _lp(value: float, rank: int, text: str) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=text)


def _engine_outputs() -> list[SimpleNamespace]:
    """Cumulative ``RequestOutput``s of an ``n`` = 2 request, as vLLM (v1) gives them: only the sequences
    that moved, each finishing once."""
    def seq(index: int, text: str, ids: list[int], finish: str | None = None) -> SimpleNamespace:
        logprobs = [{t: _lp(-0.5 * (k + 1), 1, f"t{t}"), 99: _lp(-3.0, 2, "alt")} for k, t in enumerate(ids)]
        return SimpleNamespace(index=index, text=text, token_ids=ids, logprobs=logprobs, finish_reason=finish,
                               stop_reason=None, cumulative_logprob=-1.0)

    prompt_lp = [None, {7: _lp(-1.25, 1, "b")}]

    def out(*seqs: SimpleNamespace) -> SimpleNamespace:
        return SimpleNamespace(prompt="a b", prompt_token_ids=[1, 7], prompt_logprobs=prompt_lp, outputs=list(seqs),
                               num_cached_tokens=1)

    return [out(seq(0, " x", [4]), seq(1, " y", [5])),
            out(seq(0, " x z", [4, 6])),
            out(seq(1, " y w", [5, 8], "length")),
            out(seq(0, " x z q", [4, 6, 9], "stop"))]


def _tensor_result(answer: dict[str, Any], final: bool) -> InferResult:
    found = []
    for name, tensor in answer.items():
        assert isinstance(tensor, WireTensor)
        found.append(OutputTensor(name, tensor.datatype, tensor.shape, np.frombuffer(tensor.data, dtype=np.uint8)))
    return InferResult("llm", "1", "rid", found, {}, [], cast(Any, None), final)


def _step_result(answer: Any, final: bool) -> InferResult:
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(dict(answer.parameters)))  # as the descriptor carries them
    return InferResult("llm", "1", "rid", [], wire, [], cast(Any, None), final)


def _backend_answers(as_steps: bool) -> list[InferResult | StreamError]:
    from conveyor.workers.backends.vllm.backend import VllmBackend

    state = outputs.ResponseState(2, decode=lambda token: f"<{token}>")
    answer = VllmBackend._steps if as_steps else VllmBackend._tensors
    found: list[InferResult | StreamError] = []
    engine = _engine_outputs()
    for i, out in enumerate(engine):
        state.merge(out)
        final = i == len(engine) - 1
        sent = answer(state, False, RETURNS, False)
        found.append(_step_result(sent, final) if as_steps else _tensor_result(dict(sent), final))
    return found


def test_a_step_in_the_parameters_reads_as_the_same_response_in_tensors() -> None:
    by_tensors = [_step(cast(InferResult, r), 2, 1) for r in _backend_answers(as_steps=False)]
    by_steps = [_step(cast(InferResult, r), 2, 1) for r in _backend_answers(as_steps=True)]
    assert by_steps == by_tensors
    assert [s.texts for s in by_steps] == [[" x", " y"], [" z", ""], ["", " w"], [" q", ""]]
    assert [s.finish for s in by_steps] == [[None, None], [None, None], [None, "length"], ["stop", None]]
    assert [s.output_tokens for s in by_steps] == [2, 1, 1, 1]
    assert by_steps[0].prompt_logprobs is not None and by_steps[1].prompt_logprobs is None  # once
    assert all(s.prompt_tokens == 2 and s.cached_tokens == 1 for s in by_steps)


def test_the_backend_answers_the_openai_ingress_without_tensors() -> None:
    from conveyor.workers.backends.vllm.backend import VllmBackend

    state = outputs.ResponseState(1)
    state.merge(SimpleNamespace(prompt="p", prompt_token_ids=[3], prompt_logprobs=None, num_cached_tokens=0,
                                outputs=[SimpleNamespace(index=0, text="a", token_ids=[4], logprobs=None,
                                                         finish_reason=None, cumulative_logprob=0.0)]))
    sent = VllmBackend._steps(state, False, frozenset(("return_num_output_tokens",)), True)
    assert len(sent) == 0  # no tensor: nothing to plan, copy or release
    params = sent.parameters
    assert params[STEP][:4] == [["a"], None, 1, None]
    assert params["conveyor_output_ids"] == [4] and params["conveyor_prompt_ids"] == [3]  # still resumable


def _steps_of(texts: list[str], finish: str = "length") -> list[Step]:
    return [Step([t], [finish if i == len(texts) - 1 else None], 5, 1, i == len(texts) - 1)
            for i, t in enumerate(texts)]


def test_the_backend_says_which_stop_string_ended_a_sequence() -> None:
    """vLLM's ``stop_reason`` where it is a string (the Anthropic ingress's ``stop_sequence``), in the step where
    the sequence finished; a stop token id is no stop string."""
    from conveyor.workers.backends.vllm.backend import VllmBackend

    def seq(index: int, text: str, ids: list[int], finish: str | None = None,
            stop: str | int | None = None) -> SimpleNamespace:
        return SimpleNamespace(index=index, text=text, token_ids=ids, logprobs=None, finish_reason=finish,
                               stop_reason=stop, cumulative_logprob=0.0)

    state = outputs.ResponseState(2)
    engine = [[seq(0, "a", [4]), seq(1, "b", [5])], [seq(0, "a", [4], "stop", "END")],
              [seq(1, "b c", [5, 6], "stop", 2)]]
    found = []
    for i, seqs in enumerate(engine):
        state.merge(SimpleNamespace(prompt="p", prompt_token_ids=[3], prompt_logprobs=None, num_cached_tokens=0,
                                    outputs=seqs))
        sent = VllmBackend._steps(state, False, RETURNS, False)
        found.append(_step(_step_result(sent, i == len(engine) - 1), 2, 0))
    assert [s.stops for s in found] == [None, ["END", None], None]
    assert joined(found).stops == ["END", None]
    # A step of an older backend (no such entry) has none.
    older = InferResult("llm", "1", "rid", [], {STEP: [["x"], ["stop"], 1, 2, 0, None, None]}, [], cast(Any, None),
                        True)
    assert _step(older, 1, 0).stops is None


def test_joined_steps_keep_every_token_in_order() -> None:
    by_one = _backend_answers(as_steps=True)
    found = [_step(cast(InferResult, r), 2, 1) for r in by_one]
    one = joined(found)
    assert one.texts == [" x z q", " y w"] and one.finish == ["stop", "length"]
    assert one.output_tokens == 5 and one.final and one.prompt_tokens == 2
    assert one.logprobs is not None
    assert [[t.token for t in tokens] for tokens in one.logprobs] == [["t4", "t6", "t9"], ["t5", "t8"]]
    assert one.prompt_logprobs == found[0].prompt_logprobs
    assert joined(found[:1]) is found[0]


class _Batches:
    """A data plane whose responses come in the batches a reader would find waiting."""

    def __init__(self, batches: list[list[InferResult | StreamError]]) -> None:
        self.batches = batches

    async def infer_stream_batches(self, call: InferCall) -> AsyncGenerator[list[InferResult | StreamError], None]:
        for batch in self.batches:
            yield batch


def _read(batches: list[list[InferResult | StreamError]], join_waiting: bool = True) -> list[Step]:
    async def read() -> list[Step]:
        return [s async for s in steps(cast(DataPlane, _Batches(batches)), InferCall("llm", "", []), 2, 1,
                                       join_waiting=join_waiting)]

    return asyncio.run(read())


def test_responses_that_waited_together_are_one_step() -> None:
    answers = _backend_answers(as_steps=True)
    one_each = _read([[r] for r in answers])
    answers = _backend_answers(as_steps=True)
    together = _read([answers[:1], list(answers[1:])])
    assert len(one_each) == 4 and len(together) == 2
    assert together[1] == joined(one_each[1:])
    assert joined(together) == joined(one_each)
    # Any other model streams as Triton's OpenAI frontend does: one step (one chunk) per response.
    assert _read([answers[:1], list(_backend_answers(as_steps=True)[1:])], join_waiting=False) == one_each


async def _aiter(found: list[Step]) -> AsyncGenerator[Step, None]:
    for step in found:
        yield step


def _chunks(endpoint: Any, job: Job, found: list[Step]) -> list[dict[str, Any]]:
    async def render() -> list[bytes]:
        rest = _aiter(found[1:])
        return [event.serialize() async for event in endpoint._events(job, found[0], rest)]

    wire = asyncio.run(render())
    assert wire[-1] == b"data: [DONE]\n\n"
    return [orjson.loads(chunk.removeprefix(b"data: ")) for chunk in wire[:-1]]


def _shown(chunks: list[dict[str, Any]], key: str) -> tuple[str, list[str | None], dict[str, Any] | None]:
    text, reasons = "", []
    for chunk in chunks:
        for choice in chunk["choices"]:
            text += choice["delta"]["content"] if key == "delta" else choice["text"]
            reasons.append(choice["finish_reason"])
    return text, [r for r in reasons if r], chunks[-1]["usage"]


def test_a_joined_chunk_shows_the_same_text_and_usage() -> None:
    texts = [" once", " upon", " a", " time"]
    for endpoint, key in ((ChatCompletions(cast(Any, None), cast(Any, None), EndpointOptions(1 << 20)), "delta"),
                          (Completions(cast(Any, None), cast(Any, None), EndpointOptions(1 << 20)), "text")):
        job = Job("id", "llm", 0, 1, None, include_usage=True, logprobs=False, continuous_usage=True)
        one_each = _chunks(endpoint, job, _steps_of(texts))
        together = _chunks(endpoint, job, [_steps_of(texts)[0], joined(_steps_of(texts)[1:])])
        assert len(one_each) == 5 and len(together) == 3  # the usage chunk last
        assert _shown(together, key) == _shown(one_each, key) == (
            "".join(texts), ["length"], {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9})
        assert together[1]["usage"] == one_each[3]["usage"]  # the tokens so far, on the joined chunk too


def test_a_token_without_text_still_streams_its_logprob() -> None:
    """As vLLM's server: with logprobs each token comes, a textless one (``</s>`` and what follows it with
    ``ignore_eos``) in a chunk of its own when it is alone in its step; the chunks' logprobs, joined, are the
    answer's that does not stream, their text offsets counted by the tokens (not by the text)."""
    texts = [" a", "", "", " b", ""]
    names = [" a", "</s>", "</s>", " b", "</s>"]

    def found() -> list[Step]:
        out = _steps_of(texts)
        for step, name in zip(out, names, strict=True):
            step.logprobs = [[TokenLogprob(name, -0.5, [(name, -0.5)], [(name, -0.5)])]]
        return out

    for endpoint, key in ((ChatCompletions(cast(Any, None), cast(Any, None), EndpointOptions(1 << 20)), "delta"),
                          (Completions(cast(Any, None), cast(Any, None), EndpointOptions(1 << 20)), "text")):
        tokens = joined(found()).logprobs
        assert tokens is not None
        whole = endpoint._logprobs(tokens[0], 0)
        job = Job("id", "llm", 0, 1, None, include_usage=True, logprobs=True, continuous_usage=False)
        for steps_in in (found(), [found()[0], joined(found()[1:3]), *found()[3:]]):
            chunks = _chunks(endpoint, job, steps_in)
            assert len(chunks) == len(steps_in) + 1 and _shown(chunks, key)[:2] == (" a b", ["length"])
            parts = [c["choices"][0]["logprobs"] for c in chunks[:-1]]  # the usage chunk last
            if key == "delta":
                assert [t for p in parts for t in p["content"]] == whole["content"]
            else:
                assert {k: [v for p in parts for v in p[k]] for k in whole} == whole
                assert whole["text_offset"] == [0, 2, 6, 10, 12]
        quiet = Job("id", "llm", 0, 1, None, include_usage=True, logprobs=False, continuous_usage=False)
        assert len(_chunks(endpoint, quiet, found())) == 4  # without logprobs a textless step has nothing to show
