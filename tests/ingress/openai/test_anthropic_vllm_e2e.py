"""Anthropic's Messages API on the OpenAI ingress, in front of the real engine (the ``vllm`` backend
serving the tiny Llama, tests/support/vllm_group.py), driven by the official ``anthropic`` client: a
message is the chat completion of the same conversation (greedy: token for token, and vLLM's own output on
the model's template), plain, streamed (Anthropic's events), with an adapter, on a stop sequence, and with
tools (a forced call, then its result in the next turn); ``count_tokens`` counts the prompt the answer's
usage counts; errors are Anthropic's."""

from __future__ import annotations

import http.client
import json
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from tests.support import tiny_llama
from tests.support.vllm_group import MODEL, SEP, VllmGroup
from tests.support.vllm_reference import CHAT, MAX_TOKENS

LEVEL = "e2e"

tiny_llama.require_vllm()

# The group's fixture runs vLLM's reference and loads the group's engine (~100 s here alone, more on a
# loaded host): it counts against the first test's time.
pytestmark = pytest.mark.timeout(600)

WEATHER: Any = {"name": "get_weather", "description": "the weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["oslo", "rome"]},
                                     "metric": {"type": "boolean"}},
    "required": ["city", "metric"], "additionalProperties": False}}
CLOCK: Any = {"name": "get_time", "input_schema": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["utc", "cet"]}}, "required": ["zone"],
    "additionalProperties": False}}
# This client's ``messages.create`` has no sampling arguments: they go in the body as Anthropic's API takes them.
GREEDY: Any = {"extra_body": {"temperature": 0}}
TOOL_TOKENS = 48  # room for the forced JSON: a dozen tokens or so
SYSTEM = "you are a tiny model"
# A line the tiny model learnt, to which its greedy answer is longer than a token or two (most are "g").
LONG: Any = [{"role": "user", "content": tiny_llama.LINES[5]}]


@pytest.fixture(scope="module")
def group(served_llm: VllmGroup) -> VllmGroup:
    """The session's vLLM group (tests/support/vllm_group.py), which the other vLLM tests share."""
    return served_llm


@pytest.fixture(scope="module")
def client(group: VllmGroup) -> anthropic.Anthropic:
    # The client sends anthropic-version (and an x-api-key header, which the ingress does not read).
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{group.openai_port}", api_key="none", max_retries=0,
                               timeout=120)


@pytest.fixture(scope="module")
def messages(client: anthropic.Anthropic) -> Any:
    """The client's Messages resource, untyped: its typed arguments name Anthropic's own models and messages."""
    return client.messages


@pytest.fixture(scope="module")
def chat(group: VllmGroup) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group.openai_port}/v1", api_key="none", max_retries=0,
                         timeout=120)


def _chat(chat: openai.OpenAI, messages: Any, **fields: Any) -> Any:
    return _completion(chat, messages, **fields).choices[0]


def _completion(chat: openai.OpenAI, messages: Any, **fields: Any) -> Any:
    return chat.chat.completions.create(model=fields.pop("model", MODEL), messages=messages, temperature=0,
                                        **fields)


def test_a_message_is_the_chat_completion_of_the_conversation(group: VllmGroup, messages: Any,
                                                              chat: openai.OpenAI) -> None:
    text, n_out, n_in = group.ref.chat[None]  # vLLM's own greedy answer on the model's template
    out = messages.create(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=CHAT,
                                 metadata={"user_id": "u1"})
    assert out.id.startswith("msg_") and out.type == "message" and out.role == "assistant" and out.model == MODEL
    assert [b.type for b in out.content] == ["text"]
    assert out.content[0].text == text
    assert _chat(chat, CHAT, max_tokens=MAX_TOKENS).message.content == text
    assert out.stop_reason == ("max_tokens" if n_out == MAX_TOKENS else "end_turn") and out.stop_sequence is None
    assert out.usage.output_tokens == n_out
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == n_in
    assert out.usage.cache_read_input_tokens is not None  # the engine reports what its prefix cache held


def test_the_system_prompt_and_earlier_turns_are_the_chats(messages: Any, chat: openai.OpenAI) -> None:
    turns: Any = [*CHAT, {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                  {"role": "user", "content": [{"type": "text", "text": "the quick"}, {"type": "text", "text": "fox"}]}]
    out = messages.create(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=turns,
                                 system=[{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}])
    same = _completion(chat, [{"role": "system", "content": SYSTEM}, *CHAT, {"role": "assistant", "content": "hello"},
                              {"role": "user", "content": "the quick\nfox"}], max_tokens=MAX_TOKENS)
    assert out.content[0].text == same.choices[0].message.content
    # The same prompt, token for token in number: the system prompt and every turn are in it.
    assert out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0) == same.usage.prompt_tokens
    plain = messages.create(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=turns)
    assert plain.usage.input_tokens + (plain.usage.cache_read_input_tokens or 0) < same.usage.prompt_tokens


def test_an_adapter_answers_through_the_model_name(group: VllmGroup, messages: Any) -> None:
    out = messages.create(model=f"{MODEL}{SEP}alpha", max_tokens=MAX_TOKENS, **GREEDY, messages=CHAT)
    assert out.content[0].text == group.ref.chat["alpha"][0] != group.ref.chat[None][0]
    assert out.model == f"{MODEL}{SEP}alpha"


def test_a_stream_is_anthropics_events_of_the_same_answer(group: VllmGroup, messages: Any) -> None:
    text, n_out, n_in = group.ref.chat[None]
    with messages.stream(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=CHAT) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text and final.content[0].text == text
    assert final.id.startswith("msg_") and final.model == MODEL
    assert final.stop_reason == ("max_tokens" if n_out == MAX_TOKENS else "end_turn")
    assert final.usage.output_tokens == n_out
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == n_in
    # On the wire: event lines, ping included (the client skips it), in Anthropic's order.
    status, events = _events(group, {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "messages": CHAT,
                                     "stream": True})
    assert status == 200
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(doc["type"] == name for name, doc in events)
    start = events[0][1]["message"]
    assert (start["role"], start["content"], start["stop_reason"]) == ("assistant", [], None)
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(doc["delta"]["text"] for name, doc in events if name == "content_block_delta") == text
    assert events[-2][1]["usage"]["output_tokens"] == n_out


def _events(group: VllmGroup, body: dict[str, Any]) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
    conn = http.client.HTTPConnection("127.0.0.1", group.openai_port, timeout=120)
    try:
        conn.request("POST", "/v1/messages", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
        r = conn.getresponse()
        raw = r.read().decode()
    finally:
        conn.close()
    out = []
    for event in raw.split("\n\n"):
        if not event:
            continue
        lines = dict(line.split(": ", 1) for line in event.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return r.status, out


def test_a_stop_sequence_ends_the_answer_and_is_named(messages: Any, chat: openai.OpenAI) -> None:
    text = _chat(chat, LONG, max_tokens=MAX_TOKENS).message.content
    assert len(text) >= 6, text
    stop = text[len(text) // 2:len(text) // 2 + 2]  # a stop string in the middle of the greedy answer
    cut = text[:text.index(stop)]  # the stop string left out, as Anthropic leaves it out
    out = messages.create(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=LONG,
                                 stop_sequences=["\x00", stop])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == stop
    assert out.content[0].text == cut
    with messages.stream(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=LONG,
                                stop_sequences=[stop]) as stream:
        assert "".join(stream.text_stream) == cut
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_a_tool_round_trip(messages: Any, chat: openai.OpenAI) -> None:
    """A forced call (``tool_choice`` ``tool``: guided decoding on its schema) is a ``tool_use`` block; its
    result in the next turn is the chat's tool message: the answer is the chat's to the same history."""
    out = messages.create(model=MODEL, max_tokens=TOOL_TOKENS, **GREEDY, messages=CHAT,
                                 tools=[WEATHER, CLOCK], tool_choice={"type": "tool", "name": "get_weather"})
    assert out.stop_reason == "tool_use", out
    assert [b.type for b in out.content] == ["tool_use"]
    call = out.content[0]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER["input_schema"])
    streamed = _streamed_call(messages, tools=[WEATHER, CLOCK], tool_choice={"type": "tool", "name": "get_weather"})
    assert streamed == call.input  # greedy: the same call
    # ``any``: one of the tools
    anyone = messages.create(model=MODEL, max_tokens=TOOL_TOKENS + 16, **GREEDY, messages=CHAT,
                                    tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert anyone.stop_reason == "tool_use" and [b.type for b in anyone.content] == ["tool_use"]
    history: Any = [*CHAT, {"role": "assistant", "content": out.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "rain"},
                                                 {"type": "text", "text": "and now"}]}]
    after = messages.create(model=MODEL, max_tokens=MAX_TOKENS, **GREEDY, messages=history,
                                   tools=[WEATHER], tool_choice={"type": "none"})
    assert after.content[0].type == "text" and after.stop_reason in ("end_turn", "max_tokens")
    same = _chat(chat, [*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(call.input)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "rain"}, {"role": "user", "content": "and now"}],
        max_tokens=MAX_TOKENS, tools=[{"type": "function", "function": {
            "name": WEATHER["name"], "description": WEATHER["description"], "parameters": WEATHER["input_schema"]}}],
        tool_choice="none")
    assert after.content[0].text == same.message.content


def _streamed_call(messages: Any, **fields: Any) -> Any:
    events = list(messages.create(model=MODEL, max_tokens=TOOL_TOKENS, **GREEDY, messages=CHAT,
                                         stream=True, **fields))
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.name == "get_weather"
    assert start.content_block.input == {}
    pieces = [e.delta.partial_json for e in events if e.type == "content_block_delta"
              and e.delta.type == "input_json_delta"]
    assert len(pieces) > 1  # the arguments as the model writes them
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "tool_use"
    return json.loads("".join(pieces))


def test_count_tokens_counts_the_prompt_the_answer_counts(messages: Any) -> None:
    for fields in ({}, {"system": SYSTEM}, {"tools": [WEATHER], "tool_choice": {"type": "none"}}):
        counted = messages.count_tokens(model=MODEL, messages=CHAT, **fields)
        out = messages.create(model=MODEL, max_tokens=1, **GREEDY, messages=CHAT, **fields)
        assert counted.input_tokens == out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0), fields
    assert messages.count_tokens(model=MODEL, messages=CHAT, system=SYSTEM).input_tokens > \
        messages.count_tokens(model=MODEL, messages=CHAT).input_tokens


def test_the_prompt_the_prefix_cache_held_is_read_from_the_cache(messages: Any) -> None:
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    prompt = " ".join(words[(i + 5) % len(words)] for i in range(48))  # a whole 128-token CPU block and more
    first, second = (messages.create(model=MODEL, max_tokens=1, **GREEDY,
                                            messages=[{"role": "user", "content": prompt}]).usage for _ in range(2))
    assert (second.cache_read_input_tokens or 0) >= 128 > (first.cache_read_input_tokens or 0)
    assert first.input_tokens + (first.cache_read_input_tokens or 0) == \
        second.input_tokens + (second.cache_read_input_tokens or 0)  # the same prompt


def test_errors_are_anthropics(group: VllmGroup, client: anthropic.Anthropic, messages: Any) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.post("/v1/messages", body={"model": MODEL, "messages": CHAT}, cast_to=object)
    assert bad.value.status_code == 400 and "max_tokens" in bad.value.message
    assert isinstance(bad.value.body, dict) and bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        messages.create(model="nope", max_tokens=4, messages=CHAT)
    assert isinstance(missing.value.body, dict) and missing.value.body["error"]["type"] == "not_found_error"
    assert missing.value.body["request_id"] == missing.value.response.headers["request-id"]
    with pytest.raises(anthropic.NotFoundError):
        messages.count_tokens(model="nope", messages=CHAT)
    with pytest.raises(anthropic.BadRequestError, match="content blocks of type 'image' are not supported"):
        messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://127.0.0.1/x.png"}}]}])
    with pytest.raises(anthropic.BadRequestError, match="not supported: this server runs no server tools"):
        messages.create(model=MODEL, max_tokens=4, messages=CHAT,
                               tools=[{"type": "web_search_20250305", "name": "web_search"}])
    # A stop sequence past the route's count, as on the chat route.
    with pytest.raises(anthropic.BadRequestError, match="stop"):
        messages.create(model=MODEL, max_tokens=4, messages=CHAT, stop_sequences=["a", "b", "c", "d", "e"])
