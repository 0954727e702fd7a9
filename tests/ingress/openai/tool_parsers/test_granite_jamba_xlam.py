"""The ``granite``, ``jamba`` and ``xlam`` tool-call readers: whole texts (calls, the content beside them,
texts that are no calls), the same texts streamed in pieces of 1 to 3 characters at every offset and cut
in two at every boundary, and vLLM 0.32's own parsers on the same texts."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import CallReader, read_whole
from conveyor.ingress.openai.tools import PARSERS as TOOLS_PARSERS

pytestmark = pytest.mark.unit

# parser, text, content, calls (name, arguments as JSON)
CALLS: list[tuple[str, str, str | None, list[tuple[str, Any]]]] = [
    ("granite", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]', None,
     [("get_weather", {"city": "Paris"})]),
    ("granite", 'Sure. <tool_call> [{"name": "f", "arguments": {"a": [1, {"b": "}]"}]}},\n'
     '{"name": "g", "arguments": {}}] trailing', "Sure.", [("f", {"a": [1, {"b": "}]"}]}), ("g", {})]),
    ("granite", '<|tool_call|>[{"arguments": {"q": "<tool_call>"}, "name": "f"}, {"name": "h"}]', None,
     [("f", {"q": "<tool_call>"}), ("h", {})]),
    ("granite", '<|tool_call|>[{"name": "f", "arguments": "{\\"a\\": \\"caf\\u00e9\\"}"}]', None,
     [("f", {"a": "café"})]),
    ("granite", 'x <|tool_call|> {"y": 1} and <tool_call>[{"name": "f", "arguments": {"n": -1.5e3}}]', 'x {"y": 1} and',
     [("f", {"n": -1.5e3})]),
    ("jamba", 'Let me check. <tool_calls>[{"name": "f", "arguments": {"city": "é\\"}"}}, '
     '{"name": "g", "arguments": {}}]</tool_calls> after', "Let me check. ", [("f", {"city": 'é"}'}), ("g", {})]),
    ("jamba", ' <tool_calls>\n[{"arguments": "text", "name": "f"}]\n</tool_calls>', None, [("f", "text")]),
    ("xlam", '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": "{\\"b\\": [2]}"}]', None,
     [("f", {"a": 1}), ("g", {"b": [2]})]),
    ("xlam", '<think>which tool?</think>\n[{"name": "f", "arguments": {"a": "]"}}]', "<think>which tool?</think>",
     [("f", {"a": "]"})]),
    ("xlam", 'Sure.\n```json\n[{"name": "f", "arguments": {"a": 1}}]\n```\nDone.', "Sure.\n\nDone.", [("f", {"a": 1})]),
    ("xlam", '```[{"name": "f", "arguments": {}}]```', "", [("f", {})]),
    ("xlam", 'x [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]\nnext line', "x \nnext line", [("f", {"a": 1})]),
    ("xlam", 'pre <tool_call>[{"name": "f", "arguments": {"a": 1}}, {"name": "skipped"}]</tool_call> post',
     "pre  post", [("f", {"a": 1})]),
]
# parser, text: no calls, the whole text the content
CONTENT: list[tuple[str, str]] = [
    ("granite", "plain text"), ("granite", "ends in <tool_ca"),
    ("jamba", "plain text"), ("jamba", '<tool_calls>[{"name": "f", "arguments": {}}]'),
    ("jamba", '<tool_calls>{"name": "f", "arguments": {}}</tool_calls>'),
    ("jamba", '<tool_calls>[{"name": "f"}]</tool_calls>'),
    ("jamba", 'a <tool_calls>[{"name": 1, "arguments": {}}]</tool_calls>'),
    ("xlam", "plain text"), ("xlam", "see [1] and ```python\nprint(1)\n```"), ("xlam", "[1] is a citation"),
    ("xlam", '[{"name": "f", "arguments": {}}] and more'), ("xlam", '[{"name": 1, "arguments": {}}]'),
]


def _stream(reader: CallReader, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The content and calls a client assembles from the deltas."""
    content = ""
    calls: list[dict[str, Any]] = []
    for piece in [reader.feed(p) for p in pieces] + [reader.end()]:
        content += piece.content
        assert len({d.index for d in piece.calls}) == len(piece.calls)  # one delta per call per chunk
        for d in piece.calls:
            if d.name is not None:  # a call's first delta: its index, id and whole name, once
                assert d.index == len(calls) and d.id
                calls.append({"id": d.id, "name": d.name, "arguments": ""})
            calls[d.index]["arguments"] += d.arguments
    return content, calls


def _splits(text: str) -> list[list[str]]:
    """Pieces of 1, 2 and 3 characters at every offset, two pieces at every boundary, and random pieces of
    1 to 3 characters."""
    out = [[text]]
    for size in (1, 2, 3):
        for offset in range(size):
            out.append([text[:offset]] + [text[i:i + size] for i in range(offset, len(text), size)])
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    rng = random.Random(text)
    for _ in range(20):
        cuts = [0]
        while cuts[-1] < len(text):
            cuts.append(cuts[-1] + rng.randint(1, 3))
        out.append([text[a:b] for a, b in itertools.pairwise(cuts)])
    return out


def _check_id(parser: str, id_: str) -> None:
    if parser == "xlam":
        prefix, index, rest = id_.split("_")
        assert prefix == "call" and index.isdigit() and len(rest) == 16
    else:
        assert id_.startswith("chatcmpl-tool-") and len(id_) == len("chatcmpl-tool-") + 16


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CALLS)
def test_whole_answer(parser: str, text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    for i, call in enumerate(whole.calls):
        _check_id(parser, call.id)
        assert parser != "xlam" or call.id.startswith(f"call_{i}_")


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CALLS)
def test_streamed_deltas_join_to_the_whole_answer(
    parser: str, text: str, content: str | None, calls: list[tuple[str, Any]],
) -> None:
    for pieces in _splits(text):
        streamed_content, streamed = _stream(PARSERS[parser](), pieces)
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed] == calls, pieces
        assert streamed_content.strip() == (content or "").strip(), pieces
        for call in streamed:
            _check_id(parser, call["id"])


@pytest.mark.parametrize(("parser", "text"), CONTENT)
def test_no_calls_is_content(parser: str, text: str) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert (whole.content, whole.calls) == (text, [])


@pytest.mark.parametrize(("parser", "text"), [c for c in CONTENT if "}]" not in c[1] or "</" in c[1]])
def test_no_calls_streamed_is_content(parser: str, text: str) -> None:
    # (not the arrays of calls that only what follows them makes content: their calls are sent by then)
    for pieces in _splits(text):
        assert _stream(PARSERS[parser](), pieces) == (text, []), pieces


GRANITE_NO_ARRAY = 'a <|tool_call|> {"name": "f"}'


def test_granite_drops_a_marker_without_an_array() -> None:
    whole = read_whole(PARSERS["granite"](), GRANITE_NO_ARRAY, "auto")
    assert (whole.content, whole.calls) == ('a {"name": "f"}', [])
    for pieces in _splits(GRANITE_NO_ARRAY):
        assert _stream(PARSERS["granite"](), pieces) == ('a {"name": "f"}', [])


def test_the_registry_has_every_parser() -> None:
    assert set(PARSERS) == {"hermes", "llama3_json", "llama4_json", "pythonic", "mistral", "granite", "jamba", "xlam"}
    assert TOOLS_PARSERS is PARSERS  # the one registry: a TOOL_CALL_PARSER not in it is refused


# ------------------------------------------------------------------------------------ vLLM's own parsers


class _Vocab:
    """The little vLLM's parsers ask of a tokenizer: its vocabulary (Jamba's needs its two tags there)."""

    def get_vocab(self) -> dict[str, int]:
        return {"<|tool_call|>": 5, "<tool_calls>": 6, "</tool_calls>": 7}


def _vllm(parser: str, text: str) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    vllm_parser: Any
    if parser == "granite":
        from vllm.tool_parsers.granite_engine_tool_parser import GraniteEngineToolParser
        vllm_parser = GraniteEngineToolParser(_Vocab())
    elif parser == "jamba":
        from vllm.tool_parsers.jamba_tool_parser import JambaToolParser
        vllm_parser = JambaToolParser(_Vocab())
    else:
        from vllm.tool_parsers.xlam_tool_parser import xLAMToolParser
        vllm_parser = xLAMToolParser(_Vocab())
    got = vllm_parser.extract_tool_calls(text, None)
    return (got.content, [(c.function.name, c.function.arguments) for c in got.tool_calls],
            [c.id for c in got.tool_calls])


@pytest.mark.parametrize(("parser", "text"), [(c[0], c[1]) for c in CALLS] + CONTENT + [("granite", GRANITE_NO_ARRAY)])
def test_same_as_vllm(parser: str, text: str) -> None:
    pytest.importorskip("vllm")
    content, calls, ids = _vllm(parser, text)
    ours = read_whole(PARSERS[parser](), text, "auto")
    assert ours.content == content
    assert [(c.name, c.arguments) for c in ours.calls] == calls  # the same bytes
    for id_ in ids:
        _check_id(parser, id_)
