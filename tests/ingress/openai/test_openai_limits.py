"""The OpenAI ingress's requests within proto/llm_limits.py's bounds, without a group: the body decoded and
checked as ``/v1/completions`` and ``/v1/chat/completions`` check it (ingress/openai/schema.py, tools.py)
before anything is allocated per choice, message or tool; vLLM's fields passed to the engine or refused,
never ignored. Against a real group and the tiny Llama: test_llm_attacks_e2e.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conveyor.ingress.openai.contract import tensor_inputs
from conveyor.ingress.openai.schema import (
    ChatRequest,
    CompletionRequest,
    chat_messages,
    decode,
    sampling_parameters,
)
from conveyor.ingress.openai.tools import plan
from conveyor.proto import llm_limits as lim
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.signature import ModelSignature, TensorSpec

LEVEL = "unit"

CHAT = [{"role": "user", "content": "hi"}]


def _completion(**fields: Any) -> dict[str, Any]:
    request = decode(msgspec.json.encode({"model": "m", "prompt": "a", **fields}), CompletionRequest)
    return sampling_parameters(request, request.max_tokens or 16)


def _chat(**fields: Any) -> ChatRequest:
    return decode(msgspec.json.encode({"model": "m", "messages": CHAT, **fields}), ChatRequest)


def _refused(call: Any, *args: Any, **fields: Any) -> str:
    with pytest.raises(ConveyorError) as err:
        call(*args, **fields)
    assert err.value.status is Status.INVALID_ARG
    return err.value.message


def test_n_past_vllms_limit_is_refused_in_its_words() -> None:
    assert _completion(n=lim.MAX_N, temperature=1)["n"] == lim.MAX_N
    assert _refused(_completion, n=2**31, temperature=1).startswith("n must be at most 16384, got 2147483648.")
    assert _refused(_completion, n=0).startswith("n must be at least 1")


def test_integers_past_64_bits_are_400s() -> None:
    for name in ("seed", "max_tokens", "min_tokens", "top_k", "priority"):
        assert _refused(_completion, **{name: 2**64}) == (
            f"{name}: Input should be less than or equal to 9223372036854775807")
    assert "max_tokens: Input" in _refused(lambda: sampling_parameters(_chat(max_completion_tokens=2**64), 2**64))


def test_stop_strings_and_logprobs_are_bounded() -> None:
    assert _completion(stop=["a", "b", "c", "d"])["stop"] == ["a", "b", "c", "d"]
    assert _refused(_completion, stop=["s"] * 100_000) == (
        "stop: List should have at most 4 items after validation, not 100000")
    assert "at most 1024 characters" in _refused(_completion, stop="x" * 1025)
    assert _completion(logprobs=20)["logprobs"] == 20
    assert _refused(_completion, logprobs=21) == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20")
    chat = _chat(logprobs=True, top_logprobs=21)
    assert "greater than max allowed: 20" in _refused(sampling_parameters, chat, 16)
    assert _refused(sampling_parameters, _chat(top_logprobs=5), 16) == (
        "`top_logprobs` can only be used when `logprobs` is True")  # Triton's frontend's words


def test_vllms_sampling_fields_reach_the_engine() -> None:
    """Each passed to vLLM's SamplingParams (the engine's scheduler for ``priority``), not ignored."""
    fields = {"stop_token_ids": [5, 7], "bad_words": ["fox"], "allowed_token_ids": [1, 2, 3], "priority": -1,
              "include_stop_str_in_output": True, "skip_special_tokens": False,
              "spaces_between_special_tokens": False}
    params = _completion(**fields)
    assert {k: params[k] for k in fields} == fields
    assert "priority" not in _completion()  # vLLM's default, 0, is no field
    assert "1025 token ids; at most 1024" in _refused(_completion, stop_token_ids=[1] * 1025)
    assert "Too many bad words" in _refused(_completion, bad_words=["w"] * 129)


def test_vllms_fields_this_ingress_cannot_honour_are_400s() -> None:
    assert _refused(_completion, use_beam_search=True) == "use_beam_search is not supported"
    assert _refused(_completion, truncate_prompt_tokens=8) == "truncate_prompt_tokens is not supported"
    assert _refused(_completion, prompt_logprobs=1).startswith("prompt_logprobs is not supported")
    assert _refused(sampling_parameters, _chat(prompt_logprobs=1), 16) == "prompt_logprobs is not supported"


def test_a_model_without_sampling_parameters_refuses_what_it_cannot_take() -> None:
    sig = ModelSignature("trt", 0, {"text_input": TensorSpec("text_input", "BYTES", (1,))}, {})
    for name in ("stop_token_ids", "bad_words", "allowed_token_ids", "priority"):
        value = _completion(**{name: 1 if name == "priority" else ["1"] if name == "bad_words" else [1]})[name]
        assert "declares no 'sampling_parameters' input" in _refused(tensor_inputs, sig, {name: value}, "trt")


def _props(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def _one_of(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"oneOf": [{"type": "object", "properties": {"x": schema}}, {"type": "array", "items": schema}]}
    return schema


def test_schemas_the_compiler_would_choke_on_are_refused_up_front() -> None:
    """vllm#54003: 12,000 optional properties, or ``oneOf`` copied 14 levels deep, never finished compiling."""
    for schema, match in ((_props(12_000), "an object of 12000 properties"), (_one_of(14), "JSON values")):
        response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        assert match in _refused(_completion, response_format=response_format)
        assert match in _refused(_completion, structured_outputs={"json": schema})
    assert "nested too deeply" in _refused(_completion, structured_outputs={"json": _deep(65)})
    assert "regex has 1025 characters" in _refused(_completion, structured_outputs={"regex": "a" * 1025})
    assert "grammar has" in _refused(_completion, structured_outputs={"grammar": "g" * 4097})
    assert _completion(structured_outputs={"json": _props(8)})["structured_outputs"] == {"json": _props(8)}


def _deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_bodies_past_the_decoders_reach_are_400s_not_500s() -> None:
    body = b'{"model": "m", "prompt": "a", "zz": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert _refused(decode, body, CompletionRequest) == "the request body is nested too deeply to decode"
    body = b'{"model": "m", "prompt": "a", "stop": [' + b",".join([b'"a"'] * lim.MAX_BODY_VALUES) + b"]}"
    assert f"more than {lim.MAX_BODY_VALUES} JSON values" in _refused(decode, body, CompletionRequest)


def test_messages_are_counted_before_any_is_read() -> None:
    assert len(chat_messages(_chat(messages=CHAT * lim.MAX_MESSAGES))) == lim.MAX_MESSAGES
    assert f"at most {lim.MAX_MESSAGES}" in _refused(chat_messages, _chat(messages=CHAT * 100_000))
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}] * (lim.MAX_MESSAGE_PARTS + 1)}]
    assert f"at most {lim.MAX_MESSAGE_PARTS}" in _refused(chat_messages, _chat(messages=parts))
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": _deep(65)}}]}
    assert "a tool call's arguments is nested too deeply" in _refused(chat_messages, _chat(messages=[*CHAT, call]))


def _tool(name: str = "f", parameters: Any = None, description: str | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters or {"type": "object"}}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def test_tools_are_bounded_together() -> None:
    many = [_tool(f"f{i}") for i in range(lim.MAX_TOOLS)]
    assert plan(_chat(tools=many, tool_choice="none"), "") is not None
    assert f"at most {lim.MAX_TOOLS}" in _refused(plan, _chat(tools=[*many, _tool("g")], tool_choice="none"), "")
    huge = _tool(description="x" * (1 << 20))  # a megabyte of description reaches the prompt
    assert "characters of strings" in _refused(plan, _chat(tools=[huge], tool_choice="none"), "")
    deep = _tool(parameters={"type": "object", "properties": _deep(200)})
    assert "`tools` is nested too deeply" in _refused(plan, _chat(tools=[deep], tool_choice="none"), "")
    split = [_tool(f"f{i}", _props(256)) for i in range(5)]  # each within the limits, not all five together
    assert "more than 1024 properties" in _refused(plan, _chat(tools=split, tool_choice="none"), "")
    # ``required`` nests each tool's schema five levels deeper: one that fits alone may not fit there
    fits = _tool(parameters={"type": "object", "properties": {"a": _deep(61)}})
    assert plan(_chat(tools=[fits], tool_choice="none"), "") is not None
    assert "The JSON schema is nested too deeply" in _refused(plan, _chat(tools=[fits], tool_choice="required"),
                                                              "hermes")
