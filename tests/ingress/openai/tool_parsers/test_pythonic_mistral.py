"""The ``pythonic`` and ``mistral`` tool-call readers: whole texts, the same texts streamed at every
character boundary and at random token-like ones, and vLLM 0.32's own parsers on the same texts."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import CallReader, read_whole
from conveyor.ingress.openai.tool_parsers.mistral import MistralCalls
from conveyor.ingress.openai.tool_parsers.pythonic import PythonicCalls

pytestmark = pytest.mark.unit

PYTHONIC_CALLS = [
    '[get_weather(city="Paris")]',
    '[get_weather(city="Paris", days=-3), other(x=1)]',
    "[f(a='it''s', b={'k': [1, (2, 3)], 'n': None}, c=true, d=1.5e3)]",
    '[f()]',
    '[f(a="a,b)]", b=\'q"\')]',
    '[f(text="caf\\u00e9 \\"x\\"")]',
]
PYTHONIC_CONTENT = ["hello", "[1] is a citation", " [f(a=1)]", "[f(a=1)] and text", "[f(1)]", "[f(a=g(1))]", "[]"]
MISTRAL_CALLS = [
    'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": [1, {"b": "}"}]}}, {"name": "g", "arguments": {}}]',
    '[TOOL_CALLS]{"name": "f", "arguments": {"a": 1}}',
    '[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]',
    'x[TOOL_CALLS]get_weather{"city": "Paris"}',
    '[TOOL_CALLS]f[ARGS]{"a": "[TOOL"}[TOOL_CALLS]g{"b": [2]} trailing',
]
MISTRAL_CONTENT = ["plain text", "[TOOL_CALLS][1]", "hi [TOOL_CALLS]{\"x\": 1}", "[TOOL_CALLS][{\"name\": \"f\""]


def _stream(reader: CallReader, pieces: list[str]) -> tuple[str, dict[int, dict[str, Any]]]:
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    for piece in [reader.feed(p) for p in pieces] + [reader.end()]:
        content += piece.content
        for d in piece.calls:
            if d.name is not None:
                assert d.index not in calls, "a call's first delta comes once"
                calls[d.index] = {"id": d.id, "name": d.name, "arguments": ""}
            calls[d.index]["arguments"] += d.arguments
    return content, calls


def _splits(text: str) -> list[list[str]]:
    rng = random.Random(text)
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return out


def _check_id(parser: str, id_: str) -> None:
    if parser == "mistral":
        assert len(id_) == 9 and id_.isalnum()
    else:
        assert id_.startswith("chatcmpl-tool-")


@pytest.mark.parametrize(("parser", "text"), [("pythonic", t) for t in PYTHONIC_CALLS]
                         + [("mistral", t) for t in MISTRAL_CALLS])
def test_calls_streamed_join_to_the_whole_answer(parser: str, text: str) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert whole.calls
    for call in whole.calls:
        _check_id(parser, call.id)
        json.loads(call.arguments)
    for pieces in _splits(text):
        content, calls = _stream(PARSERS[parser](), pieces)
        assert [c["name"] for c in calls.values()] == [c.name for c in whole.calls], pieces
        for got, want in zip(calls.values(), whole.calls, strict=True):
            _check_id(parser, got["id"])
            assert json.loads(got["arguments"]) == json.loads(want.arguments), pieces
            if parser == "pythonic":  # written by json.dumps, as vLLM: the same bytes
                assert got["arguments"] == want.arguments
        assert content.strip() == (whole.content or "").strip()


@pytest.mark.parametrize(("parser", "text"), [("pythonic", t) for t in PYTHONIC_CONTENT]
                         + [("mistral", t) for t in MISTRAL_CONTENT])
def test_not_calls_are_content(parser: str, text: str) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert not whole.calls
    assert whole.content


def test_pythonic_content_streamed_when_it_is_no_call() -> None:
    for text in ("hello", "[1] is a citation"):
        for pieces in _splits(text):
            assert _stream(PythonicCalls(), pieces) == (text, {})


def test_mistral_content_before_the_marker() -> None:
    text = MISTRAL_CALLS[0]
    for pieces in _splits(text):
        content, calls = _stream(MistralCalls(), pieces)
        assert content == "Sure."
        assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


# ------------------------------------------------------------------------------------ vLLM's own parsers


class _Vocab:
    """The little a vLLM parser asks of a tokenizer: its vocabulary ([ARGS] in it: a v11 Mistral one)."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def _vllm(parser: str, text: str) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    if parser == "pythonic":
        from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser
        vllm_parser: Any = PythonicToolParser(_Vocab({}))
    else:
        from vllm.tool_parsers.mistral_tool_parser import MistralToolParser
        legacy = text.split("[TOOL_CALLS]", 1)[-1].lstrip()[:1] in ("[", "{")
        vocab = {"[TOOL_CALLS]": 5} if legacy else {"[TOOL_CALLS]": 5, "[ARGS]": 6}
        vllm_parser = MistralToolParser(_Vocab(vocab))
    got = vllm_parser.extract_tool_calls(text, None)
    return (got.content, [(c.function.name, c.function.arguments) for c in got.tool_calls],
            [c.id for c in got.tool_calls])


@pytest.mark.parametrize(("parser", "text"), [("pythonic", t) for t in PYTHONIC_CALLS + PYTHONIC_CONTENT]
                         + [("mistral", t) for t in MISTRAL_CALLS + MISTRAL_CONTENT])
def test_same_as_vllm(parser: str, text: str) -> None:
    pytest.importorskip("vllm")
    content, calls, ids = _vllm(parser, text)
    ours = read_whole(PARSERS[parser](), text, "auto")
    assert ours.content == content
    assert [(c.name, c.arguments) for c in ours.calls] == calls
    for id_ in ids:
        _check_id(parser, id_)
