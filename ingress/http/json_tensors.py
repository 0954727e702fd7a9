"""Tensor data as JSON: request ``data`` arrays in, response ``data`` arrays out.

Inputs: ``data`` may be flat or nested (row-major); it becomes a flat-or-nested
numpy array in the input's dtype, checked for value kinds and integer range so
that ``1.5`` or ``300`` for a UINT8 input is an error instead of a silent cast.
The data plane checks the element count against the shape.

Outputs: a flat numpy view of the output's bytes, which orjson serializes
straight from shared memory (``OPT_SERIALIZE_NUMPY``); BYTES become str.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conveyor.ingress.dataplane import OutputTensor
from conveyor.proto.datatypes import deserialize_bytes, element_count, numpy_dtype
from conveyor.proto.errors import internal, invalid_arg

# Triton's HTTP_MAX_JSON_NESTING_DEPTH: an element at this depth below 'data' is refused.
MAX_NESTING_DEPTH = 100
NESTING_ERROR = f"JSON nesting depth exceeds maximum allowed limit ({MAX_NESTING_DEPTH})"

# Value kinds numpy infers from JSON that each target kind accepts.
_ACCEPTS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_NAMES = {"b": "booleans", "i": "integers", "u": "integers", "f": "numbers", "U": "strings"}


def array_from_json(name: str, datatype: str, data: Any) -> np.ndarray:
    """Convert an input's JSON ``data`` to an array of its datatype (BYTES: utf-8 bytes objects)."""
    if not isinstance(data, list):
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': expected a JSON array")
    if datatype == "BYTES":
        return _bytes_array(name, data)
    if _check_depth(data) > _NUMPY_MAX_DIMS:
        data = _flatten(data)  # Triton reads any depth under its limit; numpy stops at 32 or 64 dims
    if datatype == "BF16":
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data format for input {name}"
        )
    dtype = numpy_dtype(datatype)  # raises for unknown datatypes
    try:
        arr = np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        # Ragged nesting ("inhomogeneous shape") or out-of-range integers.
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': {exc}") from None
    if arr.size == 0:
        return np.empty(0, dtype=dtype)
    kind = arr.dtype.kind
    if kind not in _ACCEPTS[dtype.kind]:
        got = _KIND_NAMES.get(kind, "values of mixed types")
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': expected {datatype} values, got {got}")
    if dtype.kind in "iu" and arr.dtype != dtype:
        info = np.iinfo(dtype)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise invalid_arg(f"Unable to parse 'data' of input '{name}': {bad} is out of range for {datatype}")
    with np.errstate(over="ignore"):  # a number past a float type's range is inf, as in Triton's cast
        return arr.astype(dtype, copy=False)


_NUMPY_MAX_DIMS = 32


def _flatten(data: list[Any]) -> list[Any]:
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _check_depth(data: list[Any]) -> int:
    """How deep ``data`` is nested; refused as deep as Triton refuses it. A tensor is nested
    evenly, so its first elements tell its depth; an uneven array nested deeper
    elsewhere fails numpy's shape check instead."""
    depth = 0
    value: Any = data
    while isinstance(value, list):
        if depth >= MAX_NESTING_DEPTH:
            raise invalid_arg(f"Unable to parse 'data': {NESTING_ERROR}")
        if not value:
            return depth
        value = value[0]
        depth += 1
    if depth >= MAX_NESTING_DEPTH:
        raise invalid_arg(f"Unable to parse 'data': {NESTING_ERROR}")
    return depth


def _bytes_array(name: str, data: list[Any]) -> np.ndarray:
    try:
        flat = [s.encode() for s in data]  # the common case: a flat list of strings
    except AttributeError:
        flat = []
        _collect_strings(name, data, flat, 1)
    arr = np.empty(len(flat), dtype=np.object_)
    arr[:] = flat
    return arr


def _collect_strings(name: str, data: list[Any], out: list[bytes], depth: int) -> None:
    for item in data:
        if depth >= MAX_NESTING_DEPTH:
            raise invalid_arg(NESTING_ERROR)  # as Triton words it for BYTES, without "Unable to parse"
        if isinstance(item, str):
            out.append(item.encode())
        elif isinstance(item, list):
            _collect_strings(name, item, out, depth + 1)
        else:
            raise invalid_arg(
                f"Unable to parse 'data' of input '{name}': BYTES elements must be JSON strings, "
                f"got {type(item).__name__}"
            )


def json_output_data(out: OutputTensor) -> np.ndarray | list[str]:
    """The flat JSON ``data`` of an output: a numpy view of shared memory (serialize it
    before the result is released) or, for BYTES, a list of str."""
    count = element_count(out.shape)
    raw = out.raw
    if raw is None:
        raise internal(f"output '{out.name}' lies in the client's shared memory")
    if out.datatype == "BYTES":
        items = deserialize_bytes(raw.data, count)
        try:
            return [b.decode() for b in items]
        except UnicodeDecodeError:
            raise invalid_arg(
                f"output '{out.name}' holds BYTES that are not valid UTF-8 and cannot be returned as "
                "JSON; request it with binary_data=true"
            ) from None
    if out.datatype == "BF16":
        # No JSON-able numpy type: widen the top 16 bits of a float32 (exact).
        return (_view(out.name, raw, np.dtype("<u2"), count).astype("<u4") << 16).view("<f4")
    values = _view(out.name, raw, numpy_dtype(out.datatype), count)
    if out.datatype == "FP16":
        return values.astype(np.float32)  # orjson has no float16; float32 holds every value exactly
    return values


def _view(name: str, raw: np.ndarray, dtype: np.dtype, count: int) -> np.ndarray:
    if raw.nbytes != count * dtype.itemsize:
        raise internal(f"output tensor shape does not match size of output for '{name}'")
    return raw.view(dtype)
