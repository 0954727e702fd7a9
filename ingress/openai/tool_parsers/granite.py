"""vLLM's ``granite`` tool-call parser (IBM Granite 3.x): content, then ``<|tool_call|>`` (3.0) or
``<tool_call>`` (3.1) and the array; text after the calls is dropped. The marker not followed by ``[`` is
dropped and the rest is content. The arguments are the raw text of the ``"arguments"`` object; a call
without one has ``{}``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from conveyor.ingress.openai.tool_parsers.arrays import ArrayCalls, first_mark, hold_marks
from conveyor.ingress.openai.tool_parsers.base import SPACE, Answer, Piece, vllm_json

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
            value = raw[i + 1:].lstrip(SPACE)
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
            return parsed.get("name", ""), value if isinstance(value, str) else vllm_json(value)
    return parsed.get("name", ""), vllm_json({k: v for k, v in parsed.items() if k != "name"})


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
        if ch in SPACE or ch == ",":
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
        start, mark = first_mark(text, GRANITE_MARKS, at)
        (after if raws else before).append(text[at:] if start < 0 else text[at:start])
        if start < 0:
            break
        at = start + len(mark)
        while at < n and text[at] in SPACE:
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


class GraniteCalls(ArrayCalls):
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
                if text[at] in SPACE:
                    at += 1
                else:
                    self._mode = "array" if text[at] == "[" else "content"
                    at += text[at] == "["
            else:
                start, mark = first_mark(text, GRANITE_MARKS, at)
                end = start if start >= 0 else len(text) - hold_marks(text, GRANITE_MARKS, at)
                if not self._calls:
                    content.append(text[at:end])
                if start < 0:
                    self._pending = text[end:]
                    break
                at, self._mode = start + len(mark), "open"
        return Piece("".join(content), self._deltas())

    def _tail(self) -> str:
        return "" if self._calls else self._pending
