"""vLLM's ``jamba`` tool-call parser (AI21 Jamba): content, then ``<tool_calls>[...]</tool_calls>``; the
arguments re-written by ``json.dumps``. Anything wrong with the array (no closing tag, no JSON, a call
without its name or arguments) makes the whole text content.
"""

from __future__ import annotations

import json
import re

from conveyor.ingress.openai.tool_parsers.arrays import ArrayCalls
from conveyor.ingress.openai.tool_parsers.base import SPACE, Answer, Piece, partial_tag, vllm_json

JAMBA_START, JAMBA_END = "<tool_calls>", "</tool_calls>"
_JAMBA_BLOCK = re.compile(rf"{JAMBA_START}(.*?){JAMBA_END}", re.DOTALL)


def jamba_whole(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed ``jamba`` reading: (content, calls)."""
    block = _JAMBA_BLOCK.search(text)
    if block is None:
        return text, []
    try:
        calls = [(call["name"], vllm_json(call["arguments"])) for call in json.loads(block.group(1))]
    except (ValueError, TypeError, KeyError, IndexError):
        return text, []  # vLLM's: any failure leaves the whole text as content
    if not all(isinstance(name, str) for name, _ in calls):
        return text, []  # vLLM's FunctionCall refuses a name that is no string
    content = text[:text.find(JAMBA_START)]
    return (content if content not in ("", " ") else None), calls


class JambaCalls(ArrayCalls):
    """vLLM's ``jamba``: content, then ``<tool_calls>`` and the array; what follows it is dropped.
    Streamed, a block in which no call shows (no array, calls without a name or arguments) is content,
    its tag with it, once the text is over."""

    DECODE_STRINGS = False  # vLLM's writes any value with json.dumps: a string stays a JSON string

    def read_all(self, text: str) -> Answer:
        return self._answer(*jamba_whole(text))

    def feed(self, text: str) -> Piece:
        text = self._pending + text
        self._pending = ""
        content = ""
        at = 0
        if self._mode == "content":
            start = text.find(JAMBA_START)
            at = start if start >= 0 else len(text) - partial_tag(text, JAMBA_START, 0)
            content = text[:at]
            if start < 0:
                self._pending = text[at:]
                return Piece(content)
            self._mode, self._held = "open", [JAMBA_START]
            at += len(JAMBA_START)
        if self._held is not None:
            self._held.append(text[at:])
        while at < len(text) and self._mode != "over":
            if self._mode == "open":  # spaces, then "[" (else no array: the block is content at the end)
                self._mode = "open" if text[at] in SPACE else "array" if text[at] == "[" else "over"
                at += self._mode != "over"
            else:
                at += self._read_array(text[at:])
                self._mode = "over" if self._over else "array"
        piece = Piece(content, self._deltas())
        if self._ids:
            self._held = None
        return piece

    def _tail(self) -> str:
        if self._mode == "content":
            return self._pending
        return "".join(self._held) if self._held is not None else ""
