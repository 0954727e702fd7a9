"""The readers every parser shares (tool_parsers/base.py: ``read_whole``, the finish reason), those of a
forced ``tool_choice`` (forced.py) and the ``hermes`` and ``llama3_json`` parsers. Streamed, the text is split
at every boundary: whatever the token boundaries, the deltas joined are the non-streamed answer's calls, the
name arrives whole in each call's first delta, and the arguments parse as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers.base import CallReader, Mode, finish_reason, read_whole
from conveyor.ingress.openai.tool_parsers.forced import CallArray, NamedCall
from conveyor.ingress.openai.tool_parsers.hermes import HermesCalls
from conveyor.ingress.openai.tool_parsers.llama import Llama3JsonCalls

LEVEL = "unit"


def _splits(text: str) -> Iterator[list[str]]:
    """The text in two pieces at every boundary, in two pieces around every span of up to 6 characters,
    and one character at a time."""
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    for i in range(len(text)):
        for j in range(i + 1, min(i + 7, len(text) + 1)):
            yield [text[:i], text[i:j], text[j:]]
    yield list(text)


def _streamed(reader: CallReader, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The content and calls a client assembles from the deltas (OpenAI's streaming rules)."""
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for piece in [reader.feed(p) for p in pieces] + [reader.end()]:
        content.append(piece.content)
        assert len({d.index for d in piece.calls}) == len(piece.calls)  # one delta per call per chunk
        for delta in piece.calls:
            wire = delta.wire()
            if delta.index == len(calls):  # a call's first delta: index, id, type and the whole name
                assert wire["id"].startswith("call_") and wire["type"] == "function" and wire["function"]["name"]
                calls.append({"id": wire["id"], "name": wire["function"]["name"],
                              "arguments": wire["function"]["arguments"]})
            else:
                assert delta.index < len(calls) and "name" not in wire["function"] and "id" not in wire
                calls[delta.index]["arguments"] += wire["function"]["arguments"]
    return "".join(content), calls


CASES: list[tuple[Callable[[], CallReader], Mode, str, str | None, list[tuple[str, Any]]]] = [
    # reader, mode, text, content, calls (name, arguments)
    (lambda: NamedCall("get_weather"), "named", '{"city": "Oslo", "days": 3}', None,
     [("get_weather", {"city": "Oslo", "days": 3})]),
    (CallArray, "required",
     '[{"name": "get_weather", "parameters": {"city": "a\\"}]b", "days": 12}}, '
     '{"parameters": {}, "name": "get_time"}]', None,
     [("get_weather", {"city": 'a"}]b', "days": 12}), ("get_time", {})]),
    (HermesCalls, "auto",
     'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "<tool_call>", "days": [1, {"x": null}]}}'
     '\n</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', "Let me look. ",
     [("get_weather", {"city": "<tool_call>", "days": [1, {"x": None}]}), ("get_time", {})]),
    (Llama3JsonCalls, "auto",
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo;{"}}; {"name": "get_time", "parameters": 7}',
     None, [("get_weather", {"city": "Oslo;{"}), ("get_time", 7)]),
    (Llama3JsonCalls, "auto", '{"name": "get_time", "arguments": {"tz": "UTC"}}', None, [("get_time", {"tz": "UTC"})]),
    (Llama3JsonCalls, "auto", "<|python no, just text {}", "<|python no, just text {}", []),
    (HermesCalls, "auto", "plain text that ends in <tool", "plain text that ends in <tool", []),
]


@pytest.mark.parametrize(("make", "mode", "text", "content", "calls"), CASES)
def test_deltas_joined_are_the_whole_answer_at_every_split(
    make: Callable[[], CallReader], mode: Mode, text: str, content: str | None, calls: list[tuple[str, Any]],
) -> None:
    whole = read_whole(make(), text, mode)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    for pieces in _splits(text):
        streamed_content, streamed = _streamed(make(), pieces)
        assert streamed_content == (content or "") if calls else streamed_content == text, pieces
        assert [(c["name"], c["arguments"]) for c in streamed] == [(c.name, c.arguments) for c in whole.calls], pieces


def test_a_named_call_shows_at_once_even_without_text() -> None:
    reader = NamedCall("get_time")
    first = reader.feed("")
    assert [d.wire()["function"] for d in first.calls] == [{"name": "get_time", "arguments": ""}]
    assert reader.feed("").calls == [] and reader.end().calls == []
    assert [c.name for c in read_whole(NamedCall("get_time"), "", "named").calls] == ["get_time"]


def test_auto_keeps_text_that_is_no_valid_call_as_content() -> None:
    # As vLLM's parsers: JSON that does not parse, or a call without its arguments, leaves the text as it is.
    for reader, text in [(HermesCalls(), 'a <tool_call>{"name": "f", "arguments": {"x": }}</tool_call>'),
                         (HermesCalls(), 'a <tool_call>{"name": "f"}</tool_call>'),
                         (HermesCalls(), 'a <tool_call>{"name": "f", "arguments": {"x": 1'),
                         (Llama3JsonCalls(), '{"name": "f", "parameters": {"x": 1}'),
                         (Llama3JsonCalls(), '{"nam": "f", "parameters": {}}')]:
        answer = read_whole(reader, text, "auto")
        assert (answer.content, answer.calls) == (text, []), text


def test_the_finish_reason_says_tool_calls_unless_cut_short() -> None:
    assert finish_reason(True, "stop") == "tool_calls"
    assert finish_reason(True, "length") == "length"  # the arguments may be cut short
    assert finish_reason(False, "stop") == "stop" and finish_reason(True, None) is None
