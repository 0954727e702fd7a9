"""vLLM's ``hermes`` tool-call parser (Qwen, Hermes and other models trained on its format)."""

from __future__ import annotations

from conveyor.ingress.openai.tool_parsers.base import CallObject, ObjectCalls, Piece, partial_tag


class HermesCalls(ObjectCalls):
    """vLLM's ``hermes`` format: content, then calls as ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``.
    As vLLM's parser, the content is the text before the first call; text between calls is dropped."""

    START, END = "<tool_call>", "</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""  # text that may be the start of a tag

    def feed(self, text: str) -> Piece:
        text = self._pending + text
        self._pending = ""
        content: list[str] = []
        at = 0
        while at < len(text):
            if self._calls and not (self._calls[-1].done or self._calls[-1].failed):
                at += self._read_object(text[at:])
                continue
            start = text.find(self.START, at)
            if start < 0:
                keep = partial_tag(text, self.START, at)
                if not self._calls:
                    content.append(text[at:len(text) - keep])
                self._pending = text[len(text) - keep:]
                break
            if not self._calls:
                content.append(text[at:start])
            self._calls.append(CallObject())
            at = start + len(self.START)
        return Piece("".join(content), self._deltas())

    def end(self) -> Piece:
        tail = "" if self._calls else self._pending  # a partial tag at the very end is content
        self._pending = ""
        super().end()
        return Piece(tail, self._deltas())
