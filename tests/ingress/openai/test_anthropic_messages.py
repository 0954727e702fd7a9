"""Anthropic's Messages API (ingress/openai/messages.py, messages_schema.py) without a group: a request read
as the chat request it means, its bounds, the stream's events from the engine's steps, and the errors in
Anthropic's form. The real engine and the official client: test_anthropic_vllm_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import falcon
import falcon.asgi
import falcon.testing
import msgspec
import orjson
import pytest

from conveyor.ingress.http.body import BodyTooLarge
from conveyor.ingress.openai.endpoints import Job
from conveyor.ingress.openai.errors import body_refusal, render_error
from conveyor.ingress.openai.generation import Step
from conveyor.ingress.openai.messages import message_events, stop_reason
from conveyor.ingress.openai.messages_schema import (
    MAX_BLOCKS,
    MAX_USER_ID_CHARS,
    CountTokensRequest,
    MessagesRequest,
    chat_request,
)
from conveyor.ingress.openai.request_id import RequestIds
from conveyor.ingress.openai.schema import ChatRequest, NamedToolChoice, chat_messages, decode
from conveyor.ingress.openai.tools import ToolPlan
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"

HELLO = [{"role": "user", "content": "hello"}]
WEATHER = {"name": "get_weather", "description": "the weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _chat(**fields: Any) -> ChatRequest:
    body = {"model": "m", "max_tokens": 8, "messages": HELLO, **fields}
    return chat_request(decode(msgspec.json.encode(body), MessagesRequest))


def _refused(match: str, **fields: Any) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        _chat(**fields)
    assert err.value.status is Status.INVALID_ARG


# ---------------------------------------------------------------------------------------------- the request


def test_a_message_request_is_the_chat_request_it_means() -> None:
    chat = _chat(stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=4, stream=True,
                 metadata={"user_id": "u1"}, thinking={"type": "enabled", "budget_tokens": 1024},
                 service_tier="auto", output_config={"effort": "low"})
    assert (chat.model, chat.max_tokens, chat.stop, chat.temperature, chat.top_p, chat.top_k, chat.stream,
            chat.user, chat.n) == ("m", 8, ["END"], 0.5, 0.9, 4, True, "u1", 1)
    assert chat.tools is None and chat.tool_choice is None and chat.response_format is None
    assert chat_messages(chat) == [{"role": "user", "content": "hello"}]


def test_the_system_prompt_leads_and_text_blocks_join_as_chat_parts() -> None:
    chat = _chat(system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc"},
                         {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}},
                         {"type": "text", "text": "be kind"}],
                 messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                           {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                             {"type": "text", "text": "c"}]},
                           {"role": "user", "content": "d"}])
    # Claude Code's per-request billing block is left out: it would change the prompt's first tokens each time.
    assert chat_messages(chat) == [{"role": "system", "content": "be brief\nbe kind"},
                                   {"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"},
                                   {"role": "user", "content": "d"}]
    assert chat_messages(_chat(system="plain"))[0] == {"role": "system", "content": "plain"}


def test_tool_use_and_tool_result_blocks_are_the_chats_calls_and_tool_messages() -> None:
    chat = _chat(tools=[WEATHER], messages=[
        *HELLO,
        {"role": "assistant", "content": [{"type": "text", "text": "let me see"},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"},
                                     {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                                      "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "data"}]},
                                     {"type": "text", "text": "so?"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]}])
    assert chat_messages(chat)[1:] == [
        {"role": "assistant", "content": "let me see", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "oslo"}}, "id": "toolu_1"}]},
        {"role": "tool", "content": "rain", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "no\ndata", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "so?"},
        {"role": "tool", "content": "", "tool_call_id": "toolu_3"}]  # a turn of results alone: no user message
    assert chat.tools is not None and len(chat.tools) == 1
    fn = chat.tools[0].function
    assert (fn.name, fn.description, fn.parameters) == ("get_weather", "the weather", WEATHER["input_schema"])


@pytest.mark.parametrize(("choice", "expected", "parallel"), [
    ({"type": "auto"}, "auto", None),
    ({"type": "any"}, "required", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "get_weather"}, "get_weather", None),
])
def test_tool_choice_is_the_chats(choice: dict[str, Any], expected: str, parallel: bool | None) -> None:
    chat = _chat(tools=[WEATHER], tool_choice=choice)
    found = chat.tool_choice.function.name if isinstance(chat.tool_choice, NamedToolChoice) else chat.tool_choice
    assert (found, chat.parallel_tool_calls) == (expected, parallel)


def test_an_output_format_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = _chat(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert chat.response_format is not None and chat.response_format.type == "json_schema"
    assert chat.response_format.json_schema is not None and chat.response_format.json_schema.schema == schema


def test_what_has_no_meaning_here_is_a_400() -> None:
    _refused("max_tokens", max_tokens=None)  # required, as Anthropic requires it
    with pytest.raises(ConveyorError, match="missing required field `max_tokens`"):
        decode(orjson.dumps({"model": "m", "messages": HELLO}), MessagesRequest)
    _refused("Input should be 'user' or 'assistant'", messages=[{"role": "system", "content": "x"}])
    _refused("blocks of type 'image' are not supported",
             messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    _refused("`tool_use` block cannot be in a message of role 'user'",
             messages=[{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}])
    _refused("needs `tool_use_id`", messages=[{"role": "user", "content": [{"type": "tool_result"}]}])
    _refused("tool_result` content blocks of type 'image'", messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}])
    _refused("only text blocks", system=[{"type": "image"}])
    _refused("this server runs no server tools", tools=[{"type": "bash_20250124", "name": "bash"}])
    _refused("input_schema: Field required", tools=[{"name": "f"}])
    _refused("tool_choice.name: Field required", tools=[WEATHER], tool_choice={"type": "tool"})
    _refused("tool_choice.type", tools=[WEATHER], tool_choice={"type": "required"})
    _refused("`mcp_servers` is not supported", mcp_servers=[{"type": "url", "url": "http://x", "name": "x"}])
    _refused("`container` is not supported", container="c")
    _refused("output_config.format.type", output_config={"format": {"type": "regex"}})
    _refused("at least one message", messages=[])
    _refused("a prefill of the answer", messages=[*HELLO, {"role": "assistant", "content": "The answer is"}])


def test_counts_are_bounded_before_anything_is_made_per_item() -> None:
    text = {"type": "text", "text": "a"}
    at_limit = [{"role": "user", "content": [text] * (MAX_BLOCKS - 1)}]
    assert len(chat_messages(_chat(system=[text], messages=at_limit))) == 2
    _refused(f"at most {MAX_BLOCKS} are taken", system=[text, text], messages=at_limit)
    # A tool result's own blocks count too.
    _refused(f"at most {MAX_BLOCKS} are taken", messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [text] * MAX_BLOCKS}]}])
    _refused(f"at most {llm_limits.MAX_MESSAGES} are taken", messages=HELLO * (llm_limits.MAX_MESSAGES + 1))
    _refused(f"at most {llm_limits.MAX_TOOLS} are taken",
             tools=[{**WEATHER, "name": f"f{i}"} for i in range(llm_limits.MAX_TOOLS + 1)])
    assert _chat(metadata={"user_id": "u" * MAX_USER_ID_CHARS}).user == "u" * MAX_USER_ID_CHARS
    _refused(f"at most {MAX_USER_ID_CHARS} characters", metadata={"user_id": "u" * (MAX_USER_ID_CHARS + 1)})


def test_count_tokens_takes_no_max_tokens() -> None:
    req = decode(orjson.dumps({"model": "m", "messages": HELLO, "system": "s"}), CountTokensRequest)
    assert chat_messages(chat_request(req)) == [{"role": "system", "content": "s"}, *HELLO]


# ----------------------------------------------------------------------------------------------- the answer


def test_stop_reason_is_anthropics() -> None:
    assert stop_reason("length", True, "x") == ("max_tokens", None)  # out of tokens wins
    assert stop_reason("stop", True, "x") == ("tool_use", None)
    assert stop_reason("stop", False, "x") == ("stop_sequence", "x")
    assert stop_reason("stop", False, None) == ("end_turn", None)
    assert stop_reason("abort", False, None) == (None, None)


def _job(tools: ToolPlan | None = None) -> Job:
    return Job("msg_r1", "m", 0, 1, None, False, False, False, tools)


async def _steps(steps: list[Step], error: Exception | None = None,
                 closed: list[bool] | None = None) -> AsyncGenerator[Step, None]:
    try:
        for step in steps:
            yield step
        if error is not None:
            raise error
    finally:
        if closed is not None:
            closed.append(True)


def _stream(job: Job, steps: list[Step], error: Exception | None = None) -> list[tuple[str, dict[str, Any]]]:
    async def run() -> list[bytes]:
        rest = _steps(steps[1:], error)
        return [event.serialize() async for event in message_events(job, steps[0], rest)]

    out = []
    for wire in asyncio.run(run()):
        head, data = wire.decode().split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: ") and data.endswith("\n\n")
        out.append((head[len("event: "):], orjson.loads(data[len("data: "):])))
    return out


def _step(text: str, finish: str | None = None, stops: list[str | None] | None = None, output: int = 1,
          cached: int | None = 3) -> Step:
    return Step([text], [finish], 10, output, finish is not None, cached_tokens=cached, stops=stops)


def test_a_stream_is_anthropics_events() -> None:
    events = _stream(_job(), [_step(" a"), _step(" b"), _step("", "stop", ["END"], output=0)])
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                            "content_block_delta", "content_block_stop", "message_delta",
                                            "message_stop"]
    assert all(doc["type"] == name for name, doc in events)
    assert events[0][1]["message"] == {"id": "msg_r1", "type": "message", "role": "assistant", "model": "m",
                                       "content": [], "stop_reason": None, "stop_sequence": None,
                                       "usage": {"input_tokens": 7, "output_tokens": 0, "cache_read_input_tokens": 3}}
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[3][1] == {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " a"}}
    assert events[5][1] == {"type": "content_block_stop", "index": 0}
    assert events[6][1] == {"type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "END"},
                            "usage": {"input_tokens": 7, "output_tokens": 2, "cache_read_input_tokens": 3}}


def test_an_empty_answer_streams_one_empty_text_block() -> None:
    events = _stream(_job(), [_step("", "stop", output=0, cached=None)])
    assert [name for name, _ in events] == ["message_start", "ping", "content_block_start", "content_block_stop",
                                            "message_delta", "message_stop"]
    assert events[4][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[4][1]["usage"] == {"input_tokens": 10, "output_tokens": 0}  # no cache reported: none shown


def test_a_forced_call_streams_as_a_tool_use_block_of_json_deltas() -> None:
    plan = ToolPlan("named", [], {"type": "object"}, named="get_weather")
    events = _stream(_job(plan), [_step('{"city"'), _step(': "oslo"'), _step("}", "stop")])
    start = events[2][1]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["name"] == "get_weather"
    assert start["content_block"]["id"].startswith("toolu_") and start["content_block"]["input"] == {}
    deltas = [doc["delta"] for name, doc in events if name == "content_block_delta"]
    assert all(d["type"] == "input_json_delta" for d in deltas)
    assert "".join(d["partial_json"] for d in deltas) == '{"city": "oslo"}'
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_text_then_a_parsed_call_are_two_blocks() -> None:
    plan = ToolPlan("auto", [], None, parser="hermes")
    events = _stream(_job(plan), [_step("let me see "), _step('<tool_call>{"name": "get_weather", '),
                                  _step('"arguments": {"city": "rome"}}</tool_call>', "stop")])
    starts = [doc["content_block"] for name, doc in events if name == "content_block_start"]
    assert [b["type"] for b in starts] == ["text", "tool_use"] and starts[1]["name"] == "get_weather"
    stops = [doc["index"] for name, doc in events if name == "content_block_stop"]
    assert stops == [0, 1]
    text = "".join(doc["delta"].get("text", "") for name, doc in events if name == "content_block_delta")
    assert text.strip() == "let me see"
    arguments = "".join(doc["delta"].get("partial_json", "") for name, doc in events if name == "content_block_delta")
    assert orjson.loads(arguments) == {"city": "rome"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_failure_after_the_first_event_is_an_error_event() -> None:
    events = _stream(_job(), [_step(" a")], ConveyorError(Status.UNAVAILABLE, "the engine went away"))
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                "message": "the engine went away"}})


def test_a_client_that_leaves_closes_the_engines_request() -> None:
    closed: list[bool] = []

    async def run() -> None:
        found = _steps([_step(" b")] * 100, closed=closed)
        events = message_events(_job(), await anext(found), found)  # as Messages: the first step before the status
        await anext(events)  # message_start
        await events.aclose()  # the client went away

    asyncio.run(run())
    assert closed == [True]


# ------------------------------------------------------------------------------------------------ the errors


class _Refusing:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raise self.error


def _answer(error: Exception, path: str = "/v1/messages", method: str = "POST") -> falcon.testing.Result:
    app = falcon.asgi.App(middleware=[RequestIds()])
    app.add_error_handler(Exception, render_error)
    app.add_error_handler(falcon.HTTPError, render_error)
    app.add_route(path, _Refusing(error))
    return falcon.testing.TestClient(app).simulate_request(method, path, json={})


@pytest.mark.parametrize(("error", "status", "kind"), [
    (ConveyorError(Status.INVALID_ARG, "bad"), 400, "invalid_request_error"),
    (ConveyorError(Status.NOT_FOUND, "The model `x` does not exist."), 404, "not_found_error"),
    (ConveyorError(Status.UNAVAILABLE, "Exceeds maximum queue size"), 529, "overloaded_error"),
    (ConveyorError(Status.INTERNAL, "boom"), 500, "api_error"),
    (BodyTooLarge(10, 5), 413, "request_too_large"),
    (RuntimeError("oops"), 500, "api_error"),
])
def test_errors_on_anthropics_routes_are_in_its_form(error: Exception, status: int, kind: str) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = _answer(error, path)
        assert r.status_code == status and r.json["type"] == "error", path
        assert r.json["error"]["type"] == kind and r.json["error"]["message"]
        assert r.json["request_id"] == r.headers["request-id"] == r.headers["x-request-id"]  # Anthropic's name too
        # The anthropic client retries an overload after the Retry-After it is given, as openai's a 503.
        assert ("Retry-After" in r.headers) == (status == 529)
    openai = _answer(error, "/v1/chat/completions")
    assert "type" not in openai.json and "request-id" not in openai.headers  # the OpenAI routes keep OpenAI's form


def test_a_method_the_route_does_not_take_is_in_anthropics_form() -> None:
    r = _answer(ConveyorError(Status.INVALID_ARG, "x"), method="GET")
    assert r.status_code == 405 and r.json["type"] == "error" and r.json["error"]["type"] == "invalid_request_error"


def test_a_body_refused_before_the_app_is_in_the_routes_form() -> None:
    status, body = body_refusal(10, 5, "/v1/messages")
    doc = orjson.loads(body)
    assert status == 413 and doc["type"] == "error" and doc["error"]["type"] == "request_too_large"
    assert "exceeds the maximum allowed input size of 5 bytes" in doc["error"]["message"]
    assert orjson.loads(body_refusal(10, 5, "/v1/chat/completions")[1])["error"]["code"] == "content_too_large"


def test_the_user_id_is_the_session_of_its_turns() -> None:
    """Anthropic's ``metadata.user_id`` keeps an agent's turns on one engine, as ``prompt_cache_key`` does."""
    chat = _chat(metadata={"user_id": "agent-7"})
    assert (chat.user, chat.prompt_cache_key) == ("agent-7", "agent-7")
    assert _chat().prompt_cache_key is None
