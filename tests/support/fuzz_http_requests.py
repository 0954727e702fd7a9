"""Hypothesis strategies for HTTP infer request bodies that lie: JSON shaped like an
infer request with every field perturbed, and the binary tensor extension with sizes
that lie (the fuzz tests of the HTTP parsers and of a running group)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from conveyor.proto.datatypes import DATATYPES
from tests.support.fuzz_data_plane import INPUT_TYPES, INPUTS


def dumps(doc: Any) -> bytes:
    """JSON text of ``doc``; unlike orjson, the standard library writes integers of any size."""
    return json.dumps(doc).encode()


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=False), st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
names = st.sampled_from([*INPUTS, "Y", "nope", ""]) | st.text(max_size=4)
datatypes = st.sampled_from(sorted(DATATYPES)) | json_values
dims = st.integers(min_value=-3, max_value=6) | st.sampled_from([1 << 31, 1 << 62, 1 << 64])
shapes = st.lists(dims, max_size=3) | json_values
param_values = st.one_of(
    json_values, st.integers(min_value=-5, max_value=64), st.sampled_from(["r", "", 1.5, True, -1]),
)
tensor_params = st.dictionaries(
    st.sampled_from(["binary_data_size", "binary_data", "classification", "shared_memory_region",
                     "shared_memory_byte_size", "shared_memory_offset", "custom"]),
    param_values, max_size=3,
) | json_values
request_params = st.dictionaries(
    st.sampled_from(["sequence_id", "sequence_start", "priority", "timeout", "binary_data_output",
                     "triton_x", "custom", "headers"]),
    param_values, max_size=3,
) | json_values


@st.composite
def input_tensors(draw: st.DrawFn) -> dict[str, Any]:
    tensor: dict[str, Any] = {}
    for key, strategy in (("name", names), ("datatype", datatypes), ("shape", shapes),
                          ("data", json_values), ("parameters", tensor_params)):
        if draw(st.booleans()) or key in ("name", "datatype", "shape"):
            tensor[key] = draw(strategy)
    return tensor


@st.composite
def valid_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Inputs the model accepts as they are: the seeds the mutations start from."""
    batch = draw(st.integers(1, 4))
    n = draw(st.integers(0, 3))
    inputs = [{"name": "F", "datatype": "FP32", "shape": [batch, n],
               "data": draw(st.lists(st.floats(width=32, allow_nan=False), min_size=batch * n, max_size=batch * n))}]
    if draw(st.booleans()):
        inputs.append({"name": "I", "datatype": "INT8", "shape": [batch, 2, 2],
                       "data": [[[draw(st.integers(-128, 127)) for _ in range(2)] for _ in range(2)]
                                for _ in range(batch)]})
    if draw(st.booleans()):
        inputs.append({"name": "S", "datatype": "BYTES", "shape": [batch, 1],
                       "data": draw(st.lists(st.text(max_size=4), min_size=batch, max_size=batch))})
    if draw(st.booleans()):
        inputs.append({"name": "B", "datatype": "BOOL", "shape": [batch, 3],
                       "data": draw(st.lists(st.booleans(), min_size=3 * batch, max_size=3 * batch))})
    return inputs


_FIELDS = {"name": names, "datatype": datatypes, "shape": shapes, "data": json_values, "parameters": tensor_params}


@st.composite
def infer_docs(draw: st.DrawFn) -> Any:
    """An infer request body: a valid one with up to three fields made wrong, or any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    inputs: Any = draw(valid_inputs())
    doc: dict[str, Any] = {"inputs": inputs}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": names}, optional={"parameters": tensor_params}), max_size=3) | json_values)
    if draw(st.booleans()):
        doc["parameters"] = draw(request_params)
    if draw(st.booleans()):
        doc["id"] = draw(json_values)
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.integers(0, len(inputs) + 1))
        if where == len(inputs):
            inputs.append(draw(input_tensors()))
        elif where > len(inputs):
            doc["inputs"] = draw(json_values)
            break
        else:
            field = draw(st.sampled_from(sorted(_FIELDS)))
            inputs[where][field] = draw(_FIELDS[field])
    return doc


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, int]:
    """A JSON header naming binary inputs, whose sizes, header length and tail may all lie."""
    count = draw(st.integers(1, 3))
    chunks = [draw(st.binary(max_size=24)) for _ in range(count)]
    inputs = []
    for i, chunk in enumerate(chunks):
        name = draw(st.sampled_from(INPUTS)) if i else "F"  # F is required
        shape = [1, len(chunk) // 4] if draw(st.booleans()) else draw(st.lists(dims, max_size=3))
        size: Any = len(chunk)
        lie = draw(st.integers(0, 5))
        if lie == 1:
            size = draw(st.integers(min_value=-(1 << 63), max_value=1 << 64))  # negative, oversized
        elif lie == 2:
            size = len(chunk) + draw(st.sampled_from([-1, 1, 4]))  # truncated or overlapping the next
        elif lie == 3:
            size = draw(st.sampled_from([1.0, "4", True, None, [4]]))
        inputs.append({"name": name, "datatype": INPUT_TYPES[name], "shape": shape,
                       "parameters": {"binary_data_size": size}})
    header = dumps({"inputs": inputs})
    tail = b"".join(chunks) + draw(st.sampled_from([b"", b"", b"x", b"\0\0\0\0"]))
    length = len(header) + draw(st.sampled_from([0, 0, 0, -1, 1, -len(header), len(tail) + 1]))
    return header + tail, length
