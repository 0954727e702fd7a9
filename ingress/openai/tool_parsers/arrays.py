"""What vLLM's ``granite``, ``jamba`` and ``xlam`` tool-call parsers share: a JSON array of
``{"name", "arguments"}`` objects behind a marker (each format's module says which), read by the
``required`` reader's array scanner (``forced.CallArray``). The arguments are the model's own text (the
same JSON; a string value: the string it holds, as vLLM); their non-streamed readings are vLLM 0.32's
own (each class's ``read_all``).
"""

from __future__ import annotations

import json

from conveyor.ingress.openai.tool_parsers.base import Answer, CallObject, Piece, ToolCall, partial_tag, vllm_tool_id
from conveyor.ingress.openai.tool_parsers.forced import CallArray


class ArgumentsCall(CallObject):
    """A call of these formats: its arguments are the ``"arguments"`` value alone (vLLM's three read no
    ``"parameters"``). A string value leaves once the object closes, as the string it holds."""

    ARGUMENT_KEYS = ("arguments",)

    def __init__(self, decode_strings: bool, empty: str) -> None:
        super().__init__()
        self._decode = decode_strings
        self._empty = empty  # the arguments of a call that closes without any ("": none)
        self._quoted: list[str] | None = None  # a string value's text, held until whole
        self._began = False  # some argument text was taken
        self.ended = False  # the model's text is over: what is held leaves as it is

    def take_arguments(self) -> str:
        text = super().take_arguments()
        if self._decode and not self._began and text.startswith('"'):
            self._quoted = []
        if text:
            self._began = True
        if self._quoted is not None:
            self._quoted.append(text)
            if not (self.done or self.ended):
                return ""
            raw, self._quoted = "".join(self._quoted), None
            try:
                value = json.loads(raw)
            except ValueError:
                return raw
            return value if isinstance(value, str) else raw
        if (self.done or self.failed or self.ended) and not self.has_arguments and self._empty and not self._began:
            self._began = True
            return self._empty
        return text


class ArrayCalls(CallArray):
    """Calls as one JSON array framed by markers (each format says how); ``_pending`` holds text whose
    meaning the next piece decides (a marker's start, a fence's language)."""

    DECODE_STRINGS = True  # a string "arguments" value is the arguments' text (vLLM: granite, xlam)
    EMPTY = ""  # a call's arguments when it has none (granite: "{}"; else such a call never shows)

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""
        self._mode = "content"
        self._held: list[str] | None = None  # jamba, xlam: the array's text from its marker on, while no
        # call has shown (content if none does)

    def new_id(self) -> str:
        return vllm_tool_id()

    def _new_call(self) -> CallObject:
        return ArgumentsCall(self.DECODE_STRINGS, self.EMPTY)

    def _shows(self, call: CallObject) -> bool:
        return call.name is not None and (call.has_arguments or bool(self.EMPTY))

    def _answer(self, content: str | None, calls: list[tuple[str, str]]) -> Answer:
        return Answer(content, [ToolCall(self.new_id(), name, args) for name, args in calls])

    def _tail(self) -> str:
        """At the end: the held text that is content."""
        return self._pending

    def end(self) -> Piece:
        tail = self._tail()
        self._pending = ""
        for call in self._calls:
            if isinstance(call, ArgumentsCall):
                call.ended = True
        super().end()
        return Piece(tail, self._deltas())


def first_mark(text: str, marks: tuple[str, ...], start: int) -> tuple[int, str]:
    """Where the first of ``marks`` begins in ``text[start:]``, and which (-1, "" when none does)."""
    found = [(at, mark) for mark in marks if (at := text.find(mark, start)) >= 0]
    return min(found) if found else (-1, "")


def hold_marks(text: str, marks: tuple[str, ...], start: int) -> int:
    """How many characters at the end of ``text[start:]`` may begin one of ``marks``."""
    return max(partial_tag(text, mark, start) for mark in marks)
