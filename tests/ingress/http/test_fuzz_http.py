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
import math
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
from conveyor.proto.datatypes import element_size
from conveyor.proto.errors import ConveyorError
from conveyor.proto.request_checks import InferInput, check_inputs
from conveyor.proto.signature import ModelSignature, TensorSpec
from tests.support.fuzz import CLIENT_MISTAKES_500, bounded, tried
from tests.support.fuzz_data_plane import data_plane, send
from tests.support.fuzz_http_requests import binary_requests, dumps, infer_docs

LEVEL = "unit"

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


@bounded(300)
@given(binary_requests())
def test_binary_extension_sizes_that_lie_are_refused_or_exact(case: tuple[bytes, int]) -> None:
    tried("http binary extension")
    body, length = case
    request = accepted_or_refused(body, length)
    if request is not None:
        # Accepted: then the binary inputs own exactly the bytes after the header.
        binary = [i for i in request.call.inputs if isinstance(i.data, memoryview)]
        assert sum(i.data.nbytes for i in binary) == len(body) - length  # type: ignore[misc, union-attr]


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
        inp = request.call.inputs[0]
        check_inputs(sig, [InferInput(inp.name, inp.datatype, inp.shape, inp.data)])
    except ConveyorError:
        event("refused")
        assert not fits(body, dims, datatype), "a body that fits the input refused"
        return
    event("accepted")
    assert fits(body, dims, datatype), "a body that does not fit the input accepted"
    # Sized: the deduced shape holds exactly the body, batch 1 when the model batches.
    assert inp.shape[: 1 if mbs else 0] == ([1] if mbs else [])
    if datatype == "BYTES":
        assert bytes(inp.data) == len(body).to_bytes(4, "little") + body  # type: ignore[arg-type]
    else:
        assert math.prod(inp.shape) * element_size(datatype) == len(body)


def fits(body: bytes, dims: list[int], datatype: str) -> bool:
    """Whether ``body`` can be the one input of these dims, as Triton deduces its shape."""
    if any(d < -1 for d in dims):
        return False  # -1 is the one wildcard
    variable = [d for d in dims if d < 0]
    if datatype == "BYTES":
        return not variable and math.prod(dims) == 1  # one element: the whole body
    size = math.prod(d for d in dims if d >= 0) * element_size(datatype)
    if len(variable) > 1:
        return False
    if variable:
        return len(body) % size == 0 if size else not body
    return len(body) == size


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
    assert result.status_code in (200, 400, 404, 500, 501, 503), result.text
    if result.status_code != 200:
        error = orjson.loads(result.content)
        assert set(error) == {"error"}
        assert result.status_code != 500 or error["error"].startswith(CLIENT_MISTAKES_500), result.text


async def _post(client: falcon.testing.TestClient, path: str, body: bytes, headers: dict[str, str]) -> Any:
    async with client as conductor:  # one event loop for the app and its fake router
        return await conductor.simulate_post(path, body=body, headers=headers)
