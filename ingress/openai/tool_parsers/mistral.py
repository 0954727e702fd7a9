"""vLLM's ``mistral`` tool-call parser: content, then ``[TOOL_CALLS]`` and either a JSON list of
``{"name", "arguments"}`` (tokenizers before v11) or ``name{args}`` / ``name[ARGS]{args}`` per call (v11
on). vLLM picks the form by the tokenizer's vocabulary; without a tokenizer this picks it by the text after
the marker (``[`` or ``{``: the JSON list), which is what each tokenizer's models write.

Its non-streamed reading is vLLM 0.32's own (``read_all``): which texts are calls, the content left, the
arguments as vLLM writes them. Streamed, the reader hands out deltas as ``base.py`` describes.
"""

from __future__ import annotations

import json
import random
import re
import string
from typing import Any

from conveyor.ingress.openai.tool_parsers.base import (
    Answer,
    CallDelta,
    CallObject,
    CallReader,
    JsonNesting,
    Piece,
    ToolCall,
    partial_tag,
    vllm_json,
)

MARK = "[TOOL_CALLS]"
ARGS_MARK = "[ARGS]"
_ALNUM = string.ascii_letters + string.digits
# vLLM's fallback when the text after the marker does not start with a JSON value.
_LEGACY_ARRAY = re.compile(r"\[{.*}\]", re.DOTALL)


def mistral_id() -> str:
    """vLLM's MistralToolCall id: 9 letters and digits (what Mistral's templates accept)."""
    return "".join(random.choices(_ALNUM, k=9))


def _legacy(after: str) -> bool:
    """The JSON-list form (tokenizers before v11), by the text after the marker."""
    return after.lstrip()[:1] in ("[", "{")


def _legacy_calls(parsed: Any) -> list[tuple[str, str]]:
    """vLLM's ``_pre_v11_function_calls``."""
    if isinstance(parsed, dict):
        parsed = [parsed]
    if not isinstance(parsed, list):
        return []
    out = []
    for call in parsed:
        if not isinstance(call, dict) or not ("name" in call or "arguments" in call):
            continue
        name, args = call.get("name"), call.get("arguments")
        args = "{}" if args is None else args if isinstance(args, str) else vllm_json(args)
        out.append((name if isinstance(name, str) else "", args))
    return out


def _first_json(raw: str) -> str:
    """vLLM's ``_extract_args_json``: the first JSON value of a v11 call's arguments, else the text."""
    stripped = raw.strip()
    if not stripped:
        return "{}"
    try:
        _, end = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError:
        return stripped
    return stripped[:end]


def mistral_whole(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """vLLM's non-streamed ``mistral`` reading: (content, calls)."""
    if MARK not in text:
        return text, []
    content, *segments = text.split(MARK)
    first = next((s.strip() for s in segments if s.strip()), "")
    if _legacy(first):
        try:
            parsed, _ = json.JSONDecoder().raw_decode(first)
        except json.JSONDecodeError:
            found = _LEGACY_ARRAY.findall(first)
            try:
                parsed = json.loads(found[0]) if found else None
            except json.JSONDecodeError:
                parsed = None
        calls = _legacy_calls(parsed)
        if not calls:
            return first, []  # vLLM's: the text after the marker, without what came before
        return (content if content.strip() else None), calls
    calls = []
    for segment in segments:
        if not segment.strip():
            continue
        cut = [i for i in (segment.find(ARGS_MARK), segment.find("{")) if i >= 0]
        at = min(cut) if cut else len(segment)
        args = segment[at + len(ARGS_MARK):] if segment.startswith(ARGS_MARK, at) else segment[at:]
        calls.append((segment[:at].strip(), _first_json(args)))
    return (content.strip() or None), calls


class MistralCalls(CallReader):
    """vLLM's ``mistral``: content, then ``[TOOL_CALLS]`` and the calls (either form). Streamed, the
    arguments are the model's own text of the value (a string value: the string, as vLLM); the whole
    answer is vLLM's reading (``read_all``: it re-writes the JSON list form's arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""  # text that may be the start of a marker
        self._mode = "content"  # content, sniff (after the marker), legacy, named, over
        self._name: list[str] = []  # a v11 call's name so far
        self._json: CallObject | None = None  # a v11 call's arguments, scanned as a JSON value
        self._nest = JsonNesting()  # where a v11 call's arguments stand
        self._strings: dict[int, list[str]] = {}  # legacy calls whose arguments are a JSON string
        self._raw: set[int] = set()  # legacy calls whose arguments are JSON text, streamed as it comes
        self._begun = False  # a v11 call's arguments have started
        self._array = False  # the JSON list form opened with "[" (else a bare object)
        self._bare = False

    def new_id(self) -> str:
        return mistral_id()

    def read_all(self, text: str) -> Answer:
        content, calls = mistral_whole(text)
        return Answer(content, [ToolCall(self.new_id(), name, args) for name, args in calls])

    def feed(self, text: str) -> Piece:
        text = self._pending + text
        self._pending = ""
        content: list[str] = []
        deltas: list[CallDelta] = []
        at = 0
        while at < len(text):
            if self._mode == "content":
                mark = text.find(MARK, at)
                if mark < 0:
                    keep = partial_tag(text, MARK, at)
                    content.append(text[at:len(text) - keep])
                    self._pending = text[len(text) - keep:]
                    break
                content.append(text[at:mark])
                at = mark + len(MARK)
                self._mode = "sniff"
            elif self._mode == "sniff":
                if text[at].isspace():
                    at += 1
                elif text[at] in "[{":
                    self._mode = "legacy"
                else:
                    self._mode = "named"
            elif self._mode == "legacy":
                at += self._legacy_feed(text[at:])
            elif self._mode == "named":
                at += self._named_feed(text[at:], deltas)
            else:  # over: text after the calls is dropped, as vLLM's whole reading drops it
                break
        if self._calls:  # the JSON list form (perhaps over in this piece)
            deltas = self._legacy_deltas()
        return Piece("".join(content), deltas)

    def end(self) -> Piece:
        deltas: list[CallDelta] = []
        if self._mode == "named" and self._json is None and "".join(self._name).strip():
            self._start_named(deltas)  # a name without arguments: vLLM's "{}"
            deltas[-1].arguments = "{}"
        if self._calls:
            deltas = self._legacy_deltas(final=True)
        tail = self._pending if self._mode == "content" else ""
        self._pending = ""
        return Piece(tail, deltas)

    # the JSON list form: objects read by base.py's scanner

    def _legacy_feed(self, text: str) -> int:
        if self._calls and not (self._calls[-1].done or self._calls[-1].failed):
            return self._calls[-1].feed(text)
        ch = text[0]
        if ch == "{":
            bare = not self._calls and not self._array
            self._calls.append(CallObject())
            self._bare = bare
            return 0
        if ch == "[" and not self._calls:
            self._array = True
        elif ch == "]" or self._bare or (not ch.isspace() and ch not in ","):
            self._mode = "over"
        return 1

    def _legacy_deltas(self, final: bool = False) -> list[CallDelta]:
        out = []
        for call in self._calls:
            if call.name is None:
                continue
            args = call.take_arguments()
            key = id(call)
            if key in self._strings or (args.startswith('"') and key not in self._raw):  # sent whole, decoded
                self._strings.setdefault(key, []).append(args)
                args = ""
                if call.done or final:
                    try:
                        args = str(json.loads("".join(self._strings.pop(key))))
                    except json.JSONDecodeError:
                        args = ""
            if args and key not in self._strings:
                self._raw.add(key)
            if (call.done or final) and not call.has_arguments and call.index is not None:
                args = "{}"
                call.has_arguments = True
            if call.index is None:
                call.index = len(self._ids)
                self._ids.append(self.new_id())
                if call.done and not call.has_arguments:
                    args, call.has_arguments = "{}", True
                out.append(CallDelta(call.index, args, self._ids[call.index], call.name))
            elif args:
                out.append(CallDelta(call.index, args))
        return out

    # the v11 form: name{args} or name[ARGS]{args}, a marker before each call

    def _start_named(self, deltas: list[CallDelta]) -> None:
        self._ids.append(self.new_id())
        deltas.append(CallDelta(len(self._ids) - 1, "", self._ids[-1], "".join(self._name).strip()))
        self._json = CallObject()  # only its presence matters: the arguments are scanned below
        self._nest, self._begun = JsonNesting(), False

    def _named_feed(self, text: str, deltas: list[CallDelta]) -> int:
        if self._json is None:  # reading the name
            for i, ch in enumerate(text):
                rest = text[i:]
                if rest.startswith(ARGS_MARK) or ch == "{":
                    self._start_named(deltas)
                    return i + (len(ARGS_MARK) if ch == "[" else 0)
                if ch == "[" and ARGS_MARK.startswith(rest):
                    self._pending = rest  # may be the start of [ARGS]
                    return len(text)
                self._name.append(ch)
            return len(text)
        if self._nest.depth == 0 and self._begun:  # between calls: only a marker matters
            mark = text.find(MARK)
            if mark < 0:
                keep = partial_tag(text, MARK, 0)
                self._pending = text[len(text) - keep:]
                return len(text)
            self._name, self._json, self._begun = [], None, False
            return mark + len(MARK)
        used = 0
        piece: list[str] = []
        for ch in text:
            used += 1
            if not self._begun and ch.isspace():
                continue  # vLLM strips the arguments
            self._begun = True
            piece.append(ch)
            nest = self._nest
            nest.step(ch)
            if nest.depth <= 0 and not nest.string:
                nest.depth = 0  # the value is whole (or was no object): what follows is dropped
                break
        args = "".join(piece)
        if args:
            index = len(self._ids) - 1
            if deltas and deltas[-1].index == index:
                deltas[-1].arguments += args
            else:
                deltas.append(CallDelta(index, args))
        return used
