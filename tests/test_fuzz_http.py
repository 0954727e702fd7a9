"""Property-based tests of the HTTP parsers: whatever the body and headers, a request
is either accepted or refused with a ``ConveyorError`` (the protocol's 4xx); never
another exception, which the app would render as a 500.

Bodies are generated three ways: JSON shaped like an infer request with every
field perturbed, the binary tensor extension with sizes that lie, and BYTES
tensors whose length prefixes lie. What parses goes on through the real data
plane (validation against a signature, the write into shared memory).
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import falcon.testing
import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from conveyor.ingress.context import IngressContext
from conveyor.ingress.http import compression
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.codec import HttpInferRequest, parse_header_length, parse_infer_request
from conveyor.ingress.http.raw_body import raw_infer_request
from conveyor.ingress.request_checks import InferInput, check_inputs
from conveyor.ingress.signature import ModelSignature, TensorSpec
from conveyor.proto.datatypes import DATATYPES
from conveyor.proto.errors import ConveyorError
from tests.fuzz import bounded, tried
from tests.fuzz_data_plane import INPUT_TYPES, INPUTS, data_plane, send

# --- strategies ---------------------------------------------------------------------


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


# --- the properties -----------------------------------------------------------------


def accepted_or_refused(body: bytes, header_length: int | None) -> HttpInferRequest | None:
    """Parse and send ``body`` as the app does; None when refused with a protocol error."""
    try:
        request = parse_infer_request(body, "m", "", header_length)
    except ConveyorError:
        event("refused by the codec")
        return None
    with data_plane(max_input_elements=1 << 16) as plane:
        try:
            send(plane, request.call)
        except ConveyorError:
            event("refused by the data plane")
            return None
    event("accepted")  # --hypothesis-show-statistics: how often each outcome came up
    return request


@bounded(300)
@given(infer_docs())
def test_json_bodies_are_parsed_or_refused(doc: Any) -> None:
    tried("http json body")
    accepted_or_refused(dumps(doc), None)


@bounded(150)
@given(st.binary(max_size=64), st.one_of(st.none(), st.integers(min_value=-4, max_value=80)))
def test_arbitrary_bytes_are_refused(body: bytes, header_length: int | None) -> None:
    tried("http arbitrary bytes")
    if header_length == 0:
        header_length = None  # raw bodies (length 0) are raw_body's; see below
    accepted_or_refused(body, header_length)


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


@bounded(300)
@given(binary_requests())
def test_binary_extension_sizes_that_lie_are_refused_or_exact(case: tuple[bytes, int]) -> None:
    tried("http binary extension")
    body, length = case
    request = accepted_or_refused(body, length)
    if request is not None:
        # Accepted: then the binary inputs own exactly the bytes after the header.
        binary = [i for i in request.call.inputs if isinstance(i.data, memoryview)]
        assert sum(i.data.nbytes for i in binary) == len(body) - length  # type: ignore[union-attr]


@st.composite
def bytes_tensors(draw: st.DrawFn) -> tuple[bytes, int]:
    """BYTES wire data (4-byte length + bytes per element) whose prefixes may lie."""
    elements = draw(st.lists(st.binary(max_size=6), max_size=4))
    out = b""
    for element in elements:
        prefix = len(element)
        if draw(st.integers(0, 4)) == 0:
            prefix = draw(st.sampled_from([0, prefix + 1, prefix + 100, (1 << 32) - 1, 1 << 31]))
        out += struct.pack("<I", prefix) + element
    out += draw(st.sampled_from([b"", b"", b"\1", b"\5\0\0"]))  # a torn prefix at the end
    return out, draw(st.sampled_from([len(elements), len(elements) + 1, max(len(elements) - 1, 0)]))


@bounded(300)
@given(bytes_tensors())
def test_bytes_tensors_with_lying_length_prefixes(case: tuple[bytes, int]) -> None:
    tried("http BYTES length prefixes")
    data, count = case
    header = orjson.dumps({"inputs": [
        {"name": "F", "datatype": "FP32", "shape": [1, 1], "data": [1.0]},
        {"name": "S", "datatype": "BYTES", "shape": [1, count], "parameters": {"binary_data_size": len(data)}},
    ]})
    request = accepted_or_refused(header + data, len(header))
    if request is not None:
        # Accepted: the prefixes walk the data exactly, one per element.
        pos = n = 0
        while pos < len(data):
            pos += 4 + struct.unpack_from("<I", data, pos)[0]
            n += 1
        assert (pos, n) == (len(data), count)


@bounded(200)
@given(st.binary(max_size=40), st.lists(st.integers(min_value=-2, max_value=5), min_size=0, max_size=3),
       st.sampled_from(["FP32", "INT8", "BYTES", "BOOL"]), st.integers(0, 4))
def test_raw_binary_bodies_are_sized_or_refused(body: bytes, dims: list[int], datatype: str, mbs: int) -> None:
    tried("http raw binary body")
    sig = ModelSignature("r", mbs, {"x": TensorSpec("x", datatype, tuple(dims))}, {})
    try:
        request = raw_infer_request(memoryview(body), "r", "", sig)
    except ConveyorError:
        return
    with data_plane() as plane:
        plane.models._cache[("r", "")] = sig
        inp = request.call.inputs[0]
        try:
            check_inputs(sig, [InferInput(inp.name, inp.datatype, inp.shape, inp.data)])
        except ConveyorError:
            pass


@bounded(200)
@given(st.one_of(st.none(), st.text(max_size=12), st.integers().map(str), st.just("9" * 5000)))
def test_header_length_header(value: str | None) -> None:
    tried("http Inference-Header-Content-Length")
    try:
        parsed = parse_header_length(value)
    except ConveyorError:
        return
    assert parsed is None or isinstance(parsed, int)


@bounded(200)
@given(st.binary(max_size=64), st.sampled_from([compression.GZIP, compression.DEFLATE]),
       st.integers(min_value=0, max_value=256))
def test_corrupt_compressed_bodies_are_refused(body: bytes, coding: str, limit: int) -> None:
    tried("http compressed body")
    try:
        out = compression.decompress(body, coding, limit)
    except ConveyorError:
        return
    assert len(out) <= limit


@bounded(200)
@given(st.text(max_size=40))
def test_accept_encoding_never_fails(value: str) -> None:
    tried("http Accept-Encoding")
    assert compression.response_coding(value) in (None, compression.GZIP, compression.DEFLATE)


# --- the whole app, with a fake router ------------------------------------------------

headers_strategy = st.fixed_dictionaries({}, optional={
    "Inference-Header-Content-Length": st.sampled_from(["0", "-1", "5", "x", "99999999999999999999", ""]),
    "Content-Encoding": st.sampled_from(["gzip", "deflate", "br", "identity", ""]),
    "Accept-Encoding": st.sampled_from(["gzip", "deflate;q=0.5, gzip;q=nan", "*"]),
    "Content-Type": st.sampled_from(["application/json", "text/plain"]),
})


@bounded(150)
@given(st.one_of(infer_docs().map(dumps), binary_requests().map(lambda c: c[0]), st.binary(max_size=64)),
       headers_strategy, st.sampled_from(["/v2/models/m/infer", "/v2/models/m/versions/1/infer"]))
def test_the_app_answers_4xx_json_or_200(body: bytes, headers: dict[str, str], path: str) -> None:
    tried("http app infer")
    with data_plane() as plane:
        ctx = IngressContext(plane.link, plane, plane.arena, plane.drain)
        client = falcon.testing.TestClient(build_app(ctx, max_body_bytes=1 << 16))
        result = asyncio.run(_post(client, path, body, headers))
    assert result.status_code in (200, 400, 404, 501, 503), result.text
    if result.status_code != 200:
        assert set(orjson.loads(result.content)) == {"error"}


async def _post(client: falcon.testing.TestClient, path: str, body: bytes, headers: dict[str, str]) -> Any:
    async with client as conductor:  # one event loop for the app and its fake router
        return await conductor.simulate_post(path, body=body, headers=headers)
