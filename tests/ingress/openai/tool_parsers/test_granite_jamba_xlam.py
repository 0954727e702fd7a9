"""The ``granite``, ``jamba`` and ``xlam`` tool-call readers: whole texts (calls, the content beside them,
texts that are no calls), the same texts streamed in pieces of 1 to 3 characters at every offset and cut
in two at every boundary (test_same_as_vllm.py reads the same texts with vLLM's own parsers)."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from conveyor.ingress.openai.tool_parsers import PARSERS
from conveyor.ingress.openai.tool_parsers.base import CallReader, read_whole
from conveyor.ingress.openai.tools import PARSERS as TOOLS_PARSERS
from tests.ingress.openai.tool_parsers.cases import CALLS, CONTENT, GRANITE_NO_ARRAY, check_id

LEVEL = "unit"


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


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CALLS)
def test_whole_answer(parser: str, text: str, content: str | None, calls: list[tuple[str, Any]]) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    for i, call in enumerate(whole.calls):
        check_id(parser, call.id)
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
            check_id(parser, call["id"])


@pytest.mark.parametrize(("parser", "text"), CONTENT)
def test_no_calls_is_content(parser: str, text: str) -> None:
    whole = read_whole(PARSERS[parser](), text, "auto")
    assert (whole.content, whole.calls) == (text, [])


@pytest.mark.parametrize(("parser", "text"), [c for c in CONTENT if "}]" not in c[1] or "</" in c[1]])
def test_no_calls_streamed_is_content(parser: str, text: str) -> None:
    # (not the arrays of calls that only what follows them makes content: their calls are sent by then)
    for pieces in _splits(text):
        assert _stream(PARSERS[parser](), pieces) == (text, []), pieces


def test_granite_drops_a_marker_without_an_array() -> None:
    whole = read_whole(PARSERS["granite"](), GRANITE_NO_ARRAY, "auto")
    assert (whole.content, whole.calls) == ('a {"name": "f"}', [])
    for pieces in _splits(GRANITE_NO_ARRAY):
        assert _stream(PARSERS["granite"](), pieces) == ('a {"name": "f"}', [])


def test_the_registry_has_every_parser() -> None:
    assert set(PARSERS) == {"hermes", "llama3_json", "llama4_json", "pythonic", "mistral", "granite", "jamba", "xlam"}
    assert TOOLS_PARSERS is PARSERS  # the one registry: a TOOL_CALL_PARSER not in it is refused
