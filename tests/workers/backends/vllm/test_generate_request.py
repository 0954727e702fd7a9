"""Conveyor's additions to Triton's vLLM generation contract, as the backend reads and answers them
(``workers/backends/vllm/request.py``, ``outputs.py``): a prompt of token ids in ``input_ids``, and the
prompt's logprobs in ``prompt_logprobs``, once, the first token listed without a logprob; vLLM's
``priority``; and the sampling parameters' bounds (proto/llm_limits.py). With the
engine: tests/ingress/openai/test_openai_vllm_e2e.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from conveyor.proto.datatypes import split_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.workers.backends.base import RequestItem, WireTensor
from conveyor.workers.backends.vllm import outputs
from conveyor.workers.backends.vllm.request import parse, sampling_params

LEVEL = "unit"


def _item(**inputs: object) -> RequestItem:
    arrays = {"text_input": np.array([b""], dtype=object)}
    arrays.update({name: np.asarray(value) for name, value in inputs.items()})
    return RequestItem("r", arrays, [], {})


def test_input_ids_are_the_prompt() -> None:
    args = parse(_item(input_ids=np.array([1, 5, 9], dtype=np.int32), return_prompt_logprobs=np.array([True])))
    assert args.prompt == [1, 5, 9] and "return_prompt_logprobs" in args.returns
    assert parse(_item()).prompt == ""
    with pytest.raises(ConveyorError, match="'input_ids' is empty"):
        parse(_item(input_ids=np.array([], dtype=np.int32)))


def _lp(value: float, rank: int, text: str) -> SimpleNamespace:
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=text)


def _strings(tensor: WireTensor | np.ndarray) -> list[str]:
    assert isinstance(tensor, WireTensor)
    return [b.decode() for b in split_bytes(tensor.data, tensor.shape[0])]


def test_the_prompts_logprobs_come_once_the_first_token_without_one() -> None:
    state = outputs.ResponseState(1, decode=lambda token: f"<{token}>")
    seq = SimpleNamespace(index=0, text="x", token_ids=[4], logprobs=None, finish_reason=None, cumulative_logprob=0)
    prompt_lp = [None, {7: _lp(-1.5, 3, "b"), 2: _lp(-0.1, 1, "c")}, {8: _lp(float("-inf"), 9, "d")}]
    state.merge(SimpleNamespace(prompt=None, prompt_token_ids=[1, 7, 8], prompt_logprobs=prompt_lp, outputs=[seq],
                                num_cached_tokens=0))
    returns = frozenset({"return_prompt_logprobs"})
    first = json.loads(_strings(outputs.build(state, False, returns)["prompt_logprobs"])[0])
    assert first == [{"1": {"logprob": None, "rank": None, "decoded_token": "<1>"}},
                     {"7": {"logprob": -1.5, "rank": 3, "decoded_token": "b"},
                      "2": {"logprob": -0.1, "rank": 1, "decoded_token": "c"}},
                     {"8": {"logprob": outputs.MIN_LOGPROB, "rank": 9, "decoded_token": "d"}}]  # no -inf in JSON
    state.merge(SimpleNamespace(prompt=None, prompt_token_ids=[1, 7, 8], prompt_logprobs=prompt_lp, outputs=[seq],
                                num_cached_tokens=0))
    again = outputs.build(state, False, returns)["prompt_logprobs"]
    assert _strings(again) == ["null"]


def test_the_cached_prompt_tokens_are_reported_when_asked() -> None:
    state = outputs.ResponseState(1)
    seq = SimpleNamespace(index=0, text="x", token_ids=[4], logprobs=None, finish_reason=None, cumulative_logprob=0)
    state.merge(SimpleNamespace(prompt=None, prompt_token_ids=list(range(200)), prompt_logprobs=None, outputs=[seq],
                                num_cached_tokens=128))
    assert "num_cached_tokens" not in outputs.build(state, False, frozenset())
    tensor = outputs.build(state, False, frozenset({"return_num_cached_tokens"}))["num_cached_tokens"]
    assert isinstance(tensor, WireTensor) and tensor.datatype == "UINT32" and tensor.data == (128).to_bytes(4, "little")


def _sampling(values: object) -> RequestItem:
    return _item(sampling_parameters=np.array([json.dumps(values).encode()], dtype=object))


def test_sampling_parameters_are_bounded_before_the_engine_sees_them() -> None:
    """proto/llm_limits.py on the backend's every protocol (KServe infer, gRPC, generate); checked before vLLM
    is even imported."""
    with pytest.raises(ConveyorError, match="stop: List should have at most 256 items") as err:
        sampling_params(parse(_sampling({"stop": ["a"] * 100_000})).sampling, final_only=True)
    assert err.value.status is Status.INVALID_ARG
    with pytest.raises(ConveyorError, match="seed: Input should be less than or equal to 9223372036854775807"):
        sampling_params({"seed": 2**64}, final_only=True)  # past 64 bits vLLM's engine fails the request: a 500
    with pytest.raises(ConveyorError, match="nested too deeply"):
        sampling_params({"structured_outputs": json.dumps({"json": "[" * 100 + "]" * 100})}, final_only=True)


def test_sampling_parameters_nested_past_the_decoder_are_a_400() -> None:
    with pytest.raises(ConveyorError, match="'sampling_parameters' is nested too deeply") as err:
        parse(_item(sampling_parameters=np.array([b"[" * 100_000 + b"]" * 100_000], dtype=object)))
    assert err.value.status is Status.INVALID_ARG


def test_priority_is_the_engines_not_a_sampling_parameter() -> None:
    args = parse(_sampling({"priority": -3, "max_tokens": 2}))
    assert args.priority == -3 and args.sampling == {"max_tokens": 2}
    assert parse(_sampling({"max_tokens": 2})).priority == 0
    for bad, match in ((2**64, "priority: Input should be less than or equal"), ("soon", "cannot use 'soon' as int")):
        with pytest.raises(ConveyorError, match=match):
            parse(_sampling({"priority": bad}))
