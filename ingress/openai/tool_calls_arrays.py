"""vLLM's ``granite``, ``jamba`` and ``xlam`` tool-call parsers: a JSON array of ``{"name", "arguments"}``
objects behind a marker, on the text alone (``tool_calls.py`` has the interface and the array scanner).

Their non-streamed readings are vLLM 0.32's own (``read_all``): which texts are calls, the content left,
the arguments as vLLM writes them. Streamed, the arrays are read by ``tool_calls.CallArray``'s scanner and
the arguments are the model's own text (the same JSON; a string value: the string it holds, as vLLM).

* ``granite`` (IBM Granite 3.x): content, then ``<|tool_call|>`` (3.0) or ``<tool_call>`` (3.1) and the
  array; text after the calls is dropped. The marker not followed by ``[`` is dropped and the rest is
  content. The arguments are the raw text of the ``"arguments"`` object; a call without one has ``{}``.
* ``jamba`` (AI21 Jamba): content, then ``<tool_calls>[...]</tool_calls>``; the arguments re-written by
  ``json.dumps``. Anything wrong with the array (no closing tag, no JSON, a call without its name or
  arguments) makes the whole text content.
* ``xlam`` (Salesforce xLAM): the array as the whole text, or after ``</think>``, or in a ```` ```json ````
  fence, after ``[TOOL_CALLS]`` (to the end of its line) or inside ``<tool_call>...</tool_call>``; the
  text around a fence or tag is the content. A call without ``arguments`` is left out.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from conveyor.ingress.openai.tool_calls import (
    _SPACE,
    Answer,
    CallArray,
    CallObject,
    Piece,
    ToolCall,
    _partial_tag,
)


def vllm_tool_id() -> str:
    """vLLM's ``make_tool_call_id()``: ``chatcmpl-tool-`` and 16 hex digits."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # vLLM's writing of re-written arguments, byte for byte


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class _ArgumentsCall(CallObject):
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


class _ArrayCalls(CallArray):
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
        return _ArgumentsCall(self.DECODE_STRINGS, self.EMPTY)

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
            if isinstance(call, _ArgumentsCall):
                call.ended = True
        super().end()
        return Piece(tail, self._deltas())


def _first_mark(text: str, marks: tuple[str, ...], start: int) -> tuple[int, str]:
    """Where the first of ``marks`` begins in ``text[start:]``, and which (-1, "" when none does)."""
    found = [(at, mark) for mark in marks if (at := text.find(mark, start)) >= 0]
    return min(found) if found else (-1, "")


def _hold(text: str, marks: tuple[str, ...], start: int) -> int:
    """How many characters at the end of ``text[start:]`` may begin one of ``marks``."""
    return max(_partial_tag(text, mark, start) for mark in marks)


# ----------------------------------------------------------------------------------------------- granite

GRANITE_MARKS = ("<|tool_call|>", "<tool_call>")
_GRANITE_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')  # vLLM's ParserEngine._NAME_RE, on a call's raw text


def _object_end(text: str, start: int, brackets: bool) -> int | None:
    """The end of the ``{...}`` at ``start`` (None: not closed) as vLLM's two scanners find it: its engine's
    array splitter (``brackets``: ``[]`` nest too) and its ``scan_json_object_end`` (only braces nest)."""
    opens, closes = ("{[", "}]") if brackets else ("{", "}")
    depth, in_string, escape = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if escape:
            escape = False
        elif in_string:
            escape, in_string = ch == "\\", ch != '"'
        elif ch == '"':
            in_string = True
        elif ch in opens:
            depth += 1
        elif ch in closes:
            depth -= depth > 0
            if ch == "}" and depth == 0:
                return i + 1
    return None


def _member_object(raw: str, key: str) -> str | None:
    """vLLM's ``extract_json_member_object``: the raw text of the top-level ``key`` member's object (to the
    end of ``raw`` when unclosed); None when there is none; ValueError when its value is no object."""
    depth, in_string, escape, string_start = 0, False, False, -1
    last_string: str | None = None
    for i, ch in enumerate(raw):
        if escape:
            escape = False
        elif in_string:
            if ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if depth == 1:
                    last_string = raw[string_start + 1:i]
        elif ch == '"':
            in_string, string_start = True, i
        elif ch == ":" and depth == 1 and last_string == key:
            value = raw[i + 1:].lstrip(_SPACE)
            if not value:
                return None
            if value[0] != "{":
                raise ValueError(f"member {key!r} must be a JSON object")
            end = _object_end(value, 0, brackets=False)
            return value if end is None else value[:end]
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return None


def _name_and_args(raw: str) -> tuple[Any, str]:
    """vLLM's ``_extract_name_and_args``: a call's text read as JSON, when its raw reading failed."""
    raw = raw.strip()
    try:
        parsed = json.loads(raw)
    except ValueError:
        return "", raw
    if not isinstance(parsed, dict):
        return "", raw
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return parsed.get("name", ""), value if isinstance(value, str) else _dumps(value)
    return parsed.get("name", ""), _dumps({k: v for k, v in parsed.items() if k != "name"})


def _granite_call(raw: str) -> tuple[str, str] | None:
    """One array element as vLLM's granite engine reads it: the name by regex (else from the JSON), the
    arguments the raw ``"arguments"`` object (else ``{}``, or the JSON reading's)."""
    found = _GRANITE_NAME.search(raw)
    name: Any = found.group(1).strip() if found else ""
    if not name:
        name, args = _name_and_args(raw)
    else:
        try:
            member = _member_object(raw, "arguments")
            args = "{}" if member is None else member
        except ValueError:
            args = _name_and_args(raw)[1]
    return (name, args) if isinstance(name, str) and name else None


def _granite_array(text: str, at: int, raws: list[str]) -> tuple[int, bool]:
    """The array's elements from ``at`` (past its ``[``) into ``raws``, as vLLM's engine splits them:
    where its text ends, and whether its ``]`` closed it (else the text there is content)."""
    while at < len(text):
        ch = text[at]
        if ch in _SPACE or ch == ",":
            at += 1
        elif ch == "{":
            end = _object_end(text, at, brackets=True) or len(text)
            raws.append(text[at:end])
            at = end
        else:
            return at + (ch == "]"), ch == "]"
    return at, True


def granite_whole(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed ``granite`` reading (its ParserEngine, fed the whole text): (content, calls)."""
    before: list[str] = []  # content before the first array element
    after: list[str] = []  # content after it: dropped once a call has a name
    raws: list[str] = []
    at, n = 0, len(text)
    while at < n:
        start, mark = _first_mark(text, GRANITE_MARKS, at)
        (after if raws else before).append(text[at:] if start < 0 else text[at:start])
        if start < 0:
            break
        at = start + len(mark)
        while at < n and text[at] in _SPACE:
            at += 1
        closed = False  # else no array, or stray text ended it: the marker is dropped, the rest is content
        if at < n and text[at] == "[":
            at, closed = _granite_array(text, at + 1, raws)
        # vLLM's engine hands a marker met where the array gives up to it whole: content, not a new array
        stray = "" if closed else next((m for m in GRANITE_MARKS if text.startswith(m, at)), "")
        (after if raws else before).append(stray)
        at += len(stray)
    calls = [call for call in map(_granite_call, raws) if call is not None]
    named = any(found and found.group(1) for found in map(_GRANITE_NAME.search, raws))
    content = "".join(before) + ("" if named else "".join(after))
    if calls:
        content = content.strip()
    elif raws and not content.strip():
        content = ""
    return content or None, calls


class GraniteCalls(_ArrayCalls):
    """vLLM's ``granite``: content, then a marker and the array. Streamed, text after the first call is
    dropped (as vLLM's whole reading drops it); the marker not followed by ``[`` is dropped."""

    EMPTY = "{}"

    def read_all(self, text: str) -> Answer:
        return self._answer(*granite_whole(text))

    def feed(self, text: str) -> Piece:
        text = self._pending + text
        self._pending = ""
        content: list[str] = []
        at = 0
        while at < len(text):
            if self._mode == "array":
                at += self._read_array(text[at:])
                if self._over:  # its "]", or stray text: content again, where a marker opens another
                    self._mode, self._over = "content", False
            elif self._mode == "open":  # after a marker: spaces, then "[" or it was no call
                if text[at] in _SPACE:
                    at += 1
                else:
                    self._mode = "array" if text[at] == "[" else "content"
                    at += text[at] == "["
            else:
                start, mark = _first_mark(text, GRANITE_MARKS, at)
                end = start if start >= 0 else len(text) - _hold(text, GRANITE_MARKS, at)
                if not self._calls:
                    content.append(text[at:end])
                if start < 0:
                    self._pending = text[end:]
                    break
                at, self._mode = start + len(mark), "open"
        return Piece("".join(content), self._deltas())

    def _tail(self) -> str:
        return "" if self._calls else self._pending


# ------------------------------------------------------------------------------------------------- jamba

JAMBA_START, JAMBA_END = "<tool_calls>", "</tool_calls>"
_JAMBA_BLOCK = re.compile(rf"{JAMBA_START}(.*?){JAMBA_END}", re.DOTALL)


def jamba_whole(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed ``jamba`` reading: (content, calls)."""
    block = _JAMBA_BLOCK.search(text)
    if block is None:
        return text, []
    try:
        calls = [(call["name"], _dumps(call["arguments"])) for call in json.loads(block.group(1))]
    except (ValueError, TypeError, KeyError, IndexError):
        return text, []  # vLLM's: any failure leaves the whole text as content
    if not all(isinstance(name, str) for name, _ in calls):
        return text, []  # vLLM's FunctionCall refuses a name that is no string
    content = text[:text.find(JAMBA_START)]
    return (content if content not in ("", " ") else None), calls


class JambaCalls(_ArrayCalls):
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
            at = start if start >= 0 else len(text) - _partial_tag(text, JAMBA_START, 0)
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
                self._mode = "open" if text[at] in _SPACE else "array" if text[at] == "[" else "over"
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


# -------------------------------------------------------------------------------------------------- xlam

FENCE, MARK, TAG, TAG_END, THINK_END = "```", "[TOOL_CALLS]", "<tool_call>", "</tool_call>", "</think>"
_XLAM_MARKS = (FENCE, MARK, TAG, THINK_END)
# vLLM's xLAMToolParser patterns, tried in this order.
_XLAM_BLOCKS = (re.compile(r"```(?:json)?\s*([\s\S]*?)```"), re.compile(r"\[TOOL_CALLS\]([\s\S]*?)(?=\n|$)"),
                re.compile(r"<tool_call>([\s\S]*?)</tool_call>"))
_XLAM_THINK = re.compile(r"</think>([\s\S]*)")
# What may come between a marker and its array: a fence's \s*; what json.loads skips, within the line for
# [TOOL_CALLS] (its pattern stops at the line's end).
_MARK_SPACES = {FENCE: _SPACE + "\f\v", MARK: " \t\r", TAG: _SPACE}


def _xlam_split(text: str) -> tuple[str | None, str | None]:
    """vLLM's ``preprocess_model_output``: (content, the JSON text that may be the calls)."""
    think = _XLAM_THINK.search(text)
    if think:
        content = text[:think.start() + len(THINK_END)].strip()
        thought = think.group(1).strip()
        if _is_json(thought):
            return content, thought
        for pattern in _XLAM_BLOCKS:
            for found in pattern.findall(thought):
                if _is_json(found):
                    return content, found
    for pattern in _XLAM_BLOCKS:
        for found in pattern.findall(text):
            if _is_json(found):
                return pattern.sub("", text).strip(), found
    if text.strip().startswith("[") and (_is_json(text) or all(w in text for w in ("{", "name", "arguments"))):
        return None, text
    return text, None


def xlam_whole(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed ``xlam`` reading: (content, calls)."""
    content, found = _xlam_split(text)
    if not found:
        return content, []
    try:
        data = json.loads(found)
    except ValueError:
        return text, []
    if not isinstance(data, list):
        return content or text, []
    calls = []
    for call in data:
        if not isinstance(call, dict) or "name" not in call or "arguments" not in call:
            continue  # vLLM's: left out, the others kept
        name, args = call["name"], call["arguments"]
        args = _dumps(args) if isinstance(args, dict) else args
        if not isinstance(name, str) or not isinstance(args, str):
            return text, []  # vLLM's FunctionCall refuses it, and the whole text is content
        calls.append((name, args))
    return content, calls


def _opens(rest: str, head: int, spaces: str) -> int | None:
    """After ``rest[:head]`` (a marker), ``spaces`` and ``[``: how much of ``rest`` to take to be inside
    the array; -1: something else comes, no array; None: too little text yet to know."""
    body = rest[head:].lstrip(spaces)
    if not body:
        return None
    return len(rest) - len(body) + 1 if body[0] == "[" else -1


class XlamCalls(_ArrayCalls):
    """vLLM's ``xlam``. Streamed: the first array met (the whole text, or after ``</think>``, a fence,
    ``[TOOL_CALLS]`` or ``<tool_call>``) is the calls; the text around it is content, and what follows a
    bare array (or one after ``</think>``) is dropped. A fence that holds no array is content, and so is
    an array that ends before a call shows (``[1] is a citation``)."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = "start"
        self._closer = ""  # what ends the array's framing ("": the rest of the text is dropped)

    def new_id(self) -> str:
        return f"call_{len(self._ids)}_{uuid.uuid4().hex[:16]}"  # vLLM's f"call_{idx}_{random_uuid()}"

    def read_all(self, text: str) -> Answer:
        content, calls = xlam_whole(text)
        return Answer(content, [ToolCall(f"call_{i}_{uuid.uuid4().hex[:16]}", name, args)
                                for i, (name, args) in enumerate(calls)])

    def feed(self, text: str) -> Piece:
        text = self._pending + text
        self._pending = ""
        content: list[str] = []
        at = 0
        while at < len(text) and self._mode != "over":
            rest = text[at:]
            if self._mode == "plain":
                content.append(rest)
                break
            if self._mode == "array":
                at += self._in_array(rest, content)
                continue
            if self._mode == "start":  # the text's start, or what follows </think>: an array is calls
                body = rest.lstrip()
                if not body or (body[0] == "[" and len(body) < len(MARK) and MARK.startswith(body)):
                    self._pending = rest
                    break
                if body[0] == "[" and not body.startswith(MARK):
                    self._mode, self._closer = "array", ""
                    self._held = [rest[:len(rest) - len(body) + 1]]
                    at += len(self._held[0])
                else:
                    self._mode = "content"
                continue
            if self._mode == "close":  # after the array: dropped up to the framing's end
                end = rest.find(self._closer)
                if end < 0:
                    self._pending = rest[len(rest) - _partial_tag(rest, self._closer, 0):]
                    break
                at += end + (len(self._closer) if self._closer != "\n" else 0)  # a line's end stays
                self._mode = "plain"
                continue
            if self._mode == "code":  # a fence that holds no calls: content, to its closing fence
                end = rest.find(FENCE)
                stop = len(rest) - _partial_tag(rest, FENCE, 0) if end < 0 else end + len(FENCE)
                content.append(rest[:stop])
                if end < 0:
                    self._pending = rest[stop:]
                    break
                at, self._mode = at + stop, "content"
                continue
            if self._mode == "content":
                start, mark = _first_mark(text, _XLAM_MARKS, at)
                end = start if start >= 0 else len(text) - _hold(text, _XLAM_MARKS, at)
                content.append(text[at:end])
                if start < 0:
                    self._pending = text[end:]
                    break
                at = start
                if mark == THINK_END:
                    content.append(mark)
                    at += len(mark)
                    self._mode = "start"
                else:
                    self._mode = mark  # a marker: does an array follow?
                continue
            taken = self._open(rest, content)
            if taken is None:
                self._pending = rest
                break
            at += taken
        piece = Piece("".join(content), self._deltas())
        if self._ids:
            self._held = None
        return piece

    def _in_array(self, rest: str, content: list[str]) -> int:
        """Read the array; how much of ``rest`` it took. Ended before any call shows, it was content."""
        used = self._read_array(rest)
        if self._held is not None:
            self._held.append(rest[:used])
        if self._over and (self._ids or any(map(self._shows, self._calls))):
            self._mode = "close" if self._closer else "over"
        elif self._over:
            content.extend(self._held or ())
            self._held, self._over, self._mode = None, False, "content"
        return used

    def _open(self, rest: str, content: list[str]) -> int | None:
        """``rest`` starts with the marker ``self._mode``: into the array after it (how much was taken),
        or on as content; None when the text so far cannot tell."""
        mark = self._mode
        head = len(mark)
        if mark == FENCE:  # ```, perhaps "json", spaces
            lang = rest[head:]
            if "json".startswith(lang):
                return None
            head += 4 * lang.startswith("json")
        taken = _opens(rest, head, _MARK_SPACES[mark])
        if taken is None:
            return None
        if taken >= 0:
            self._mode, self._closer = "array", {FENCE: FENCE, MARK: "\n", TAG: TAG_END}[mark]
            self._held = [rest[:taken]]
            return taken
        content.append(mark)
        self._mode = "code" if mark == FENCE else "content"
        return len(mark)

    def _tail(self) -> str:
        if self._held is not None:
            return "".join(self._held)
        return "" if self._mode in ("close", "over", "array") else self._pending


PARSERS = {"granite": GraniteCalls, "jamba": JambaCalls, "xlam": XlamCalls}
