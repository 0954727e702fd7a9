"""The pure parts of ``/v1/embeddings`` (``embeddings.py``): the body's prompts and their limit, the
encodings, the request each prompt becomes on Triton's contract, the answer read back, and a model's
refusal of a task read as vLLM's words. Against the real engine: test_openai_vllm_e2e.py."""

from __future__ import annotations

import base64
import struct
from typing import Any

import numpy as np
import orjson
import pytest

from conveyor.ingress.dataplane import InferResult, OutputTensor
from conveyor.ingress.openai.catalog import LlmModel
from conveyor.ingress.openai.contract import EMBEDDING_INPUT, api_refused, contract_of, task_refused
from conveyor.ingress.openai.embeddings import (
    MAX_INPUTS,
    EmbeddingRequest,
    _encoded,
    embed_call,
    encoder,
    prompts,
    read_answer,
)
from conveyor.ingress.openai.schema import decode
from conveyor.proto.datatypes import pack_bytes
from conveyor.proto.errors import ConveyorError, Status, internal, invalid_arg, unsupported
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"


def test_input_is_one_or_more_prompts_of_text_or_token_ids() -> None:
    assert prompts("a b") == ["a b"]
    assert prompts(["a", "b"]) == ["a", "b"]
    assert prompts([1, 2, 3]) == [[1, 2, 3]]
    assert prompts([[1, 2], [3]]) == [[1, 2], [3]]
    for bad in ([], ["a", 1], [[1], []], [True, 2], [-1], [[1, "a"]], [{"a": 1}]):
        with pytest.raises(ConveyorError) as err:
            prompts(bad)
        assert err.value.status is Status.INVALID_ARG, bad


def test_more_prompts_than_the_limit_are_refused_before_any_request() -> None:
    assert len(prompts(["x"] * MAX_INPUTS)) == MAX_INPUTS
    with pytest.raises(ConveyorError, match=f"maximum allowed count of {MAX_INPUTS}") as err:
        prompts(["x"] * (MAX_INPUTS + 1))
    assert err.value.status is Status.INVALID_ARG
    # a million ids is one prompt; lists of them not
    with pytest.raises(ConveyorError, match=f"maximum allowed count of {MAX_INPUTS}"):
        prompts([[1]] * (MAX_INPUTS + 1))


def test_the_body_decodes_with_openais_and_vllms_fields() -> None:
    body = orjson.dumps({"model": "m", "input": ["a"], "encoding_format": "base64", "dimensions": 8, "user": "u",
                         "use_activation": False})
    request = decode(body, EmbeddingRequest)
    assert (request.model, request.input, request.dimensions, request.use_activation) == ("m", ["a"], 8, False)
    assert encoder(request) in ("<f4", ">f4")
    for field, value in (("encoding_format", "bytes"), ("embed_dtype", "float16"), ("endianness", "middle")):
        with pytest.raises(ConveyorError, match=field):
            encoder(decode(orjson.dumps({"model": "m", "input": "a", field: value}), EmbeddingRequest))


def test_base64_is_the_float32_bytes_in_the_asked_order() -> None:
    vector = np.array([1.5, -0.25, 3.0e-8], dtype=np.float32)
    assert base64.b64decode(str(_encoded(vector, "base64", "<f4"))) == struct.pack("<3f", *vector.tolist())
    assert base64.b64decode(str(_encoded(vector, "base64", ">f4"))) == struct.pack(">3f", *vector.tolist())
    floats = orjson.loads(orjson.dumps(_encoded(vector, "float", "<f4"), option=orjson.OPT_SERIALIZE_NUMPY))
    assert np.array(floats, dtype=np.float32).tolist() == vector.tolist()  # float32's shortest text reads back


def _vllm_sig() -> ModelSignature:
    inputs = {n: TensorSpec(n, dt, (1,), n != "text_input") for n, dt in (
        ("text_input", "BYTES"), ("stream", "BOOL"), ("sampling_parameters", "BYTES"), (EMBEDDING_INPUT, "BYTES"),
        ("return_num_input_tokens", "BOOL"), ("return_num_output_tokens", "BOOL"))}
    outputs = {n: TensorSpec(n, dt, (-1,)) for n, dt in (
        ("text_output", "BYTES"), ("num_input_tokens", "UINT32"), ("num_output_tokens", "UINT32"))}
    return ModelSignature("m", 0, inputs, outputs, True)


def test_each_prompt_is_one_request_on_tritons_embedding_contract() -> None:
    sig = _vllm_sig()
    contract = contract_of(sig)
    assert contract is not None
    model = LlmModel("m", sig, contract, "/nowhere", {}, 0)
    call = embed_call(model, [5, 6], {"dimensions": [4]}, "rid-1")
    values: dict[str, Any] = {i.name: i.data[0] for i in call.inputs if i.data is not None}
    assert (call.model, call.id) == ("m", "rid-1")
    assert orjson.loads(values[EMBEDDING_INPUT]) == {"input": [5, 6], "pooling_params": {"dimensions": [4]}}
    assert values["text_input"] == b"" and values["return_num_input_tokens"] and values["return_num_output_tokens"]
    assert "stream" not in values and "sampling_parameters" not in values


def _result(outputs: dict[str, tuple[str, bytes]]) -> InferResult:
    tensors = [OutputTensor(n, dt, [1], np.frombuffer(raw, dtype=np.uint8)) for n, (dt, raw) in outputs.items()]
    return InferResult("m", "1", "rid", tensors, {}, [], None)  # type: ignore[arg-type]  # nothing to release


def test_the_answer_is_the_vector_and_the_prompts_length() -> None:
    exact = np.float32(0.1).item()  # a float32 as the double that equals it (the worker's JSON)
    found = read_answer(_result({"text_output": ("BYTES", pack_bytes([orjson.dumps([exact, -2.0])])),
                                 "num_input_tokens": ("UINT32", struct.pack("<I", 7))}))
    assert found.vector.dtype == np.float32 and found.vector.tolist() == [exact, -2.0] and found.prompt_tokens == 7
    with pytest.raises(ConveyorError, match="no embedding"):
        read_answer(_result({"text_output": ("BYTES", pack_bytes([b'"text"']))}))


def test_a_models_refusal_of_a_task_is_vllms_400() -> None:
    assert task_refused(unsupported("Model m does not support 'embed' request"), "embed")
    assert task_refused(internal("Error generating stream: Model m does not support 'generate' request"), "generate")
    assert not task_refused(unsupported("Model m does not support 'embed' request"), "generate")
    assert not task_refused(invalid_arg("Model m does not support 'embed' request"), "embed")
    refused = api_refused("Embeddings")
    assert (refused.status, refused.message) == (Status.INVALID_ARG, "The model does not support Embeddings API")
