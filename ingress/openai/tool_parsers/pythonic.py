"""vLLM's ``pythonic`` tool-call parser (Llama 3.2, ToolACE ...): the whole text is
``[get_weather(city="Paris"), other(x=1)]``, values Python literals.

Its non-streamed reading is vLLM 0.32's own (``read_all``): which texts are calls, the content left, the
arguments as vLLM writes them: JSON written by Python's ``json.dumps``. Streamed, the arguments leave one
keyword at a time: ``{``, ``"city": "Paris"``, ``, "x": 1``, ``}`` join to exactly the whole answer's.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from conveyor.ingress.openai.tool_parsers.base import (
    Answer,
    CallDelta,
    CallReader,
    Piece,
    ToolCall,
    vllm_json,
    vllm_tool_id,
)

# vLLM's PythonicToolParser.TOOL_CALL_REGEX: a cheap shape check before ``ast`` (both must accept).
_PY_CALLS = re.compile(
    r"\[([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*([a-zA-Z]+\w*=.*\s)?\),\s*)*([a-zA-Z]+\w*\(([a-zA-Z]+\w*=.*,\s*)*"
    r"([a-zA-Z]+\w*=.*\s*)?\)\s*)+\]",
    re.DOTALL,
)
_JSON_NAMES = {"null": None, "true": True, "false": False}


class _NotLiteral(Exception):
    """A value vLLM's ``get_parameter_value`` refuses: the text is no call."""


def _py_value(node: ast.expr) -> Any:
    """vLLM's ``get_parameter_value``: a Python literal (JSON's null/true/false too) as a JSON value."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
        raise _NotLiteral
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise _NotLiteral
        return {k.value: _py_value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_py_value(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _py_value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise _NotLiteral


def _py_name(node: ast.expr) -> str:
    """A call's function: a name or a dotted chain (``a.b.c``), as vLLM's ``handle_single_tool``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise _NotLiteral
    parts.append(node.id)
    return ".".join(reversed(parts))


def pythonic_calls(text: str) -> list[tuple[str, str]] | None:
    """vLLM's non-streamed ``pythonic`` reading: the calls (name, arguments), or None when the text is
    content. ``ast`` first: the regex's nested ``.*`` only runs on a text that parsed as calls."""
    try:
        body = ast.parse(text).body
        parsed = getattr(body[0], "value", None) if body else None
        if not isinstance(parsed, ast.List) or not all(isinstance(e, ast.Call) for e in parsed.elts):
            return None
        calls = [(_py_name(e.func), vllm_json({kw.arg: _py_value(kw.value) for kw in e.keywords}))
                 for e in parsed.elts if isinstance(e, ast.Call)]
    except Exception:  # (vLLM's: any failure leaves the text as content)
        return None
    return calls if _PY_CALLS.match(text) else None


def _literal(text: str) -> tuple[bool, Any]:
    """``text`` read as one argument value: (False, None) while it is not a whole expression yet."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        return False, None
    return True, _py_value(node)


class PythonicCalls(CallReader):
    """vLLM's ``pythonic``: a text starting with ``[`` is a list of calls, any other text content.
    Streamed, a text that starts with ``[`` but turns out not to be calls before the first call's name is
    whole is content (vLLM's streaming drops it); text after the list is dropped, as vLLM's does."""

    def __init__(self) -> None:
        super().__init__()
        self._mode = ""  # "", "content", "calls", "over"
        self._all: list[str] = []  # the text so far: content while no call is sure
        self._state = "open"
        self._word: list[str] = []  # the call's name, or the keyword being read
        self._key = ""
        self._value: list[str] = []
        self._quote = ""  # the quote of the string the value is inside ("" outside)
        self._escape = False
        self._args = 0  # keywords written in the open call
        self._out: list[CallDelta] = []

    def new_id(self) -> str:
        return vllm_tool_id()

    def read_all(self, text: str) -> Answer:
        calls = pythonic_calls(text)
        if not calls:
            return Answer(text, [])
        return Answer(None, [ToolCall(self.new_id(), name, args) for name, args in calls])

    def feed(self, text: str) -> Piece:
        if self._mode == "":
            if not text:
                return Piece()
            self._mode = "calls" if text.startswith("[") else "content"
            text = text[1:] if self._mode == "calls" else text
            self._all.append("[")
        if self._mode == "content":
            return Piece(text)
        if self._mode == "over":
            return Piece()
        self._all.append(text)
        for ch in text:
            self._char(ch)
            if self._mode == "content":  # not calls after all: everything so far is content
                return Piece("".join(self._all))
            if self._mode == "over":
                break
        out, self._out = self._out, []
        return Piece(calls=out)

    def end(self) -> Piece:
        held = self._mode == "calls" and not self._ids
        return Piece("".join(self._all) if held else "")

    def _emit(self, arguments: str, name: str | None = None) -> None:
        index = len(self._ids) - 1
        if name is None and self._out and self._out[-1].index == index:
            self._out[-1].arguments += arguments
        else:
            self._out.append(CallDelta(index, arguments, self._ids[index] if name else None, name))

    def _fail(self) -> None:
        self._mode = "over" if self._ids else "content"

    def _char(self, ch: str) -> None:
        state = self._state
        if state == "value":
            self._value_char(ch)
        elif ch.isspace() and state != "name" and state != "kw":
            return
        elif state in ("open", "args") and (ch.isalpha() or ch == "_"):
            self._word = [ch]
            self._state = "name" if state == "open" else "kw"
        elif state in ("name", "kw") and (ch.isalnum() or ch == "_" or (ch == "." and state == "name")):
            self._word.append(ch)
        elif state in ("name", "kw") and ch.isspace():
            self._state += "_end"
        elif state in ("name", "name_end") and ch == "(":
            self._ids.append(self.new_id())
            self._emit("{", "".join(self._word))
            self._args = 0
            self._state = "args"
        elif state in ("kw", "kw_end") and ch == "=":
            self._key = "".join(self._word)
            self._value = []
            self._quote = ""
            self._state = "value"
        elif state == "args" and ch == ")":
            self._close_call()
        elif state == "after_call" and ch == ",":
            self._state = "open"
        elif state in ("open", "after_call") and ch == "]":
            self._mode = "over"
        else:
            self._fail()

    def _value_char(self, ch: str) -> None:
        if self._quote:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == self._quote:
                self._quote = ""
        elif ch in "'\"":
            self._quote = ch
        elif ch in ",)":
            try:
                whole, value = _literal("".join(self._value))
            except _NotLiteral:
                self._fail()
                return
            if whole:  # the value ends here: this comma or parenthesis is the call's
                sep = ", " if self._args else ""
                self._emit(f"{sep}{vllm_json(self._key)}: {vllm_json(value)}")
                self._args += 1
                if ch == ")":
                    self._close_call()
                else:
                    self._state = "args"
                return
        self._value.append(ch)

    def _close_call(self) -> None:
        self._emit("}")
        self._state = "after_call"
