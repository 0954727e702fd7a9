"""vLLM's ``llama3_json`` tool-call parser (``llama4_json`` is the same one, for Llama 4)."""

from __future__ import annotations

from typing import Literal

from conveyor.ingress.openai.tool_parsers.base import CallObject, ObjectCalls, Piece


class Llama3JsonCalls(ObjectCalls):
    """vLLM's ``llama3_json`` format: a text that starts with ``<|python_tag|>`` or ``{`` is calls,
    ``{"name": ..., "parameters": ...}`` separated by ``;``; any other text is content. (vLLM's
    non-streamed parser also finds objects later in the text; its streaming one does not, nor this one.)"""

    TAG = "<|python_tag|>"

    def __init__(self) -> None:
        super().__init__()
        self._kind: Literal["", "content", "calls"] = ""
        self._head = ""  # the text while it may still be the tag

    def feed(self, text: str) -> Piece:
        if self._kind == "":
            self._head += text
            head = self._head
            if head.startswith(self.TAG):
                self._kind, text = "calls", head[len(self.TAG):]
            elif head.startswith("{"):
                self._kind, text = "calls", head
            elif self.TAG.startswith(head):
                return Piece()
            else:
                self._kind = "content"
                return Piece(head)
        if self._kind == "content":
            return Piece(text)
        at = 0
        while at < len(text):
            if self._calls and not (self._calls[-1].done or self._calls[-1].failed):
                at += self._read_object(text[at:])
            elif text[at] == "{":
                self._calls.append(CallObject())
            else:
                at += 1  # separators (";", spaces) and stray text
        return Piece(calls=self._deltas())

    def end(self) -> Piece:
        head = self._head if self._kind == "" else ""
        super().end()
        return Piece(head, self._deltas())
