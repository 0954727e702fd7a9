"""vLLM's ``xlam`` tool-call parser (Salesforce xLAM): the array as the whole text, or after
``</think>``, or in a ```` ```json ```` fence, after ``[TOOL_CALLS]`` (to the end of its line) or inside
``<tool_call>...</tool_call>``; the text around a fence or tag is the content. A call without
``arguments`` is left out.
"""

from __future__ import annotations

import json
import re
import uuid

from conveyor.ingress.openai.tool_parsers.arrays import ArrayCalls, first_mark, hold_marks
from conveyor.ingress.openai.tool_parsers.base import SPACE, Answer, Piece, ToolCall, partial_tag, vllm_json


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


FENCE, MARK, TAG, TAG_END, THINK_END = "```", "[TOOL_CALLS]", "<tool_call>", "</tool_call>", "</think>"
_XLAM_MARKS = (FENCE, MARK, TAG, THINK_END)
# vLLM's xLAMToolParser patterns, tried in this order.
_XLAM_BLOCKS = (re.compile(r"```(?:json)?\s*([\s\S]*?)```"), re.compile(r"\[TOOL_CALLS\]([\s\S]*?)(?=\n|$)"),
                re.compile(r"<tool_call>([\s\S]*?)</tool_call>"))
_XLAM_THINK = re.compile(r"</think>([\s\S]*)")
# What may come between a marker and its array: a fence's \s*; what json.loads skips, within the line for
# [TOOL_CALLS] (its pattern stops at the line's end).
_MARKSPACES = {FENCE: SPACE + "\f\v", MARK: " \t\r", TAG: SPACE}


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
        args = vllm_json(args) if isinstance(args, dict) else args
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


class XlamCalls(ArrayCalls):
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
                    self._pending = rest[len(rest) - partial_tag(rest, self._closer, 0):]
                    break
                at += end + (len(self._closer) if self._closer != "\n" else 0)  # a line's end stays
                self._mode = "plain"
                continue
            if self._mode == "code":  # a fence that holds no calls: content, to its closing fence
                end = rest.find(FENCE)
                stop = len(rest) - partial_tag(rest, FENCE, 0) if end < 0 else end + len(FENCE)
                content.append(rest[:stop])
                if end < 0:
                    self._pending = rest[stop:]
                    break
                at, self._mode = at + stop, "content"
                continue
            if self._mode == "content":
                start, mark = first_mark(text, _XLAM_MARKS, at)
                end = start if start >= 0 else len(text) - hold_marks(text, _XLAM_MARKS, at)
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
        taken = _opens(rest, head, _MARKSPACES[mark])
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
