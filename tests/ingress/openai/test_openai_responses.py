"""OpenAI's Responses API (ingress/openai/responses.py, responses_schema.py) and its store (response_store.py)
without a group: a request read as the chat request it means after a stored conversation, its bounds, the
stream's events from the engine's steps, the response's shape, the store's bounds (count, bytes, age), the same
file opened by two stores (two ingress processes) and again (a restarted one), and OpenAI's 404. The real
group and the official client: test_openai_responses_e2e.py and test_openai_responses_vllm_e2e.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import falcon
import falcon.asgi
import falcon.testing
import msgspec
import orjson
import pytest

from conveyor.ingress.openai.endpoints import Job
from conveyor.ingress.openai.errors import UnknownResponse, render_error, render_triton_error
from conveyor.ingress.openai.generation import Step
from conveyor.ingress.openai.request_id import RequestIds
from conveyor.ingress.openai.response_store import EVICT_BATCH, MemoryStore, SqliteStore, StoredResponse, StoreLimits
from conveyor.ingress.openai.responses import Answer, response_events
from conveyor.ingress.openai.responses_schema import (
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    ResponsesRequest,
    chat_request,
    check,
    conversation,
)
from conveyor.ingress.openai.schema import ChatMessage, ChatRequest, NamedToolChoice, chat_messages, decode
from conveyor.ingress.openai.tools import ToolPlan
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, Status

LEVEL = "unit"

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def _request(**fields: Any) -> ResponsesRequest:
    body = {"model": "m", "input": "hello", **fields}
    request = decode(msgspec.json.encode(body), ResponsesRequest)
    check(request)
    return request


def _chat(history: list[ChatMessage] | None = None, session: str | None = None, **fields: Any) -> ChatRequest:
    return chat_request(_request(**fields), history or [], session)


def _refused(match: str, **fields: Any) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        _chat(**fields)
    assert err.value.status is Status.INVALID_ARG


# ---------------------------------------------------------------------------------------------- the request


def test_a_response_request_is_the_chat_request_it_means() -> None:
    chat = _chat(session="s1", instructions="be brief", max_output_tokens=8, temperature=0.5, top_p=0.9,
                 stream=True, user="u", reasoning={"effort": "low"}, include=["x"], truncation="auto",
                 service_tier="auto", text={"format": {"type": "text"}, "verbosity": "low"})
    assert (chat.model, chat.max_tokens, chat.temperature, chat.top_p, chat.stream, chat.user,
            chat.prompt_cache_key) == ("m", 8, 0.5, 0.9, True, "u", "s1")
    assert chat.tools is None and chat.tool_choice is None and chat.response_format is None
    assert chat_messages(chat) == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]


def test_input_items_are_messages_calls_and_their_outputs() -> None:
    chat = _chat(input=[
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
    ])
    assert chat_messages(chat) == [
        {"role": "system", "content": "dev"}, {"role": "user", "content": "a\nb"},
        # the calls in a row join the assistant's turn before them, as vLLM joins them
        {"role": "assistant", "content": "c", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}, "id": "call_1"},
            {"type": "function", "function": {"name": "g", "arguments": {}}, "id": "call_2"}]},
        {"role": "tool", "content": "one", "tool_call_id": "call_1"},
        {"role": "tool", "content": "two", "tool_call_id": "call_2"}]


def test_a_follow_up_is_the_stored_conversation_then_its_input_with_its_own_instructions() -> None:
    first = _chat(instructions="old rules", input="hi")
    history = [*conversation(first), ChatMessage("assistant", "hello")]
    follow = _chat(history, "s1", instructions="new rules", input="again")
    assert chat_messages(follow) == [{"role": "system", "content": "new rules"}, {"role": "user", "content": "hi"},
                                     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    assert follow.prompt_cache_key == "s1"  # the conversation's session: its engine


def test_tools_tool_choice_and_text_format_are_the_chats() -> None:
    chat = _chat(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    assert chat.tools is not None and chat.tools[0].function.name == "get_weather"
    assert chat.tools[0].function.parameters == WEATHER["parameters"] and chat.parallel_tool_calls is False
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "get_weather"
    assert _chat(tools=[WEATHER], tool_choice="required").tool_choice == "required"
    fmt = _chat(text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"},
                                 "strict": True}}).response_format
    assert fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None
    assert (fmt.json_schema.name, fmt.json_schema.schema, fmt.json_schema.strict) == ("x", {"type": "object"}, True)
    json_object = _chat(text={"format": {"type": "json_object"}}).response_format
    assert json_object is not None and json_object.type == "json_object"


def test_what_has_no_meaning_here_is_a_400() -> None:
    _refused("`background` is not supported", background=True)
    _refused("`conversation` is not supported", conversation="conv_1")
    _refused("`prompt` is not supported", prompt={"id": "pmpt_1"})
    _refused("`top_logprobs` is not supported", top_logprobs=2)
    _refused("`max_tool_calls` is not supported", max_tool_calls=2)
    _refused("truncation", truncation="middle")
    _refused("tools of type 'web_search' are not supported", tools=[{"type": "web_search"}])
    _refused(r"tools\[0\].name: Field required", tools=[{"type": "function"}])
    _refused("a choice of type 'file_search' is not supported", tool_choice={"type": "file_search"})
    _refused("tool_choice: Input should be", tool_choice="sometimes")
    _refused("input items of type 'item_reference' are not supported", input=[{"type": "item_reference", "id": "x"}])
    _refused("content parts of type 'input_image' are not supported",
             input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}])
    _refused(r"input\[0\].role: Input should be", input=[{"role": "tool", "content": "x"}])
    _refused("needs `call_id` and `name`", input=[{"type": "function_call", "name": "f"}])
    _refused("needs `call_id`", input=[{"type": "function_call_output", "output": "x"}])
    _refused("text.format.schema: Field required", text={"format": {"type": "json_schema", "name": "x"}})
    _refused("text.format.type", text={"format": {"type": "grammar"}})
    _refused("at least one input item", input=[])


def test_counts_are_bounded_before_anything_is_made_per_item() -> None:
    one = {"role": "user", "content": "x"}
    _chat(input=[one] * llm_limits.MAX_MESSAGES)  # at the bound: taken
    _refused("at most", input=[one] * (llm_limits.MAX_MESSAGES + 1))
    # the stored conversation and the input together
    history = [ChatMessage("user", "x")] * llm_limits.MAX_MESSAGES
    _refused("at most", history=history, input="one more")
    parts = {"role": "user", "content": [{"type": "input_text", "text": "x"}] * (llm_limits.MAX_MESSAGE_PARTS + 1)}
    _refused("content parts", input=[parts])
    _chat(tools=[WEATHER] * llm_limits.MAX_TOOLS)
    _refused("at most", tools=[WEATHER] * (llm_limits.MAX_TOOLS + 1))
    _chat(metadata={f"k{i}": "v" for i in range(MAX_METADATA_PAIRS)})
    _refused("at most 16 key-value pairs", metadata={f"k{i}": "v" for i in range(MAX_METADATA_PAIRS + 1)})
    _chat(metadata={"k" * MAX_METADATA_KEY_CHARS: "v" * MAX_METADATA_VALUE_CHARS})
    _refused("a key of at most", metadata={"k" * (MAX_METADATA_KEY_CHARS + 1): "v"})
    _refused("a value of at most", metadata={"k": "v" * (MAX_METADATA_VALUE_CHARS + 1)})


# ---------------------------------------------------------------------------------------------- the answer


def _answer(**fields: Any) -> Answer:
    request = _request(**fields)
    return Answer(request, chat_request(request, [], "s1"), "resp_1")


def _job(tools: ToolPlan | None = None) -> Job:
    return Job("resp_r1", "m", 0, 1, None, False, False, False, tools)


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


def _step(text: str, finish: str | None = None, output: int = 1, cached: int | None = 3) -> Step:
    return Step([text], [finish], 10, output, finish is not None, cached_tokens=cached)


def _stream(answer: Answer, job: Job, steps: list[Step], store: MemoryStore | None = None,
            error: Exception | None = None) -> list[tuple[str, dict[str, Any]]]:
    async def run() -> list[bytes]:
        rest = _steps(steps[1:], error)
        return [event.serialize() async for event in response_events(answer, job, steps[0], rest,
                                                                     store or MemoryStore())]

    out = []
    for wire in asyncio.run(run()):
        head, data = wire.decode().split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: ") and data.endswith("\n\n")
        out.append((head[len("event: "):], orjson.loads(data[len("data: "):])))
    return out


def test_a_stream_is_openais_events_and_the_response_is_stored_before_the_last() -> None:
    store = MemoryStore()
    answer = _answer(instructions="rules")
    events = _stream(answer, _job(), [_step(" a"), _step(" b"), _step("", "stop", output=0)], store)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert all(doc["type"] == name for name, doc in events)
    assert [doc["sequence_number"] for _, doc in events] == list(range(len(events)))
    created = events[0][1]["response"]
    assert (created["id"], created["status"], created["output"], created["instructions"]) == (
        "resp_1", "in_progress", [], "rules")
    item = events[-2][1]["item"]
    assert item["type"] == "message" and item["status"] == "completed" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "text": " a b", "annotations": [], "logprobs": []}]
    assert events[6][1]["text"] == " a b" and events[4][1]["item_id"] == item["id"]
    done = events[-1][1]["response"]
    assert done["status"] == "completed" and done["output"] == [item]
    assert done["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 2,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 12}
    record = asyncio.run(store.get("resp_1"))
    assert record is not None and orjson.loads(record.response) == done and record.session == "s1"
    # the conversation a follow-up continues: the input and the answer, not the instructions
    turns = msgspec.json.decode(record.conversation, type=list[ChatMessage])
    assert [(m.role, m.content) for m in turns] == [("user", "hello"), ("assistant", " a b")]


def test_an_answer_cut_by_max_output_tokens_is_incomplete() -> None:
    events = _stream(_answer(max_output_tokens=2), _job(), [_step(" a"), _step(" b", "length")])
    name, doc = events[-1]
    assert name == "response.incomplete" and doc["response"]["status"] == "incomplete"
    assert doc["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert doc["response"]["output"][0]["status"] == "incomplete"


def test_store_false_stores_nothing_and_an_empty_answer_is_one_empty_message() -> None:
    store = MemoryStore()
    events = _stream(_answer(store=False), _job(), [_step("", "stop", output=0, cached=None)], store)
    assert asyncio.run(store.get("resp_1")) is None
    output = events[-1][1]["response"]["output"]
    assert len(output) == 1 and output[0]["content"][0]["text"] == ""
    assert events[-1][1]["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 0}


def test_a_forced_call_streams_as_a_function_call_item_of_argument_deltas() -> None:
    store = MemoryStore()
    plan = ToolPlan("named", [], {"type": "object"}, named="get_weather")
    events = _stream(_answer(tools=[WEATHER]), _job(plan), [_step('{"city"'), _step(': "oslo"'), _step("}", "stop")],
                     store)
    added = events[2][1]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["arguments"] == ""
    assert added["call_id"].startswith("call_") and added["id"].startswith("fc_")
    deltas = [doc["delta"] for name, doc in events if name == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"city": "oslo"}'
    done = next(doc for name, doc in events if name == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city": "oslo"}' and done["name"] == "get_weather"
    assert [i["type"] for i in events[-1][1]["response"]["output"]] == ["function_call"]
    record = asyncio.run(store.get("resp_1"))
    assert record is not None
    turns = msgspec.json.decode(record.conversation, type=list[ChatMessage])
    call = turns[-1].tool_calls[0] if turns[-1].tool_calls else None
    assert call is not None and call.id == added["call_id"] and call.function.name == "get_weather"


def test_text_then_a_parsed_call_are_two_items() -> None:
    plan = ToolPlan("auto", [], None, parser="hermes")
    events = _stream(_answer(tools=[WEATHER]), _job(plan), [
        _step("let me see "), _step('<tool_call>{"name": "get_weather", '),
        _step('"arguments": {"city": "rome"}}</tool_call>', "stop")])
    items = [doc["item"] for name, doc in events if name == "response.output_item.done"]
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert items[0]["content"][0]["text"].strip() == "let me see"
    assert orjson.loads(items[1]["arguments"]) == {"city": "rome"}
    assert [doc["output_index"] for name, doc in events if name == "response.output_item.added"] == [0, 1]


def test_a_failure_after_the_first_event_is_an_error_event() -> None:
    events = _stream(_answer(), _job(), [_step(" a")], error=ConveyorError(Status.UNAVAILABLE, "the engine left"))
    name, doc = events[-1]
    assert name == "error" and doc["message"] == "the engine left" and doc["code"] == "503"


def test_a_client_that_leaves_closes_the_engines_request() -> None:
    closed: list[bool] = []

    async def run() -> None:
        found = _steps([_step(" b")] * 100, closed=closed)
        events = response_events(_answer(), _job(), await anext(found), found, MemoryStore())
        await anext(events)  # response.created
        await events.aclose()  # the client went away

    asyncio.run(run())
    assert closed == [True]


def test_the_response_echoes_the_request() -> None:
    doc = _answer(instructions="i", max_output_tokens=5, temperature=0.2, top_p=0.5, tools=[WEATHER],
                  tool_choice={"type": "function", "name": "get_weather"}, metadata={"k": "v"}, user="u",
                  text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
                  previous_response_id="resp_0").doc([], None, "stop")
    assert doc["object"] == "response" and doc["status"] == "completed" and doc["incomplete_details"] is None
    assert (doc["instructions"], doc["max_output_tokens"], doc["temperature"], doc["top_p"], doc["user"],
            doc["metadata"], doc["previous_response_id"], doc["store"]) == ("i", 5, 0.2, 0.5, "u", {"k": "v"},
                                                                            "resp_0", True)
    assert doc["tools"] == [{**WEATHER}] and doc["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert doc["text"] == {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}
    assert doc["usage"] is None  # a model without counts


# ------------------------------------------------------------------------------------------------ the store


def _record(rid: str, size: int = 10, created: float | None = None) -> StoredResponse:
    return StoredResponse(rid, time.time() if created is None else created, b"x" * size, b"[]", "s")


def _stores(tmp_path: Path, limits: StoreLimits) -> list[Any]:
    return [MemoryStore(limits), SqliteStore(str(tmp_path / "group" / "responses.sqlite3"), limits)]


def test_a_store_keeps_gets_and_deletes(tmp_path: Path) -> None:
    for store in _stores(tmp_path, StoreLimits()):
        async def run(store: Any = store) -> None:
            record = _record("resp_a")
            assert await store.put(record)
            assert await store.get("resp_a") == record
            assert await store.get("resp_b") is None
            assert await store.delete("resp_a") and not await store.delete("resp_a")
            assert await store.get("resp_a") is None

        asyncio.run(run())


def test_past_the_count_the_oldest_goes(tmp_path: Path) -> None:
    for store in _stores(tmp_path, StoreLimits(max_count=3)):
        async def run(store: Any = store) -> None:
            for i in range(5):
                assert await store.put(_record(f"r{i}"))
            assert [await store.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]

        asyncio.run(run())


def test_past_the_bytes_the_oldest_go_and_a_larger_response_is_not_stored(tmp_path: Path) -> None:
    one = _record("r0").size
    for store in _stores(tmp_path, StoreLimits(max_bytes=3 * one)):
        async def run(store: Any = store) -> None:
            for i in range(4):
                assert await store.put(_record(f"r{i}"))
            assert [await store.get(f"r{i}") is not None for i in range(4)] == [False, True, True, True]
            big = _record("big", size=3 * one)  # larger than the whole store
            assert not await store.put(big)
            assert await store.get("big") is None
            assert [await store.get(f"r{i}") is not None for i in range(1, 4)] == [True, True, True]  # kept

        asyncio.run(run())


def test_past_the_age_a_response_is_gone(tmp_path: Path) -> None:
    for store in _stores(tmp_path, StoreLimits(max_age_s=60)):
        async def run(store: Any = store) -> None:
            assert await store.put(_record("old", created=time.time() - 61))
            assert await store.put(_record("new", created=time.time() - 59))
            assert await store.get("old") is None and await store.get("new") is not None

        asyncio.run(run())


def test_two_stores_on_one_file_share_it_and_a_new_one_finds_what_was_stored(tmp_path: Path) -> None:
    """Two ingress processes open the group's file; a restarted one opens it again."""
    path = str(tmp_path / "responses.sqlite3")
    first, second = SqliteStore(path), SqliteStore(path)

    async def run() -> None:
        assert await first.put(_record("resp_a"))
        assert await second.get("resp_a") is not None
        assert await second.delete("resp_a")
        assert await first.get("resp_a") is None
        assert await first.put(_record("resp_b"))

    asyncio.run(run())
    first.close()
    second.close()
    again = SqliteStore(path)
    assert asyncio.run(again.get("resp_b")) is not None and again.totals() == (1, _record("resp_b").size)
    again.close()


def test_a_lower_bound_after_a_restart_evicts_the_oldest_down_to_it(tmp_path: Path) -> None:
    """More records than one batch of eviction reads (EVICT_BATCH) go at the next write."""
    path = str(tmp_path / "responses.sqlite3")
    wide = SqliteStore(path, StoreLimits(max_count=1000))
    for i in range(3 * EVICT_BATCH):
        assert wide._put(_record(f"r{i}"))
    wide.close()
    narrow = SqliteStore(path, StoreLimits(max_count=10))
    assert asyncio.run(narrow.put(_record("last")))
    assert narrow.totals() == (10, 10 * _record("last").size)
    assert asyncio.run(narrow.get("last")) is not None and asyncio.run(narrow.get(f"r{3 * EVICT_BATCH - 10}")) is None
    assert asyncio.run(narrow.get(f"r{3 * EVICT_BATCH - 9}")) is not None
    narrow.close()


def test_a_store_that_cannot_be_reached_is_a_503(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path))  # a folder: no database opens there
    with pytest.raises(ConveyorError, match="the stored responses cannot be reached") as err:
        asyncio.run(store.get("resp_a"))
    assert err.value.status is Status.UNAVAILABLE


# ------------------------------------------------------------------------------------------------ the errors


class _Refusing:
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, response_id: str) -> None:
        raise UnknownResponse(response_id, "response_id")


@pytest.mark.parametrize("triton", [False, True])
def test_an_unknown_id_is_openais_404(triton: bool) -> None:
    app = falcon.asgi.App(middleware=[RequestIds()])
    render = render_triton_error if triton else render_error
    app.add_error_handler(Exception, render)
    app.add_route("/v1/responses/{response_id}", _Refusing())
    got = falcon.testing.TestClient(app).simulate_get("/v1/responses/resp_x")
    assert got.status_code == 404
    message = "Response with id 'resp_x' not found."
    assert got.json == ({"detail": message} if triton else {"error": {
        "message": message, "type": "invalid_request_error", "param": "response_id", "code": 404}})
