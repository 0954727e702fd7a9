"""The pure parts of serving any generative model on the OpenAI routes: which models are generative and
how a request reaches them (``contract.py``), where the tokenizer lives (``tokenizer.py``), the chat
fallback without a template, and unknown request fields. The routes themselves, against a group:
tests/ingress/openai/test_openai_ingress.py."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncGenerator

import numpy as np
import pytest

from conveyor.ingress.openai.chat_template import PLAIN
from conveyor.ingress.openai.contract import Contract, contract_of, tensor_inputs
from conveyor.ingress.openai.generation import Step, Usage, counted
from conveyor.ingress.openai.schema import CompletionRequest, decode
from conveyor.ingress.openai.tokenizer import Tokenizer, tokenizer_folder
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"


def _sig(inputs: dict[str, tuple[str, tuple[int, ...]]], outputs: dict[str, str], *, decoupled: bool = False,
         batch: int = 0) -> ModelSignature:
    specs = {n: TensorSpec(n, dt, dims, n != "text_input") for n, (dt, dims) in inputs.items()}
    return ModelSignature("m", batch, specs, {n: TensorSpec(n, dt, (-1,)) for n, dt in outputs.items()}, decoupled)


VLLM = _sig({"text_input": ("BYTES", (1,)), "stream": ("BOOL", (1,)), "sampling_parameters": ("BYTES", (1,))},
            {"text_output": "BYTES", "num_input_tokens": "UINT32", "num_output_tokens": "UINT32"}, decoupled=True)
TRTLLM = _sig({"text_input": ("BYTES", (1,)), "max_tokens": ("INT32", (1,)), "temperature": ("FP32", (1,)),
               "random_seed": ("UINT64", (1,)), "stop_words": ("BYTES", (-1,))}, {"text_output": "BYTES"}, batch=8)


def test_a_model_with_text_in_and_out_is_generative_decoupled_or_not() -> None:
    assert contract_of(VLLM) == Contract(decoupled=True, sampling_json=True, counts_tokens=True)
    assert contract_of(TRTLLM) == Contract(decoupled=False, sampling_json=False, counts_tokens=False)
    assert contract_of(_sig({"text_input": ("BYTES", (1,))}, {"text_output": "FP32"})) is None
    assert contract_of(_sig({"INPUT0": ("BYTES", (1,))}, {"text_output": "BYTES"})) is None


def test_sampling_fields_go_into_the_inputs_the_model_declares() -> None:
    params = {"n": 1, "max_tokens": 5, "temperature": 0.5, "seed": 7, "stop": ["x", "yy"], "top_p": 0.9}
    inputs = {i.name: i for i in tensor_inputs(TRTLLM, params, "m")}
    assert sorted(inputs) == ["max_tokens", "random_seed", "stop_words", "temperature"]  # no top_p input: not sent
    assert (inputs["max_tokens"].shape, inputs["max_tokens"].data.dtype) == ([1, 1], np.int32)  # type: ignore[union-attr]
    assert inputs["random_seed"].data.tolist() == [7] and inputs["random_seed"].datatype == "UINT64"  # type: ignore[union-attr]
    assert inputs["stop_words"].shape == [1, 2] and inputs["stop_words"].data.tolist() == [b"x", b"yy"]  # type: ignore[union-attr]
    assert inputs["temperature"].data.dtype == np.float32  # type: ignore[union-attr]


@pytest.mark.parametrize(("params", "says"), [
    ({"n": 2}, "n must be 1"),
    ({"structured_outputs": {"json_object": True}}, "guided decoding"),
    ({"lora_name": "sql"}, "LoRA"),
])
def test_what_only_sampling_parameters_can_carry_is_a_400(params: dict[str, object], says: str) -> None:
    with pytest.raises(ConveyorError) as err:
        tensor_inputs(TRTLLM, params, "m")
    assert err.value.status is Status.INVALID_ARG and says in err.value.message


def test_the_tokenizer_folder_is_the_parameter_then_model_json_then_the_version_directory(tmp_path: str) -> None:
    model = os.path.join(tmp_path, "m")
    version = os.path.join(model, "1")
    os.makedirs(os.path.join(model, "tok"))
    os.makedirs(os.path.join(version, "engine_tok"))
    assert tokenizer_folder(version, {}, {}) is None  # nothing: no tokenizer
    open(os.path.join(version, "tokenizer_config.json"), "w").close()
    assert tokenizer_folder(version, {}, {}) == version  # files beside model.py
    assert tokenizer_folder(version, {"model": "engine_tok"}, {}) == os.path.join(version, "engine_tok")
    assert tokenizer_folder(version, {"model": "org/name"}, {}) == "org/name"  # a hub id: refused when read
    # the parameter first; relative: the version directory, then the model's
    assert tokenizer_folder(version, {"model": "engine_tok"}, {"tokenizer": "tok"}) == os.path.join(model, "tok")
    assert tokenizer_folder(version, {}, {"tokenizer_dir": "/abs/tok"}) == "/abs/tok"


def test_chat_without_a_template_is_a_plain_transcript() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    assert PLAIN.prompt(messages) == "system: be brief\nuser: hi there\nassistant:"
    assert PLAIN.prompt(messages, add_generation_prompt=False) == "system: be brief\nuser: hi there"
    with pytest.raises(ConveyorError) as err:
        PLAIN.prompt(messages, tools=[{"type": "function", "function": {"name": "f"}}])
    assert err.value.status is Status.INVALID_ARG and "no chat template" in err.value.message


def test_unknown_fields_are_ignored_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "conveyor.ingress.openai.schema"):
        for _ in range(3):
            req = decode(b'{"model": "m", "prompt": "a", "max_token": 3, "x_unknown_thing": {}}', CompletionRequest)
            assert isinstance(req, CompletionRequest) and req.prompt == "a" and req.max_tokens is None
    logged = [r.getMessage() for r in caplog.records]
    assert sum("'max_token'" in m for m in logged) == 1 and sum("'x_unknown_thing'" in m for m in logged) == 1
    with pytest.raises(ConveyorError, match="max_tokens"):  # a known field's bad value is still a 400
        decode(b'{"model": "m", "prompt": "a", "zzz": 1, "max_tokens": "many"}', CompletionRequest)


def test_usage_counted_with_the_tokenizer_totals_the_whole_text_however_it_was_split() -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, pre_tokenizers

    backend = Backend(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pieces = ["hel", "lo wor", "ld", ""]  # words split across responses: 1 + 2 + 1 pieces, 2 words

    async def model_steps() -> AsyncGenerator[Step, None]:
        for i, text in enumerate(pieces):
            yield Step([text], [None], None, 0, i == len(pieces) - 1)

    async def usage() -> tuple[list[int], Usage]:
        total, per_step = Usage(), []
        async for step in counted(model_steps(), Tokenizer(backend, None), "hello world x", False):
            total.add(step)
            per_step.append(total.completion_tokens)
        return per_step, total

    per_step, total = asyncio.run(usage())
    assert per_step == [1, 3, 4, 2]  # the pieces' counts as they come, the whole text's at the end
    assert total.wire() == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
