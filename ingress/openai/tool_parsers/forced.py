"""The readers of a ``tool_choice`` that forces the calls (a named function, ``required``): the engine's
guided decoding shaped the text (``tools.py`` says how), so it is read without a model's parser."""

from __future__ import annotations

from conveyor.ingress.openai.tool_parsers.base import (
    SPACE,
    CallDelta,
    CallObject,
    CallReader,
    ObjectCalls,
    Piece,
    call_id,
)


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


class CallArray(ObjectCalls):
    """``required``: guided decoding made the text ``[{"name": ..., "parameters": {...}}, ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self._over = False  # the array ended

    def feed(self, text: str) -> Piece:
        self._read_array(text)
        return Piece(calls=self._deltas())

    def _read_array(self, text: str) -> int:
        """Feed the array (its opening ``[`` may be behind); how much of ``text`` it took: up to and with
        its ``]``, or up to a character that cannot be in it, which ends it too and is left to the caller
        (the formats that frame an array read what follows it)."""
        at = 0
        while at < len(text) and not self._over:
            if self._calls and not (self._calls[-1].done or self._calls[-1].failed):
                at += self._read_object(text[at:])
                continue
            ch = text[at]
            if ch == "{":
                self._calls.append(self._new_call())
                continue
            if ch == "]" or (ch not in SPACE and ch not in "[,"):
                self._over = True
                return at + (ch == "]")
            at += 1
        return at

    def _new_call(self) -> CallObject:
        return CallObject()
