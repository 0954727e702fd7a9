"""The ``pythonic`` and ``mistral`` tool-call readers: whole texts, the same texts streamed at every
character boundary and at random token-like ones (test_same_as_vllm.py reads the same texts with vLLM's own
parsers)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import CallReader, read_whole
from conveyor.ingress.openai.tool_parsers.mistral import MistralCalls
from conveyor.ingress.openai.tool_parsers.pythonic import PythonicCalls
from tests.ingress.openai.tool_parsers.cases import (
    MISTRAL_CALLS,
    MISTRAL_CONTENT,
    PYTHONIC_CALLS,
    PYTHONIC_CONTENT,
    check_id,
)

LEVEL = "unit"


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


@pytest.mark.parametrize(("parser", "text"), [("pythonic", t) for t in PYTHONIC_CALLS]
                         + [("mistral", t) for t in MISTRAL_CALLS])
def test_calls_streamed_join_to_the_whole_answer(parser: str, text: str) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert whole.calls
    for call in whole.calls:
        check_id(parser, call.id)
        json.loads(call.arguments)
    for pieces in _splits(text):
        content, calls = _stream(PARSERS[parser](), pieces)
        assert [c["name"] for c in calls.values()] == [c.name for c in whole.calls], pieces
        for got, want in zip(calls.values(), whole.calls, strict=True):
            check_id(parser, got["id"])
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
