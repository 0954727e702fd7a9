"""Reading ``config.pbtxt`` into Triton's ModelConfig message, and rendering it back.

The JSON form is the one Triton's ``/config`` returns: proto field names, every
field present, and int64 fields as JSON numbers (protobuf's own JSON mapping
would quote them; tritonclient users index into these dicts).
"""

from __future__ import annotations

import json
import re
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from conveyor.proto import model_config_pb2 as mc

ModelConfig = mc.ModelConfig

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def parse_text(text: str) -> mc.ModelConfig:
    """Parse protobuf text format; raises ``text_format.ParseError`` (with a line number
    where protobuf gives one) for any text that is not a ModelConfig."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError:
        raise
    except (ValueError, RuntimeError) as exc:
        # text_format raises these for some values, e.g. an enum number out of range
        # ("data_type: 2147483648"): the caller's "bad config" path must see them too.
        raise text_format.ParseError(str(exc)) from None
    return config


def _unsigned_fields(descriptor: Any, seen: set[str] | None = None) -> set[str]:
    """The names of the unsigned integer fields of ``descriptor`` and the messages in it."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    if descriptor.full_name in seen:
        return names
    seen.add(descriptor.full_name)
    for f in descriptor.fields:
        if f.type in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED32,
                      FieldDescriptor.TYPE_FIXED64):
            names.add(f.name)
        elif f.message_type is not None:
            names |= _unsigned_fields(f.message_type, seen)
    return names


_UNSIGNED = _unsigned_fields(mc.ModelConfig.DESCRIPTOR)
# Python protobuf's words for an integer it cannot take, after the line it quotes ('  name: value').
_PY_INTEGER_ERROR = re.compile(r"'\s*(\w+)\s*:.*': (Couldn't parse (?:unsigned )?integer|Value out of range): (\S+)$")


def cpp_parse_error(exc: text_format.ParseError) -> str:
    """``exc`` in C++ protobuf's words (Triton's text-format parser), ``LINE:COL: words``, for the integer a field
    cannot take (qa/L0_simple_ensemble greps them); other errors keep Python protobuf's words."""
    message = str(exc)
    line, column = exc.GetLine(), exc.GetColumn()
    found = _PY_INTEGER_ERROR.search(message)
    if line is None or column is None or found is None:
        return re.sub(r"^(\d+):(\d+) : ", r"\1:\2: ", message)
    field, kind, token = found.groups()
    if kind != "Value out of range":
        words = f"Expected integer, got: {token}"  # not an integer token at all
    elif token.startswith("-") and field in _UNSIGNED:
        words = "Expected integer, got: -"  # C++ reads '-' as a symbol where only an unsigned integer may be
    elif token.startswith("-"):
        column += 1  # C++ reports the number after the '-'
        words = f"Integer out of range ({token[1:]})"
    else:
        words = f"Integer out of range ({token})"
    return f"{line}:{column}: {words}"


def to_json(config: mc.ModelConfig) -> dict[str, Any]:
    d = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _unquote_int64(config.DESCRIPTOR, d)
    return d


def from_json(d: dict[str, Any]) -> mc.ModelConfig:
    return json_format.ParseDict(d, mc.ModelConfig(), ignore_unknown_fields=True)


def _unquote_int64(desc: Any, d: dict[str, Any]) -> None:
    # desc: a protobuf Descriptor (typed Any: its stubs differ between protobuf releases)
    for field in desc.fields:
        value = d.get(field.name)
        if value is None:
            continue
        if field.type in _INT64:
            if isinstance(value, list):
                d[field.name] = [int(v) for v in value]
            else:
                d[field.name] = int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                vfield = sub.fields_by_name["value"]
                if vfield.type == FieldDescriptor.TYPE_MESSAGE:
                    for v in value.values():
                        _unquote_int64(vfield.message_type, v)
                elif vfield.type in _INT64:
                    for k in value:
                        value[k] = int(value[k])
            elif isinstance(value, list):
                for v in value:
                    _unquote_int64(sub, v)
            else:
                _unquote_int64(sub, value)


def parse_json_config(text: str) -> mc.ModelConfig:
    """A load request's ``config`` parameter, read as Triton's JsonToModelConfig reads it (protobuf's C++
    JSON parser): a single value where a repeated field wants a list is one element, enum names in any
    case; an unknown field or a wrong value is ``json_format.ParseError``."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        try:
            doc = json.loads(_quote_bare_keys(text))  # only for what strict JSON refused: nothing more on the rest
        except ValueError:
            raise json_format.ParseError(f"Failed to load JSON: {exc}") from None
    if isinstance(doc, dict):
        _lenient(mc.ModelConfig.DESCRIPTOR, doc)
    return json_format.ParseDict(doc, mc.ModelConfig())


def _quote_bare_keys(text: str) -> str:
    """``text`` with each unquoted object key (an identifier before ``:``) quoted, as protobuf's C++ JSON parser
    reads such a key (qa/L0_iterative_sequence loads ``direct: {...}``); strings are left as they are."""
    out: list[str] = []
    i, n = 0, len(text)
    expect_key = False  # after '{' or ',' (outside strings): a key may start here
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i, expect_key = j + 1, False
            continue
        if expect_key and (c.isalpha() or c == "_"):
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            k = j
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i, expect_key = j, False
                continue
        if not c.isspace():
            expect_key = c in "{,"
        out.append(c)
        i += 1
    return "".join(out)


def _lenient(desc: Any, doc: dict[str, Any]) -> None:
    fields = {**{f.json_name: f for f in desc.fields}, **{f.name: f for f in desc.fields}}
    for key, value in doc.items():
        field = fields.get(key)
        if field is None:
            continue  # ParseDict names it
        is_map = field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
        if is_map:
            entry = field.message_type.fields_by_name["value"]
            if entry.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
                for item in value.values():
                    if isinstance(item, dict):
                        _lenient(entry.message_type, item)
            continue
        if field.is_repeated and not isinstance(value, list):
            value = doc[key] = [value]
        for item in value if isinstance(value, list) else [value]:
            if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(item, dict):
                _lenient(field.message_type, item)
        if field.type == FieldDescriptor.TYPE_ENUM:
            if isinstance(value, list):
                doc[key] = [v.upper() if isinstance(v, str) else v for v in value]
            elif isinstance(value, str):
                doc[key] = value.upper()
