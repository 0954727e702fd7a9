"""FastAPI's answer to a request body outside its schema: 422 ``{"detail": [...]}``, one entry per error as
pydantic v2 validates the body in its lax mode and words each (``type``, ``loc`` from ``"body"``, ``msg``,
``input``, ``ctx`` where pydantic gives one).

A schema is written here in a few node types (``Str``, ``Int``, ``Float``, ``Bool``, ``Enum``, ``Literal``,
``List``, ``Dict``, ``Union``, ``Model``, ...) that validate as pydantic's do, so that Triton's frontend's
request models (``triton_schema.py``) read as its ``schemas/openai.py`` does; ``struct_node`` writes one for
a msgspec Struct (Conveyor's own fields). None of this runs on a request that decodes: only a body msgspec
refused is validated again here, to say what is wrong with it in pydantic's words.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import msgspec.inspect as mi

Loc = tuple[str | int, ...]
Errors = list[dict[str, Any]]

INT64 = 2**63  # pydantic's int from a float that is integral: within i64, else ``int_parsing_size``
# pydantic's lax booleans from strings (case-insensitive)
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def _entry(kind: str, loc: Loc, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "loc": list(loc), "msg": msg, "input": value}
    if ctx is not None:
        out["ctx"] = ctx
    return out


def _shown(bound: float) -> str:
    """A bound as pydantic-core writes it in a message: 2.0 as ``2``, 0.5 as ``0.5``."""
    return str(int(bound)) if isinstance(bound, float) and bound.is_integer() else str(bound)


def _expected(values: Sequence[Any]) -> str:
    """pydantic's ``'a', 'b' or 'c'``."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _plural(n: int) -> str:
    return "" if n == 1 else "s"


class Node:
    """One type of a schema: ``check`` appends the errors of ``value`` at ``loc`` and says whether it passed."""

    tag = "any"  # pydantic's name of the type in a union's error locations

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        return True


@dataclass(frozen=True)
class AnyValue(Node):
    pass


@dataclass(frozen=True)
class Bounded(Node):
    ge: float | None = None
    le: float | None = None

    def bounds(self, number: float, value: Any, loc: Loc, out: Errors) -> bool:
        if self.ge is not None and number < self.ge:
            out.append(_entry("greater_than_equal", loc, f"Input should be greater than or equal to {_shown(self.ge)}",
                              value, {"ge": self.ge}))
            return False
        if self.le is not None and number > self.le:
            out.append(_entry("less_than_equal", loc, f"Input should be less than or equal to {_shown(self.le)}",
                              value, {"le": self.le}))
            return False
        return True


@dataclass(frozen=True)
class Int(Bounded):
    tag = "int"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        number = self._number(value, loc, out)
        return number is not None and self.bounds(number, value, loc, out)

    @staticmethod
    def _number(value: Any, loc: Loc, out: Errors) -> int | None:
        if isinstance(value, int):  # bool too: lax mode takes it as 0 or 1
            return int(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                out.append(_entry("finite_number", loc, "Input should be a finite number", value))
            elif not value.is_integer():
                out.append(_entry("int_from_float", loc,
                                  "Input should be a valid integer, got a number with a fractional part", value))
            elif abs(value) >= INT64:
                out.append(_entry("int_parsing_size", loc,
                                  "Unable to parse input string as an integer, exceeded maximum size", value))
            else:
                return int(value)
            return None
        if isinstance(value, str):
            text = value.strip()
            try:
                return int(text)
            except ValueError:
                pass
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if number.is_integer():
                return int(number)
            out.append(_entry("int_parsing", loc, "Input should be a valid integer, unable to parse string as an "
                              "integer", value))
            return None
        out.append(_entry("int_type", loc, "Input should be a valid integer", value))
        return None


@dataclass(frozen=True)
class Float(Bounded):
    tag = "float"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if isinstance(value, (int, float)):
            return self.bounds(float(value), value, loc, out)
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                out.append(_entry("float_parsing", loc, "Input should be a valid number, unable to parse string as a "
                                  "number", value))
                return False
            return self.bounds(number, value, loc, out)
        out.append(_entry("float_type", loc, "Input should be a valid number", value))
        return False


@dataclass(frozen=True)
class Bool(Node):
    tag = "bool"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if isinstance(value, bool):
            return True
        if isinstance(value, (int, float)):
            if value in (0, 1):
                return True
        elif isinstance(value, str):
            if value.strip().lower() in _TRUE | _FALSE:
                return True
        else:
            out.append(_entry("bool_type", loc, "Input should be a valid boolean", value))
            return False
        out.append(_entry("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value))
        return False


@dataclass(frozen=True)
class Str(Node):
    tag = "str"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if isinstance(value, str):
            return True
        out.append(_entry("string_type", loc, "Input should be a valid string", value))
        return False


@dataclass(frozen=True)
class Url(Node):
    """pydantic's ``AnyUrl``, as far as a URL without a scheme goes."""

    tag = "url"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if not isinstance(value, str):
            out.append(_entry("url_type", loc, "URL input should be a string or URL", value))
            return False
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value):
            return True
        error = "input is empty" if not value else "relative URL without a base"
        out.append(_entry("url_parsing", loc, f"Input should be a valid URL, {error}", value, {"error": error}))
        return False


@dataclass(frozen=True)
class Choice(Node):
    """A ``Literal[...]`` (``enum`` empty) or an ``Enum`` class named ``enum``."""

    values: tuple[Any, ...]
    enum: str = ""

    @property
    def tag(self) -> str:  # type: ignore[override]
        return f"enum[{self.enum}]" if self.enum else f"literal[{','.join(repr(v) for v in self.values)}]"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if any(value == v and type(value) is type(v) for v in self.values):
            return True
        expected = _expected(self.values)
        out.append(_entry("enum" if self.enum else "literal_error", loc, f"Input should be {expected}", value,
                          {"expected": expected}))
        return False


@dataclass(frozen=True)
class Named(Node):
    """A ``RootModel``: its inner type, under the class's name in a union."""

    name: str
    inner: Node

    @property
    def tag(self) -> str:  # type: ignore[override]
        return self.name

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        return self.inner.check(value, loc, out)


@dataclass(frozen=True)
class List(Node):
    item: Node = field(default_factory=AnyValue)
    min_length: int | None = None
    max_length: int | None = None

    @property
    def tag(self) -> str:  # type: ignore[override]
        return f"list[{self.item.tag}]"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if not isinstance(value, list):
            out.append(_entry("list_type", loc, "Input should be a valid list", value))
            return False
        good = all([self.item.check(v, (*loc, i), out) for i, v in enumerate(value)])
        return good and _length(self.min_length, self.max_length, "List", value, loc, out)


def _length(low: int | None, high: int | None, what: str, value: Any, loc: Loc, out: Errors) -> bool:
    n = len(value)
    if low is not None and n < low:
        out.append(_entry("too_short", loc, f"{what} should have at least {low} item{_plural(low)} after validation, "
                          f"not {n}", value, {"field_type": what, "min_length": low, "actual_length": n}))
        return False
    if high is not None and n > high:
        out.append(_entry("too_long", loc, f"{what} should have at most {high} item{_plural(high)} after validation, "
                          f"not {n}", value, {"field_type": what, "max_length": high, "actual_length": n}))
        return False
    return True


@dataclass(frozen=True)
class Dict(Node):
    value: Node = field(default_factory=AnyValue)

    @property
    def tag(self) -> str:  # type: ignore[override]
        return f"dict[str,{self.value.tag}]"

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if not isinstance(value, dict):
            out.append(_entry("dict_type", loc, "Input should be a valid dictionary", value))
            return False
        return all([self.value.check(v, (*loc, k), out) for k, v in value.items()])


@dataclass(frozen=True)
class Optional(Node):
    """``Optional[X]``: null, or X (its errors carry no tag of their own)."""

    inner: Node

    @property
    def tag(self) -> str:  # type: ignore[override]
        return self.inner.tag

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        return value is None or self.inner.check(value, loc, out)


@dataclass(frozen=True)
class Union(Node):
    """pydantic's smart union: valid when one member is; else every member's errors, each under its tag."""

    members: tuple[Node, ...]

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        found: Errors = []
        for member in self.members:
            mine: Errors = []
            if member.check(value, (*loc, member.tag), mine):
                return True
            found += mine
        out += found
        return False


@dataclass(frozen=True)
class MinLength(Node):
    """``Field(min_length=...)`` on a union: pydantic checks the length of what the union took (``Value``)."""

    inner: Node
    min_length: int

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        return self.inner.check(value, loc, out) and _length(self.min_length, None, "Value", value, loc, out)


@dataclass(frozen=True)
class Model(Node):
    """A ``BaseModel``: its fields in order (name, type, required), then what it does with other names."""

    name: str
    fields: tuple[tuple[str, Node, bool], ...]
    extra: str = "ignore"  # "forbid": each other name is an error; "ignore"/"allow": none is

    @property
    def tag(self) -> str:  # type: ignore[override]
        return self.name

    def check(self, value: Any, loc: Loc, out: Errors) -> bool:
        if not isinstance(value, dict):
            out.append(_entry("model_attributes_type", loc, "Input should be a valid dictionary or object to extract "
                              "fields from", value))
            return False
        good = True
        for name, node, required in self.fields:
            if name in value:
                good = node.check(value[name], (*loc, name), out) and good
            elif required:
                out.append(_entry("missing", (*loc, name), "Field required", value))
                good = False
        if self.extra == "forbid":
            known = {name for name, _, _ in self.fields}
            for name, item in value.items():
                if name not in known:
                    out.append(_entry("extra_forbidden", (*loc, name), "Extra inputs are not permitted", item))
                    good = False
        return good

    def with_fields(self, more: tuple[tuple[str, Node, bool], ...]) -> Model:
        known = {name for name, _, _ in self.fields}
        return Model(self.name, self.fields + tuple(f for f in more if f[0] not in known), self.extra)


def body_errors(schema: Node, body: bytes) -> Errors | None:
    """FastAPI's ``detail`` for ``body`` against ``schema``: [] when pydantic would take it; None when FastAPI
    cannot read it at all (not UTF-8: its 400 "There was an error parsing the body")."""
    if not body:
        return [_entry("missing", ("body",), "Field required", None)]
    try:
        # Python's json, as Starlette reads a body: its position and words of a syntax error. NaN and
        # Infinity are refused (they are not JSON, and could not be written back in the answer).
        doc = json.loads(body, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return [_entry("json_invalid", ("body", exc.pos), "JSON decode error", {}, {"error": exc.msg})]
    except (UnicodeDecodeError, RecursionError):
        return None
    if doc is None:
        return [_entry("missing", ("body",), "Field required", None)]
    out: Errors = []
    try:
        schema.check(doc, ("body",), out)
    except RecursionError:  # nesting deeper than the checks recurse: said as a syntax error at its start
        return [_entry("json_invalid", ("body", 0), "JSON decode error", {}, {"error": "nested too deeply"})]
    return out


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError("Expecting value", name, 0)


_AT = re.compile(r" - at `\$(.*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def fallback(message: str) -> Errors:
    """One entry for a refusal the schema here does not explain (msgspec's words, where it found the error)."""
    match = _AT.search(message)
    loc: list[str | int] = ["body"]
    if match:
        loc += [name if name is not None else int(index) for name, index in _STEP.findall(match.group(1))]
        message = message[: match.start()]
    return [_entry("value_error", tuple(loc), message, None)]


@cache
def struct_node(cls: type) -> Model:
    """A msgspec Struct as a model: its fields in order, other names ignored unless it forbids them."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return Model(cls.__name__, tuple((f.encode_name, _node(f.type), f.required) for f in info.fields),
                 "forbid" if info.forbid_unknown_fields else "ignore")


def _node(t: mi.Type) -> Node:
    if isinstance(t, mi.Metadata):
        return _node(t.type)
    if isinstance(t, mi.BoolType):
        return Bool()
    if isinstance(t, mi.IntType):
        return Int(t.ge, t.le)
    if isinstance(t, mi.FloatType):
        return Float(t.ge, t.le)
    if isinstance(t, mi.StrType):
        return Str()
    if isinstance(t, mi.ListType):
        return List(_node(t.item_type), t.min_length, t.max_length)
    if isinstance(t, mi.DictType):
        return Dict(_node(t.value_type))
    if isinstance(t, mi.LiteralType):
        return Choice(tuple(t.values))
    if isinstance(t, mi.StructType):
        return struct_node(t.cls)
    if isinstance(t, mi.UnionType):
        members = tuple(_node(m) for m in t.types if not isinstance(m, mi.NoneType))
        inner = members[0] if len(members) == 1 else Union(members)
        return Optional(inner) if t.includes_none else inner
    return AnyValue()
