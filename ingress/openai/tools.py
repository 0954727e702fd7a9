"""Tool calling on ``/v1/chat/completions``: which tools a request offers, how its answer must call
them, and the model's text read back as tool calls, whole or one step at a time.

``tool_choice`` decides what shapes the answer:

* a named function, and ``required``: the engine's guided decoding forces the shape, as vLLM's server
  does it (``get_json_schema_from_tools``): the named function's parameter schema (the text *is* the
  arguments), or an array of ``{"name", "parameters"}`` objects, one ``anyOf`` branch per tool. Any
  model, whatever its template or tool-call format, answers with calls whose arguments fit the schema.
* ``auto`` (the default when tools are given): the model writes what it likes, and its tool-call parser
  (the model's ``TOOL_CALL_PARSER`` parameter) finds the calls in the text. Without a parser this is
  refused, as vLLM refuses it without ``--tool-call-parser``.
* ``none``: the tools reach the template, the text is the answer's content.

The parsers are written here, after vLLM's of the same names (``hermes``, ``llama3_json``), on the text
alone: the ingress loads no tokenizer and sees no token ids, and vLLM's parser classes need both (and
importing vLLM would cost every ingress process seconds and hundreds of MiB).

Streaming: every reader below takes the text a piece at a time and hands out deltas: a call's first
delta carries its index, id, type and name (once the name is whole); the later ones carry pieces of its
arguments. The arguments are the model's own text of the value, so the pieces joined are exactly the
arguments a non-streamed answer carries, wherever the token boundaries fell. A non-streamed answer is
read by the same code, in one piece.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from conveyor.ingress.openai.schema import ChatRequest, NamedToolChoice, ToolDefinition
from conveyor.proto.errors import internal, invalid_arg

# The model config parameter naming the model's tool-call parser (``auto`` needs one).
PARSER_PARAMETER = "TOOL_CALL_PARSER"
# OpenAI's rule for a function's name.
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a request's tools mean for its prompt, its sampling and the reading of its answer."""

    mode: Mode
    template_tools: list[dict[str, Any]]  # the ``tools`` the chat template gets, in OpenAI's shape
    constraint: dict[str, Any] | None  # guided decoding (vLLM's ``structured_outputs``) that forces the calls
    named: str = ""  # the function a named tool_choice calls
    parser: str = ""  # ``auto``: the model's parser

    def apply(self, params: dict[str, Any]) -> None:
        """Into the request's sampling parameters: the constraint, and what the parser needs of the text."""
        if self.constraint is not None:
            if "structured_outputs" in params:
                raise invalid_arg("`tool_choice` 'required' or a named function is enforced by guided decoding: "
                                  "it cannot be combined with `response_format` or `structured_outputs`")
            params["structured_outputs"] = {"json": self.constraint}
        elif self.mode == "auto" and self.parser == "hermes":
            # As vLLM: <tool_call> is a special token in Hermes models' vocabularies; skipped, no call is seen.
            params["skip_special_tokens"] = False

    def reader(self) -> CallReader | None:
        """A reader of one choice's text, or None when the text is plain content."""
        if self.mode == "named":
            return NamedCall(self.named)
        if self.mode == "required":
            return CallArray()
        if self.mode == "auto":
            return PARSERS[self.parser]()
        return None


def plan(req: ChatRequest, parser: str) -> ToolPlan | None:
    """The request's tools checked (400s) and what they ask for; None without tools. ``parser``: the
    model's ``TOOL_CALL_PARSER`` ("" when it has none)."""
    choice = req.tool_choice
    if not req.tools:
        if choice is None or choice == "none":
            return None
        raise invalid_arg("`tool_choice` needs `tools`")
    tools = {_checked(i, tool): tool for i, tool in enumerate(req.tools)}
    if len(tools) < len(req.tools):
        raise invalid_arg("`tools` names a function twice")
    template_tools = [_wire(tool) for tool in req.tools]
    if isinstance(choice, NamedToolChoice):
        if choice.type != "function":
            raise invalid_arg(f"`tool_choice` of type '{choice.type}' is not supported: expected 'function'")
        tool = tools.get(choice.function.name)
        if tool is None:
            raise invalid_arg(f"`tool_choice` names the function '{choice.function.name}', which is not in "
                              f"`tools` ({', '.join(tools)})")
        return ToolPlan("named", template_tools, _parameters(tool), named=choice.function.name)
    mode = choice or "auto"
    if mode == "none":
        return ToolPlan("none", template_tools, None)
    if mode == "required":
        return ToolPlan("required", template_tools, _array_schema(req.tools, req.parallel_tool_calls))
    if mode != "auto":
        raise invalid_arg(f"`tool_choice` '{mode}' is not one of 'none', 'auto', 'required' or a named function")
    if not parser:
        raise invalid_arg(f"\"auto\" tool choice needs the model's tool-call parser: set the '{PARSER_PARAMETER}' "
                          "parameter in its config.pbtxt (as vLLM needs --enable-auto-tool-choice and "
                          "--tool-call-parser); 'required' or a named function needs none")
    if parser not in PARSERS:
        raise internal(f"the model's {PARSER_PARAMETER} '{parser}' is not a tool-call parser this server has "
                       f"({', '.join(sorted(PARSERS))})")
    return ToolPlan("auto", template_tools, None, parser=parser)


def _checked(i: int, tool: ToolDefinition) -> str:
    if tool.type != "function":
        raise invalid_arg(f"tools[{i}]: only tools of type 'function' are supported, got '{tool.type}'")
    name = tool.function.name
    if not _NAME.match(name):
        raise invalid_arg(f"tools[{i}]: the function name '{name}' must be 1 to 64 letters, digits, "
                          "underscores or dashes")
    params = tool.function.parameters
    if params is not None and params.get("type", "object") != "object":
        raise invalid_arg(f"tools[{i}]: the parameters of '{name}' must be a JSON schema of an object")
    return name


def _wire(tool: ToolDefinition) -> dict[str, Any]:
    fn = tool.function
    doc: dict[str, Any] = {"name": fn.name}
    if fn.description is not None:
        doc["description"] = fn.description
    if fn.parameters is not None:
        doc["parameters"] = fn.parameters
    return {"type": "function", "function": doc}


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    # As vLLM: no parameters still constrains the arguments to a JSON object.
    return tool.function.parameters or _EMPTY_OBJECT


def _array_schema(tools: list[ToolDefinition], parallel: bool | None) -> dict[str, Any]:
    """vLLM's schema for ``required``: one or more ``{"name", "parameters"}`` objects, one branch per tool;
    at most one with ``parallel_tool_calls`` false. The tools' ``$defs`` are lifted to the top, where the
    branches' references find them."""
    defs: dict[str, Any] = {}
    branches = []
    for tool in tools:
        params = dict(_parameters(tool))
        for name, sub in (params.pop("$defs", None) or {}).items():
            if defs.setdefault(name, sub) != sub:
                raise invalid_arg(f"`$defs` '{name}' has different schemas in different tools")
        branches.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                        "parameters": params},
                         "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": branches}}
    if parallel is False:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


# ---------------------------------------------------------------------------------------------- reading


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


_ARGUMENT_KEYS = ("arguments", "parameters")
_SPACE = " \t\r\n"


class CallObject:
    """One JSON object ``{"name": ..., "arguments": ...}`` (or ``"parameters"``) read a piece at a time:
    its name once whole, and the raw text of its arguments value as it arrives. A small JSON scanner
    (strings, escapes, nesting) rather than a parser: the arguments leave before the object is whole."""

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
        self._depth = 0  # nesting inside the value being read
        self._string = False  # inside a string (of the value, or the key)
        self._escape = False
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
        if ch in _SPACE:
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
        key = _unquote("".join(self._key))
        self._kind = "name" if key == "name" else "args" if key in _ARGUMENT_KEYS else ""
        if self._kind == "args":
            self.has_arguments = True
        self._value.clear()
        self._depth = 0
        self._string = self._escape = False
        self._scalar = ch not in '"{['
        self._state = "in_value"
        if not self._value_char(ch):  # no value at all (``"a": ,``): the delimiter is the object's
            self._char(ch)

    def _value_char(self, ch: str) -> bool:
        """A character of the value being read (False: it ends a scalar and is not the value's); at the
        value's end the state moves on (``after``)."""
        if self._scalar and (ch in _SPACE or ch in ",}"):
            self._end_value()
            return False
        self._raw.append(ch)
        if self._kind == "args":
            self._args.append(ch)
        elif self._kind == "name":
            self._value.append(ch)
        if self._scalar:
            return True
        if self._string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._string = False
                if self._depth == 0:
                    self._end_value()
        elif ch == '"':
            self._string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self._end_value()
        return True

    def _end_value(self) -> None:
        if self._kind == "name":
            raw = "".join(self._value)
            self.name = (_unquote(raw) or None) if raw.startswith('"') else None
        self._state = "after"


def _unquote(raw: str) -> str:
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

    def _deltas(self) -> list[CallDelta]:
        """What the calls read since the last time give: a first delta once a name is whole, then
        argument pieces (held while the name is not whole: it comes first)."""
        out = []
        for call in self._calls:
            if call.name is None:
                continue  # a call without a name never shows
            args = call.take_arguments()
            if call.index is None:
                call.index = len(self._ids)
                self._ids.append(call_id())
                out.append(CallDelta(call.index, args, self._ids[call.index], call.name))
            elif args:
                out.append(CallDelta(call.index, args))
        return out


class NamedCall(CallReader):
    """A named ``tool_choice``: guided decoding made the whole text the function's arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    def feed(self, text: str) -> Piece:
        if not self._ids:
            self._ids.append(call_id())
            return Piece(calls=[CallDelta(0, text, self._ids[0], self._name)])
        return Piece(calls=[CallDelta(0, text)] if text else [])

    def end(self) -> Piece:
        return self.feed("") if not self._ids else Piece()


class _Objects(CallReader):
    """Calls written as JSON objects with something around and between them (each framing says what)."""

    def _read_object(self, text: str) -> int:
        """Feed the open call; how much of ``text`` it took."""
        call = self._calls[-1]
        used = call.feed(text)
        if call.failed:
            self.valid = False
        return used


class CallArray(_Objects):
    """``required``: guided decoding made the text ``[{"name": ..., "parameters": {...}}, ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self._over = False  # the array closed

    def feed(self, text: str) -> Piece:
        at = 0
        while at < len(text) and not self._over:
            if self._calls and not (self._calls[-1].done or self._calls[-1].failed):
                at += self._read_object(text[at:])
                continue
            ch = text[at]
            if ch == "{":
                self._calls.append(CallObject())
                continue
            if ch == "]" or (ch not in _SPACE and ch not in "[,"):
                self._over = True
            at += 1
        return Piece(calls=self._deltas())


class HermesCalls(_Objects):
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
                keep = _partial_tag(text, self.START, at)
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


class Llama3JsonCalls(_Objects):
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


def _partial_tag(text: str, tag: str, start: int) -> int:
    """How many characters at the end of ``text[start:]`` may begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[len(text) - n:]):
            return n
    return 0


PARSERS: dict[str, Callable[[], CallReader]] = {
    "hermes": HermesCalls,
    "llama3_json": Llama3JsonCalls,
    "llama4_json": Llama3JsonCalls,  # vLLM's name for the same parser on Llama 4
}


# ---------------------------------------------------------------------------------------------- answers


@dataclass(slots=True)
class Answer:
    """A whole choice read: its content and calls."""

    content: str | None
    calls: list[ToolCall]


def read_whole(reader: CallReader, text: str, mode: Mode) -> Answer:
    """A non-streamed choice: the streamed deltas, joined. ``auto``: as vLLM's parsers, a call that is
    not valid JSON with a name and arguments makes the whole text the content, with no calls."""
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
