"""The bounds of one LLM request (proto/llm_limits.py), each at its limit and one past it: what is taken,
what is refused (a 400, INVALID_ARG, in vLLM's words where vLLM has a limit of its own), and that the checks
neither recurse nor walk more of a hostile value than the limit. The routes that apply them:
tests/ingress/openai/test_openai_limits.py (the OpenAI ingress's requests), tests/workers/backends/vllm/
test_generate_request.py (the vLLM backend), tests/ingress/openai/test_llm_attacks_e2e.py (a real group)."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from conveyor.proto import llm_limits as lim
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"


def _refused(check: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConveyorError) as err:
        check(*args, **kwargs)
    assert err.value.status is Status.INVALID_ARG
    return err.value.message


def _nested(levels: int) -> Any:
    """``levels`` arrays inside each other, built without recursion."""
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_the_limits_are_vllms_own_where_it_has_them() -> None:
    """vLLM 0.32's defaults (envs.py, sampling_params.py); compared with the installed engine's own in
    tests/ingress/openai/test_llm_attacks_e2e.py (importing vLLM takes seconds)."""
    assert (lim.MAX_N, lim.MAX_PROMPTS, lim.MAX_STOP_STRINGS, lim.MAX_BAD_WORDS) == (16384, 1024, 4, 128)
    assert (lim.MAX_LOGPROBS, lim.MAX_JSON_DEPTH, lim.STRUCTURAL_TAG_DEPTH) == (20, 64, 80)

def test_n_is_bounded_in_vllms_words() -> None:
    lim.check_n(1)
    lim.check_n(lim.MAX_N)
    assert _refused(lim.check_n, 2**31) == (
        "n must be at most 16384, got 2147483648. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment "
        "variable.")
    assert _refused(lim.check_n, 0) == "n must be at least 1, got 0."
    lim.check_choices(lim.MAX_N, 1)
    lim.check_choices(16, lim.MAX_CHOICES // 16)
    assert "at most 16384" in _refused(lim.check_choices, 17, 1024)


def test_prompts_and_messages_are_counted() -> None:
    lim.check_prompts(lim.MAX_PROMPTS)
    assert _refused(lim.check_prompts, lim.MAX_PROMPTS + 1).startswith(
        "prompt list length 1025 exceeds the maximum allowed count of 1024.")
    lim.check_messages(lim.MAX_MESSAGES)
    lim.check_message_parts(lim.MAX_MESSAGE_PARTS)
    assert f"at most {lim.MAX_MESSAGES}" in _refused(lim.check_messages, lim.MAX_MESSAGES + 1)
    assert f"at most {lim.MAX_MESSAGE_PARTS}" in _refused(lim.check_message_parts, lim.MAX_MESSAGE_PARTS + 1)


def test_stop_strings_bad_words_and_token_id_lists() -> None:
    lim.check_sampling({"stop": ["a"] * lim.MAX_STOP_STRINGS, "bad_words": ["w"] * lim.MAX_BAD_WORDS,
                        "stop_token_ids": [1] * lim.MAX_STOP_TOKEN_IDS,
                        "allowed_token_ids": [1] * lim.MAX_ALLOWED_TOKEN_IDS})
    lim.check_sampling({"stop": "x" * lim.MAX_STOP_CHARS})
    openai_route = functools.partial(lim.check_sampling, max_stop_strings=lim.MAX_STOP_STRINGS)
    assert _refused(openai_route, {"stop": ["a"] * 100_000}) == (
        "stop: List should have at most 4 items after validation, not 100000")  # pydantic's words in vLLM's server
    # Triton's routes take more (its vllm_backend bounds none), up to Conveyor's own bound.
    lim.check_sampling({"stop": ["a"] * lim.MAX_BACKEND_STOP_STRINGS})
    assert _refused(lim.check_sampling, {"stop": ["a"] * 100_000}) == (
        f"stop: List should have at most {lim.MAX_BACKEND_STOP_STRINGS} items after validation, not 100000")
    assert "at most 1024 characters" in _refused(lim.check_sampling, {"stop": "x" * (lim.MAX_STOP_CHARS + 1)})
    assert _refused(lim.check_sampling, {"bad_words": ["w"] * 129}) == (
        "Too many bad words after tokenization: 129. The max number is 128.")
    assert "at most 1024 characters" in _refused(lim.check_sampling, {"bad_words": ["w" * 1025]})
    for name, limit in (("stop_token_ids", lim.MAX_STOP_TOKEN_IDS), ("allowed_token_ids", lim.MAX_ALLOWED_TOKEN_IDS)):
        assert f"at most {limit}" in _refused(lim.check_sampling, {name: [1] * (limit + 1)})
        assert "less than or equal to 9223372036854775807" in _refused(lim.check_sampling, {name: [2**64]})


def test_integers_are_what_the_engines_transport_carries() -> None:
    """Past 64 bits vLLM's engine fails the request (MessagePack); its server refuses a seed past int64."""
    for name in ("seed", "max_tokens", "min_tokens", "top_k", "priority", "truncate_prompt_tokens"):
        lim.check_sampling({name: lim.INT64_MAX})
        lim.check_sampling({name: lim.INT64_MIN})
        assert _refused(lim.check_sampling, {name: 2**64}) == (
            f"{name}: Input should be less than or equal to 9223372036854775807")
        assert _refused(lim.check_sampling, {name: -(2**63) - 1}) == (
            f"{name}: Input should be greater than or equal to -9223372036854775808")
    assert "less than or equal" in _refused(lim.check_sampling, {"seed": str(2**64)})  # Triton's text parameters
    assert "less than or equal" in _refused(lim.check_sampling, {"seed": float(2**64)})  # orjson's reading of 2**64
    assert "at most 16384" in _refused(lim.check_sampling, {"n": "16385"})
    lim.check_sampling({"seed": "not a number", "n": [1], "stop": 5})  # the wrong type: the engine refuses it


def test_logprobs_are_bounded_where_the_maximum_is_known() -> None:
    lim.check_sampling({"logprobs": 20, "prompt_logprobs": 20}, max_logprobs=20)
    assert _refused(lim.check_sampling, {"logprobs": 21}, max_logprobs=20) == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20")
    assert _refused(lim.check_sampling, {"prompt_logprobs": 2**40}, max_logprobs=20) == (
        "Requested prompt logprobs of 1099511627776, which is greater than max allowed: 20")
    assert "whole vocabulary" in _refused(lim.check_sampling, {"logprobs": -1}, max_logprobs=20)
    assert _refused(lim.check_sampling, {"logprobs": -2}) == "`logprobs` must be a positive value or -1."
    lim.check_sampling({"logprobs": 50})  # the engine's own max_logprobs decides (a model may raise it)


def test_nesting_is_counted_as_vllm_counts_it_without_recursion() -> None:
    lim.check_depth(_nested(lim.MAX_JSON_DEPTH), "The JSON schema")
    assert _refused(lim.check_depth, _nested(lim.MAX_JSON_DEPTH + 1), "The JSON schema") == (
        "The JSON schema is nested too deeply: objects and arrays may nest at most 64 levels")
    assert "nested too deeply" in _refused(lim.check_depth, _nested(100_000), "x")  # past any recursion limit

def _props(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def test_a_schema_is_bounded_before_its_grammar_is_compiled() -> None:
    lim.check_schema(_props(lim.MAX_OBJECT_PROPERTIES))
    assert "an object of 12000 properties" in _refused(lim.check_schema, _props(12_000))
    lim.check_schema({"type": "object", "properties": {f"o{i}": _props(256) for i in range(3)}})
    assert f"more than {lim.MAX_SCHEMA_PROPERTIES} properties" in _refused(
        lim.check_schema, {"type": "object", "properties": {f"o{i}": _props(256) for i in range(4)}})
    assert f"more than {lim.MAX_SCHEMA_ENUM_VALUES} `enum` values" in _refused(
        lim.check_schema, {"type": "string", "enum": [str(i) for i in range(1001)]})
    assert f"more than {lim.MAX_SCHEMA_CHARS} characters" in _refused(
        lim.check_schema, {"type": "string", "description": "x" * (lim.MAX_SCHEMA_CHARS + 1)})
    one_of: Any = {"type": "string"}  # oneOf copied into itself: each level doubles the schema
    for _ in range(14):
        one_of = {"oneOf": [{"type": "object", "properties": {"x": one_of}}, {"type": "array", "items": one_of}]}
    assert f"more than {lim.MAX_SCHEMA_NODES} JSON values" in _refused(lim.check_schema, one_of)
    assert "nested too deeply" in _refused(lim.check_schema, {"items": _nested(200)})


def test_a_schema_budget_spans_several_schemas() -> None:
    budget = lim.SchemaBudget("`tools`")
    for _ in range(4):
        budget.add(_props(256))
    budget.add_text("a description")
    with pytest.raises(ConveyorError, match="more than 1024 properties"):
        budget.add(_props(1))


def test_a_constraint_is_bounded_whatever_its_kind() -> None:
    lim.check_constraint({"json": _props(8)})
    lim.check_constraint(json.dumps({"json": json.dumps(_props(8))}))  # Triton's text, and a schema as text
    assert "an object of 300 properties" in _refused(lim.check_constraint, {"json": json.dumps(_props(300))})
    assert "an object of 300 properties" in _refused(lim.check_constraint, json.dumps({"json": _props(300)}))
    lim.check_constraint({"regex": "a" * lim.MAX_REGEX_CHARS, "grammar": "g" * lim.MAX_GRAMMAR_CHARS})
    assert "structured_outputs.regex has 1025 characters" in _refused(lim.check_constraint, {"regex": "a" * 1025})
    assert "structured_outputs.grammar has 4097" in _refused(lim.check_constraint, {"grammar": "g" * 4097})
    assert "at most 1000" in _refused(lim.check_constraint, {"choice": ["c"] * 1001})
    deep = json.dumps({"json": _nested(65)})
    assert "nested too deeply" in _refused(lim.check_constraint, deep)
    assert "nested too deeply" in _refused(lim.check_constraint, {"json": "[" * 5000 + "]" * 5000})  # orjson's depth
    lim.check_constraint({"structural_tag": json.dumps(_nested(lim.STRUCTURAL_TAG_DEPTH))})  # vLLM's 16 more
    assert "nested too deeply" in _refused(
        lim.check_constraint, {"structural_tag": json.dumps(_nested(lim.STRUCTURAL_TAG_DEPTH + 1))})
    lim.check_constraint({"json": "not json"})  # the engine refuses it in its own words
    assert "nested too deeply" in _refused(lim.check_sampling, {"guided_decoding": {"json": _nested(65)}})


def test_a_body_is_counted_before_it_is_decoded() -> None:
    lim.check_body_values(b"[" + b",".join([b"1"] * lim.MAX_BODY_VALUES) + b"]")
    assert f"more than {lim.MAX_BODY_VALUES} JSON values" in _refused(
        lim.check_body_values, b'{"stop": [' + b",".join([b'"a"'] * (lim.MAX_BODY_VALUES + 1)) + b"]}")
