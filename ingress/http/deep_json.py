"""A JSON object read one level deep, for bodies nested past orjson's depth limit.

Triton's parser takes any depth and lets the handler refuse a member of the
wrong type (``{"ready": [[[...]]]}``: "Invalid value for 'ready': expected a
boolean"). orjson stops at 1024 levels, so a control route whose body fails on
depth reads it again here: each top-level member whose value is an array or
object nested too deep becomes a ``Deep`` marker, the others are parsed as usual.
No recursion: the scan only counts brackets outside strings.
"""

from __future__ import annotations

from typing import Any

import orjson


class Deep:
    """A member's value: an array or object too deeply nested to parse."""


def is_depth_error(exc: orjson.JSONDecodeError) -> bool:
    return "depth" in str(exc) or "recursion" in str(exc)


def shallow_object(raw: bytes) -> dict[str, Any]:
    """``raw`` as a JSON object, its deep members as ``Deep``; JSONDecodeError when
    it is not a well-formed object."""
    n = len(raw)
    pos = _skip_space(raw, 0)
    if pos >= n or raw[pos] != ord("{"):
        raise orjson.JSONDecodeError("expected a JSON object", raw.decode(errors="replace"), pos)
    doc: dict[str, Any] = {}
    pos = _skip_space(raw, pos + 1)
    if pos < n and raw[pos] == ord("}"):
        return doc if _skip_space(raw, pos + 1) == n else _bad(raw, pos + 1)
    while True:
        key_end = _value_end(raw, pos)
        key = orjson.loads(raw[pos:key_end])
        if not isinstance(key, str):
            _bad(raw, pos)
        pos = _skip_space(raw, key_end)
        if pos >= n or raw[pos] != ord(":"):
            _bad(raw, pos)
        start = _skip_space(raw, pos + 1)
        end = _value_end(raw, start)
        try:
            doc[key] = orjson.loads(raw[start:end])
        except orjson.JSONDecodeError as exc:
            if not is_depth_error(exc):
                raise
            doc[key] = Deep()
        pos = _skip_space(raw, end)
        if pos < n and raw[pos] == ord(","):
            pos = _skip_space(raw, pos + 1)
            continue
        if pos < n and raw[pos] == ord("}") and _skip_space(raw, pos + 1) == n:
            return doc
        _bad(raw, pos)


def _skip_space(raw: bytes, pos: int) -> int:
    n = len(raw)
    while pos < n and raw[pos] in b" \t\r\n":
        pos += 1
    return pos


def _value_end(raw: bytes, pos: int) -> int:
    """Where the value starting at ``pos`` ends (brackets balanced outside strings)."""
    n = len(raw)
    depth = 0
    in_string = False
    i = pos
    while i < n:
        c = raw[i]
        if in_string:
            if c == 0x5C:  # backslash: skip the escaped character
                i += 1
            elif c == 0x22:
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == 0x22:
            in_string = True
        elif c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return i
        elif depth == 0 and c in b", \t\r\n":
            return i
        i += 1
    if in_string or depth:
        _bad(raw, n)
    return n


def _bad(raw: bytes, pos: int) -> Any:
    raise orjson.JSONDecodeError("malformed JSON", raw[:200].decode(errors="replace"), pos)
