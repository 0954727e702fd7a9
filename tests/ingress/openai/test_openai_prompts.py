"""The pure parts of several prompts and token-id prompts on ``/v1/completions`` (``prompts.py``): the
``prompt`` field read as vLLM's server reads it, ids checked against what INT32 carries in vLLM's words,
the limit on prompts, the ids as the model's ``input_ids`` input, and several requests' steps merged
into one answer whose choices are numbered across prompts. With the engine:
tests/ingress/openai/test_openai_vllm_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
import pytest

from conveyor.ingress.openai.catalog import LlmModel, Target
from conveyor.ingress.openai.contract import Contract
from conveyor.ingress.openai.generation import Step, TokenLogprob, engine_call
from conveyor.ingress.openai.prompts import MAX_PROMPTS, MAX_TOKEN_ID, merged, read_prompts
from conveyor.ingress.openai.schema import CompletionRequest, decode, sampling_parameters
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"


def _refused(value: object) -> str:
    with pytest.raises(ConveyorError) as err:
        read_prompts(value, "prompt")  # type: ignore[arg-type]
    assert err.value.status is Status.INVALID_ARG
    return err.value.message


def test_prompt_is_text_texts_ids_or_lists_of_ids() -> None:
    assert read_prompts("a b", "prompt") == ["a b"]
    assert read_prompts(["a", "b"], "prompt") == ["a", "b"]
    assert read_prompts([1, 2, 3], "prompt") == [[1, 2, 3]]
    assert read_prompts([[1, 2], [3]], "prompt") == [[1, 2], [3]]
    for bad in ([], ["a", 1], [[1], []], [True, 2], [[1, "a"]], [{"a": 1}], [1.5]):
        assert "prompt" in _refused(bad), bad


def test_ids_int32_cannot_carry_are_out_of_vocabulary_in_vllms_words() -> None:
    assert read_prompts([0, MAX_TOKEN_ID], "prompt") == [[0, MAX_TOKEN_ID]]
    assert _refused([1, -1]) == "Token id -1 is out of vocabulary"
    assert _refused([[1], [MAX_TOKEN_ID + 1]]) == f"Token id {MAX_TOKEN_ID + 1} is out of vocabulary"


def test_more_prompts_than_the_limit_are_refused_before_any_request() -> None:
    """vLLM's VLLM_MAX_COMPLETION_PROMPTS, in its words; a list of ids is one prompt, however long."""
    assert len(read_prompts(["x"] * MAX_PROMPTS, "prompt")) == MAX_PROMPTS
    assert _refused(["x"] * (MAX_PROMPTS + 1)) == (
        f"prompt list length {MAX_PROMPTS + 1} exceeds the maximum allowed count of {MAX_PROMPTS}. To increase this "
        "limit, set the VLLM_MAX_COMPLETION_PROMPTS environment variable.")
    assert f"maximum allowed count of {MAX_PROMPTS}" in _refused([[1]] * (MAX_PROMPTS + 1))
    assert read_prompts([1] * (MAX_PROMPTS + 1), "prompt") == [[1] * (MAX_PROMPTS + 1)]


def test_echo_with_logprobs_asks_the_engine_for_the_prompts_logprobs() -> None:
    def params(body: bytes) -> dict[str, object]:
        return sampling_parameters(decode(body, CompletionRequest), 4)

    assert params(b'{"model": "m", "prompt": "a", "echo": true, "logprobs": 2}')["prompt_logprobs"] == 2
    assert "prompt_logprobs" not in params(b'{"model": "m", "prompt": "a", "logprobs": 2}')
    assert "prompt_logprobs" not in params(b'{"model": "m", "prompt": [1, 2], "echo": true}')


def _target(inputs: dict[str, str]) -> Target:
    sig = ModelSignature("m", 0, {n: TensorSpec(n, dt, (-1,)) for n, dt in inputs.items()},
                         {"text_output": TensorSpec("text_output", "BYTES", (-1,))}, decoupled=True)
    return Target(LlmModel("m", sig, Contract(True, True, True), "/m", {}, 0), None)


def test_ids_go_in_input_ids_and_a_model_without_it_refuses() -> None:
    target = _target({"text_input": "BYTES", "sampling_parameters": "BYTES", "input_ids": "INT32",
                      "return_prompt_logprobs": "BOOL"})
    call = engine_call(target, [5, 6, 7], {"n": 1, "prompt_logprobs": 1}, False)
    inputs = {i.name: i for i in call.inputs}
    data = {name: i.data for name, i in inputs.items() if isinstance(i.data, np.ndarray)}
    assert data["text_input"].tolist() == [b""]
    assert (inputs["input_ids"].datatype, inputs["input_ids"].shape) == ("INT32", [3])
    assert (data["input_ids"].dtype, data["input_ids"].tolist()) == (np.int32, [5, 6, 7])
    assert data["return_prompt_logprobs"].tolist() == [True]
    bare = _target({"text_input": "BYTES", "sampling_parameters": "BYTES"})
    with pytest.raises(ConveyorError, match="'input_ids'"):
        engine_call(bare, [5], {"n": 1}, False)
    with pytest.raises(ConveyorError, match="'return_prompt_logprobs'"):
        engine_call(bare, "a", {"n": 1, "prompt_logprobs": 0}, False)


async def _steps(*items: Step | Exception, delay: float = 0) -> AsyncGenerator[Step, None]:
    for item in items:
        await asyncio.sleep(delay)
        if isinstance(item, Exception):
            raise item
        yield item


def _step(texts: list[str], prompt_tokens: int | None = None, final: bool = False) -> Step:
    first = [TokenLogprob("<s>", None, [])]
    return Step(texts, [None] * len(texts), prompt_tokens, len(texts), final,
                prompt_logprobs=[first] * len(texts) if prompt_tokens is not None else None)


def _run(streams: list[AsyncGenerator[Step, None]], n: int) -> list[Step]:
    async def collect() -> list[Step]:
        return [step async for step in merged(streams, n)]

    return asyncio.run(collect())


def test_several_prompts_are_one_answer_with_choices_numbered_across_prompts() -> None:
    found = _run([_steps(_step(["a0", "a1"], 3), _step(["b0", "b1"], final=True), delay=0.01),
                  _steps(_step(["c0", "c1"], 4), _step(["d0", "d1"], final=True))], n=2)
    texts = [""] * 4
    for step in found:
        lo, hi = step.span or (0, 4)
        assert len(step.texts) == hi - lo  # a step holds its own prompt's choices only, not the whole answer's
        for i in range(lo, hi):
            texts[i] += step.texts[i - lo]
    assert texts == ["a0b0", "a1b1", "c0d0", "c1d1"]
    assert found[-1].final and found[-1].prompt_tokens == 7 and not any(s.final for s in found[:-1])
    placed = [s for s in found if s.prompt_logprobs is not None]
    assert {s.span for s in placed} == {(0, 2), (2, 4)}
    assert all(len(s.prompt_logprobs) == 2 for s in placed)  # type: ignore[arg-type]


def test_one_prompts_steps_pass_as_they_are() -> None:
    only = _step(["x"], 2, final=True)
    assert _run([_steps(only)], n=1) == [only]


def test_an_error_of_one_prompt_ends_the_answer_and_cancels_the_others() -> None:
    cancelled = []

    async def slow() -> AsyncGenerator[Step, None]:
        try:
            yield _step(["a"], 1)
            await asyncio.sleep(30)
            yield _step(["never"])
        finally:
            cancelled.append(True)

    with pytest.raises(ConveyorError, match="boom"):
        _run([slow(), _steps(ConveyorError(Status.INVALID_ARG, "boom"), delay=0.05)], n=1)
    assert cancelled == [True]



def test_usage_shows_the_cached_prompt_tokens_where_the_model_reports_them() -> None:
    from conveyor.ingress.openai.generation import Step, Usage

    usage = Usage()
    usage.add(Step([""], [None], 200, 1, True, cached_tokens=128))
    assert usage.wire() == {"prompt_tokens": 200, "completion_tokens": 1, "total_tokens": 201,
                            "prompt_tokens_details": {"cached_tokens": 128}}
    plain = Usage()
    plain.add(Step([""], [None], 200, 1, True))  # a model that does not report them: no details
    assert plain.wire() == {"prompt_tokens": 200, "completion_tokens": 1, "total_tokens": 201}
