"""OpenAI's Responses API in front of the real engine (the ``vllm`` backend serving the tiny Llama,
tests/support/vllm_group.py, the session's group), with the official ``openai`` client: a response is the chat
completion of the same conversation (greedy: token for token, and vLLM's own output on the model's template),
plain and streamed; a forced function call and its output in a follow-up on the stored conversation; structured
outputs through ``text.format``; an answer cut by ``max_output_tokens`` is ``incomplete``. The store across
ingress processes and restarts, keys and errors: test_openai_responses_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.support import tiny_llama
from tests.support.vllm_group import MODEL, VllmGroup
from tests.support.vllm_reference import CHAT, MAX_TOKENS

LEVEL = "e2e"

tiny_llama.require_vllm()

# The group's fixture runs vLLM's reference and loads the group's engine: it counts against the first test's time.
pytestmark = pytest.mark.timeout(600)

TOOL_TOKENS = 48  # room for the forced JSON: a dozen tokens or so
WEATHER: Any = {"type": "function", "name": "get_weather", "description": "the weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["oslo", "rome"]}}, "required": ["city"],
    "additionalProperties": False}}


@pytest.fixture(scope="module")
def group(served_llm: VllmGroup) -> VllmGroup:
    """The session's vLLM group (tests/support/vllm_group.py), which the other vLLM tests share."""
    return served_llm


@pytest.fixture(scope="module")
def client(group: VllmGroup) -> Any:
    """The client, untyped: its typed arguments and answers are unions of every kind of item and tool."""
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group.openai_port}/v1", api_key="none", max_retries=0,
                         timeout=120)


def test_a_response_is_the_chat_completion_of_its_input(group: VllmGroup, client: Any) -> None:
    text, n_out, n_in = group.ref.chat[None]  # vLLM's own greedy answer on the model's template
    out = client.responses.create(model=MODEL, input=CHAT[0]["content"], temperature=0,
                                  max_output_tokens=MAX_TOKENS)
    assert out.output_text == text
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens) == (n_in, n_out)
    assert out.status == ("incomplete" if n_out == MAX_TOKENS else "completed")
    if n_out == MAX_TOKENS:
        assert out.incomplete_details is not None and out.incomplete_details.reason == "max_output_tokens"
    with client.responses.stream(model=MODEL, input=CHAT, temperature=0, max_output_tokens=MAX_TOKENS) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == text
    assert final.usage is not None and final.usage.output_tokens == n_out


def test_a_forced_call_and_its_output_continue_the_stored_conversation(client: Any) -> None:
    out = client.responses.create(model=MODEL, input=CHAT, temperature=0, max_output_tokens=TOOL_TOKENS,
                                  tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    (call,) = out.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    follow = client.responses.create(model=MODEL, previous_response_id=out.id, temperature=0,
                                     max_output_tokens=MAX_TOKENS, tools=[WEATHER], tool_choice="none",
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "rain"}])
    # The same conversation sent whole, as a client without a store would: the same answer.
    whole = client.responses.create(model=MODEL, temperature=0, max_output_tokens=MAX_TOKENS, tools=[WEATHER],
                                    tool_choice="none", store=False, input=[
                                        *CHAT, {"type": "function_call", "call_id": call.call_id,
                                                "name": "get_weather", "arguments": call.arguments},
                                        {"type": "function_call_output", "call_id": call.call_id, "output": "rain"}])
    assert follow.output_text == whole.output_text and follow.usage is not None and whole.usage is not None
    assert follow.usage.input_tokens == whole.usage.input_tokens


def test_text_format_is_structured_output(client: Any) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "enum": ["oslo", "rome"]}},
              "required": ["city"], "additionalProperties": False}
    out = client.responses.create(model=MODEL, input=CHAT, temperature=0, max_output_tokens=TOOL_TOKENS,
                                  text={"format": {"type": "json_schema", "name": "place", "schema": schema,
                                                   "strict": True}})
    jsonschema.validate(json.loads(out.output_text), schema)
    assert out.text is not None and out.text.format is not None and out.text.format.type == "json_schema"
