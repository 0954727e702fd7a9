"""Tool calling's request side (ingress/openai/tools.py), without a group: the request's tools checked and
turned into guided decoding, and the reader each ``tool_choice`` needs (tool_parsers/ has the readers' tests)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from conveyor.ingress.openai.chat_template import ChatTemplate
from conveyor.ingress.openai.schema import ChatRequest, chat_messages, decode
from conveyor.ingress.openai.tool_parsers.hermes import HermesCalls
from conveyor.ingress.openai.tools import PARSER_PARAMETER, ToolPlan, plan
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time"}}  # no parameters
PARSER = "hermes"  # a model's TOOL_CALL_PARSER: a forced call needs one, as in vLLM


def _request(**fields: Any) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return decode(msgspec.json.encode(body), ChatRequest)


def _refused(match: str, **fields: Any) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        plan(_request(**fields), "")
    assert err.value.status is Status.INVALID_ARG


# ---------------------------------------------------------------------------------------------- the request


def test_a_named_function_is_forced_by_its_parameter_schema() -> None:
    p = plan(_request(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
             PARSER)
    assert p is not None and p.mode == "named" and p.named == "get_weather"
    assert p.constraint == WEATHER["function"]["parameters"]  # type: ignore[index]
    assert p.template_tools == [WEATHER, CLOCK]
    clock = plan(_request(tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}}),
                 PARSER)
    assert clock is not None and clock.constraint == {"type": "object", "properties": {}}  # as vLLM
    params: dict[str, Any] = {"n": 1}
    p.apply(params)
    assert params["structured_outputs"] == {"json": p.constraint}


def test_required_is_an_array_of_calls_one_branch_per_tool() -> None:
    p = plan(_request(tools=[WEATHER, CLOCK], tool_choice="required"), PARSER)
    assert p is not None and p.mode == "required" and p.constraint is not None
    assert p.constraint["type"] == "array" and p.constraint["minItems"] == 1 and "maxItems" not in p.constraint
    branches = p.constraint["items"]["anyOf"]
    assert [b["properties"]["name"]["enum"] for b in branches] == [["get_weather"], ["get_time"]]
    assert branches[0]["properties"]["parameters"] == WEATHER["function"]["parameters"]  # type: ignore[index]
    single = plan(_request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), PARSER)
    assert single is not None and single.constraint is not None and single.constraint["maxItems"] == 1


def test_defs_are_lifted_to_the_array_schema() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "string"}}}}}
    p = plan(_request(tools=[tool], tool_choice="required"), PARSER)
    assert p is not None and p.constraint is not None and p.constraint["$defs"] == {"P": {"type": "string"}}
    assert "$defs" not in p.constraint["items"]["anyOf"][0]["properties"]["parameters"]
    assert "$defs" in p.template_tools[0]["function"]["parameters"]  # the template sees the tool as sent


def test_none_keeps_the_tools_for_the_template_only() -> None:
    p = plan(_request(tools=[WEATHER], tool_choice="none"), "")
    assert p is not None and p.constraint is None and p.reader() is None and p.template_tools == [WEATHER]
    assert plan(_request(), "") is None and plan(_request(tool_choice="none"), "") is None


def test_auto_needs_the_models_parser() -> None:
    for fields in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}):
        _refused(PARSER_PARAMETER, **fields)
    p = plan(_request(tools=[WEATHER]), "hermes")
    assert p is not None and p.mode == "auto" and isinstance(p.reader(), HermesCalls)
    params: dict[str, Any] = {}
    p.apply(params)
    assert params == {"skip_special_tokens": False}  # <tool_call> is a special token in Hermes models
    with pytest.raises(ConveyorError, match="'nope' is not a tool-call parser") as err:
        plan(_request(tools=[WEATHER]), "nope")
    assert err.value.status is Status.INTERNAL  # the model's configuration, not the client's request


def test_a_forced_call_needs_the_models_parser_as_in_vllm() -> None:
    """vLLM refuses ``required`` and a named function without --tool-call-parser, in these words."""
    _refused('^tool_choice=function "get_weather" requires --tool-call-parser to be set', tools=[WEATHER],
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    _refused('^tool_choice="required" requires --tool-call-parser to be set', tools=[WEATHER], tool_choice="required")
    _refused('^"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
             tools=[WEATHER], tool_choice="auto")


def test_bad_tools_and_choices_are_400s() -> None:
    named = {"type": "function", "function": {"name": "launch"}}
    _refused("'launch', which is not in `tools`", tools=[WEATHER], tool_choice=named)
    _refused("needs `tools`", tool_choice="required")
    _refused("'sometimes' is not one of", tools=[WEATHER], tool_choice="sometimes")
    _refused("only tools of type 'function'", tools=[{"type": "retrieval", "function": {"name": "f"}}])
    _refused("1 to 64 letters", tools=[{"type": "function", "function": {"name": "get weather"}}],
             tool_choice="required")
    _refused("a JSON schema of an object",
             tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])
    _refused("twice", tools=[WEATHER, WEATHER], tool_choice="required")
    with pytest.raises(ConveyorError, match="tools"):  # no function at all: the body's decoding refuses it
        _request(tools=[{"type": "function"}])
    forced = plan(_request(tools=[WEATHER], tool_choice="required"), PARSER)
    assert forced is not None
    with pytest.raises(ConveyorError, match="cannot be combined with `response_format`"):
        forced.apply({"structured_outputs": {"json_object": True}})


def test_the_history_carries_calls_and_their_results() -> None:
    req = _request(messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
    ])
    messages = chat_messages(req)
    assert messages[1]["tool_calls"] == [  # arguments as objects, as tool-use templates read them
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {}}}]
    assert messages[2] == {"role": "tool", "content": "rain", "tool_call_id": "call_1"}
    with pytest.raises(ConveyorError, match="needs `tool_call_id`"):
        chat_messages(_request(messages=[{"role": "tool", "content": "rain"}]))
    template = ChatTemplate(
        "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}"
        "{% for c in m.tool_calls or [] %}<{{ c.function.name }} {{ c.function.arguments | tojson }}>{% endfor %}"
        "{% if m.role == 'tool' %}({{ m.tool_call_id }}: {{ m.content }}){% endif %}{% endfor %}", {})
    assert template.prompt(messages, tools=[WEATHER]) == (
        '[get_weather]<get_weather {"city": "Oslo"}><get_time {}>(call_1: rain)')
    assert template.prompt(messages) == '<get_weather {"city": "Oslo"}><get_time {}>(call_1: rain)'


def test_plan_readers_are_fresh_per_choice() -> None:
    p = ToolPlan("required", [], {"type": "array"})
    assert p.reader() is not p.reader()
