"""What every tool-call parser shares: the deltas and calls it hands out, the reader interface
(``CallReader``), the JSON scanner most formats read their calls with (``CallObject``), and a whole
answer read as the streamed deltas joined (``read_whole``).

The parsers are written after vLLM's of the same names, on the text alone: the ingress loads no
tokenizer and sees no token ids, and vLLM's parser classes need both (and importing vLLM would cost every
ingress process seconds and hundreds of MiB).

Streaming: every reader takes the text a piece at a time and hands out deltas: a call's first delta
carries its index, id, type and name (once the name is whole); the later ones carry pieces of its
arguments. The arguments are the model's own text of the value, so the pieces joined are exactly the
arguments a non-streamed answer carries, wherever the token boundaries fell. A non-streamed answer is
read by the same code, in one piece.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Mode = Literal["none", "auto", "required", "named"]  # what a request's tool_choice asks of the answer


@dataclass(slots=True)
class CallDelta:
    """One call's part of a chunk: the first carries ``id`` and ``name``, the others argument pieces."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def wire(self) -> dict[str, Any]:
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class Piece:
    """What one piece of the model's text gives the answer: content, and call deltas (one per call)."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def vllm_tool_id() -> str:
    """vLLM's ``make_tool_call_id()``: ``chatcmpl-tool-`` and 16 hex digits."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"


def vllm_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # vLLM's writing of arguments it re-writes, byte for byte


_ARGUMENT_KEYS = ("arguments", "parameters")
SPACE = " \t\r\n"


class JsonNesting:
    """Where a JSON text stands after each character: inside a string (just after a backslash in it) and
    how many brackets deep. What a streamed reader needs to tell where one value ends."""

    __slots__ = ("depth", "escape", "string")

    def __init__(self) -> None:
        self.depth = 0
        self.string = self.escape = False

    def step(self, ch: str) -> None:
        if self.string:
            if self.escape:
                self.escape = False
            elif ch == "\\":
                self.escape = True
            elif ch == '"':
                self.string = False
        elif ch == '"':
            self.string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1


class CallObject:
    """One JSON object ``{"name": ..., "arguments": ...}`` (or ``"parameters"``) read a piece at a time:
    its name once whole, and the raw text of its arguments value as it arrives. A small JSON scanner
    (strings, escapes, nesting) rather than a parser: the arguments leave before the object is whole."""

    ARGUMENT_KEYS: tuple[str, ...] = _ARGUMENT_KEYS  # the keys whose value is the arguments

    def __init__(self) -> None:
        self.done = False
        self.failed = False  # not an object: the text is no call
        self.index: int | None = None  # its place among the answer's calls, once its first delta left
        self.name: str | None = None
        self.has_arguments = False
        self._state = "start"  # start, key, colon, value, in_key, in_value, after
        self._key: list[str] = []
        self._kind = ""  # what the value being read is: "name", "args" or "" (skipped)
        self._value: list[str] = []  # the name's raw text (with its quotes)
        self._args: list[str] = []  # argument text not taken yet
        self._raw: list[str] = []  # the whole object, to check it (``valid``)
        self._nest = JsonNesting()  # where the value being read stands
        self._escape = False  # after a backslash in the key
        self._scalar = False  # the value is a number, true, false or null: it ends at a delimiter

    def feed(self, text: str) -> int:
        """Read ``text``; how much of it the object took (all of it, unless the object ended in it)."""
        for i, ch in enumerate(text):
            if self.done or self.failed:
                return i
            self._char(ch)
        return len(text)

    def take_arguments(self) -> str:
        """The argument text read since the last take."""
        out = "".join(self._args)
        self._args.clear()
        return out

    @property
    def valid(self) -> bool:
        """Whole, valid JSON, with a name and arguments: what vLLM's parsers accept as a call."""
        if not self.done or self.name is None or not self.has_arguments:
            return False
        try:
            doc = orjson.loads("".join(self._raw))
        except orjson.JSONDecodeError:
            return False
        return isinstance(doc, dict)

    def _char(self, ch: str) -> None:
        state = self._state
        if state == "in_value":
            if self._value_char(ch):
                return
            state = self._state  # a number, true, false or null ended at this delimiter: the object's
        elif state == "in_key":
            self._raw.append(ch)
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._state = "colon"
                return
            self._key.append(ch)
            return
        if ch in SPACE:
            if state != "start":
                self._raw.append(ch)
            return
        if state == "value":
            self._begin_value(ch)
            return
        if state == "start" and ch == "{":
            self._state = "key"
        elif state in ("key", "after") and ch == "}":
            self.done = True
        elif state == "key" and ch == '"':
            self._key.clear()
            self._state = "in_key"
        elif state == "after" and ch == ",":
            self._state = "key"
        elif state == "colon" and ch == ":":
            self._state = "value"
        else:
            self.failed = True
            return
        self._raw.append(ch)

    def _begin_value(self, ch: str) -> None:
        key = unquote("".join(self._key))
        self._kind = "name" if key == "name" else "args" if key in self.ARGUMENT_KEYS else ""
        if self._kind == "args":
            self.has_arguments = True
        self._value.clear()
        self._nest = JsonNesting()
        self._scalar = ch not in '"{['
        self._state = "in_value"
        if not self._value_char(ch):  # no value at all (``"a": ,``): the delimiter is the object's
            self._char(ch)

    def _value_char(self, ch: str) -> bool:
        """A character of the value being read (False: it ends a scalar and is not the value's); at the
        value's end the state moves on (``after``)."""
        if self._scalar and (ch in SPACE or ch in ",}"):
            self._end_value()
            return False
        self._raw.append(ch)
        if self._kind == "args":
            self._args.append(ch)
        elif self._kind == "name":
            self._value.append(ch)
        if self._scalar:
            return True
        nest = self._nest
        was_string = nest.string
        nest.step(ch)
        closed = not nest.string if was_string else ch in "}]"  # a closing quote or bracket
        if closed and nest.depth == 0:
            self._end_value()
        return True

    def _end_value(self) -> None:
        if self._kind == "name":
            raw = "".join(self._value)
            self.name = (unquote(raw) or None) if raw.startswith('"') else None
        self._state = "after"


def unquote(raw: str) -> str:
    """A JSON string's value (``raw`` with its quotes, or without: a key's inside)."""
    try:
        value = orjson.loads(raw if raw.startswith('"') else f'"{raw}"')
    except orjson.JSONDecodeError:
        return ""
    return value if isinstance(value, str) else ""


class CallReader:
    """One choice's text read as content and tool calls (``feed`` each new piece, ``end`` once)."""

    def __init__(self) -> None:
        self._calls: list[CallObject] = []
        self._ids: list[str] = []  # the calls whose first delta left (their name was whole)
        self.valid = True  # every call read is one vLLM's parser would accept

    def feed(self, text: str) -> Piece:
        raise NotImplementedError

    def end(self) -> Piece:
        """The text is over: whatever was held back."""
        for call in self._calls:
            if not call.valid:
                self.valid = False
        return Piece()

    @property
    def called(self) -> bool:
        return bool(self._ids)

    def new_id(self) -> str:
        """A call's id, in the form the model's vLLM parser gives."""
        return call_id()

    def read_all(self, text: str) -> Answer | None:
        """A whole ``auto`` answer read as vLLM's non-streaming parser reads it, for the parsers whose
        whole reading is not their streamed one joined (None: read by ``feed`` and ``end``)."""
        return None

    def _deltas(self) -> list[CallDelta]:
        """What the calls read since the last time give: a first delta once a name is whole, then
        argument pieces (held while the name is not whole: it comes first)."""
        out = []
        for call in self._calls:
            if not self._shows(call):
                continue
            args = call.take_arguments()
            if call.index is None:
                call.index = len(self._ids)
                self._ids.append(self.new_id())
                out.append(CallDelta(call.index, args, self._ids[call.index], call.name))
            elif args:
                out.append(CallDelta(call.index, args))
        return out

    def _shows(self, call: CallObject) -> bool:
        """Whether the call's first delta may leave: a call without a name never shows."""
        return call.name is not None


class ObjectCalls(CallReader):
    """Calls written as JSON objects with something around and between them (each framing says what)."""

    def _read_object(self, text: str) -> int:
        """Feed the open call; how much of ``text`` it took."""
        call = self._calls[-1]
        used = call.feed(text)
        if call.failed:
            self.valid = False
        return used


def partial_tag(text: str, tag: str, start: int) -> int:
    """How many characters at the end of ``text[start:]`` may begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[len(text) - n:]):
            return n
    return 0

@dataclass(slots=True)
class Answer:
    """A whole choice read: its content and calls."""

    content: str | None
    calls: list[ToolCall]


def read_whole(reader: CallReader, text: str, mode: Mode) -> Answer:
    """A non-streamed choice: the streamed deltas, joined. ``auto``: as vLLM's parsers, a call that is
    not valid JSON with a name and arguments makes the whole text the content, with no calls."""
    if mode == "auto":
        whole = reader.read_all(text)
        if whole is not None:
            return whole
    pieces = [reader.feed(text), reader.end()]
    content = "".join(p.content for p in pieces)
    calls: list[ToolCall] = []
    for delta in (d for p in pieces for d in p.calls):
        if delta.name is not None:
            calls.append(ToolCall(delta.id or call_id(), delta.name, delta.arguments))
        else:
            calls[delta.index].arguments += delta.arguments
    if mode == "auto" and (not reader.valid or not calls):
        return Answer(text, [])
    return Answer(content or None, calls)


def finish_reason(called: bool, reason: str | None) -> str | None:
    """``tool_calls`` for an answer that called tools and stopped by itself; ``length`` stays (the
    arguments may be cut short)."""
    return "tool_calls" if reason == "stop" and called else reason
