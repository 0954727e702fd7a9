"""Golden cases for the HTTP codec, without sockets.

Requests are made by tritonclient.http itself (``generate_request_body``) and
responses are read back with tritonclient's own parser (``parse_response_body``,
i.e. ``InferResult.from_response_body``): tritonclient is the judge.
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as th

from conveyor.ingress.dataplane import InferResult, OutputTensor
from conveyor.ingress.http import compression
from conveyor.ingress.http.codec import (
    HttpInferRequest,
    build_infer_response,
    parse_header_length,
    parse_infer_request,
)
from conveyor.proto import messages as m
from conveyor.proto.datatypes import serialize_bytes
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.shm_params import ShmPlacement

LEVEL = "unit"

Client = th.InferenceServerClient


def body_of(doc: dict[str, Any], *binary: bytes) -> tuple[bytes, int | None]:
    header = orjson.dumps(doc)
    if not binary:
        return header, None
    return b"".join([header, *binary]), len(header)


def parse_doc(doc: dict[str, Any], *binary: bytes) -> HttpInferRequest:
    body, length = body_of(doc, *binary)
    return parse_infer_request(body, "m", "", length)


def invalid(doc: dict[str, Any], *binary: bytes, match: str, status: Status = Status.INVALID_ARG) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        parse_doc(doc, *binary)
    assert err.value.status == status


def tensor(name: str, datatype: str, shape: list[int], **fields: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, **fields}


# --- requests -------------------------------------------------------------------------


def test_tritonclient_mixed_binary_and_json_inputs() -> None:
    a = th.InferInput("A", [2, 3], "FP32").set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = th.InferInput("B", [2], "BYTES").set_data_from_numpy(
        np.array([b"hi", "é".encode()], dtype=object), binary_data=False
    )
    c = th.InferInput("C", [3], "INT8").set_data_from_numpy(np.array([1, -2, 3], np.int8))
    d = th.InferInput("D", [2], "BYTES").set_data_from_numpy(np.array([b"\xff", b""], dtype=object))
    outputs = [th.InferRequestedOutput("X"), th.InferRequestedOutput("Y", binary_data=False, class_count=3)]
    body, length = Client.generate_request_body(
        [a, b, c, d],
        outputs=outputs,
        request_id="r1",
        sequence_id=7,
        sequence_start=True,
        priority=2,
        timeout=1000,
        parameters={"custom": "x"},
    )
    req = parse_infer_request(body, "m", "3", length)
    call = req.call
    assert (call.model, call.version, call.id) == ("m", "3", "r1")
    assert call.parameters == {
        "sequence_id": 7,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 1000,
        "custom": "x",
    }
    ia, ib, ic, id_ = call.inputs
    # Binary inputs are zero-copy views of the request body.
    assert isinstance(ia.data, memoryview) and ia.data.obj is body
    assert np.frombuffer(ia.data, np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    assert (ia.shape, ia.datatype, ia.parameters) == ([2, 3], "FP32", {})
    assert isinstance(ib.data, np.ndarray) and ib.data.dtype == object
    assert ib.data.tolist() == [b"hi", "é".encode()]
    assert isinstance(ic.data, memoryview) and bytes(ic.data) == b"\x01\xfe\x03"
    assert isinstance(id_.data, memoryview) and bytes(id_.data) == serialize_bytes(np.array([b"\xff", b""]))
    assert [(o.name, o.classification, o.parameters) for o in call.outputs or []] == [
        ("X", 0, {}),
        ("Y", 3, {}),
    ]
    assert req.wants_binary("X") and not req.wants_binary("Y")


def test_tritonclient_no_outputs_means_all_binary() -> None:
    a = th.InferInput("A", [1], "INT32").set_data_from_numpy(np.array([5], np.int32), binary_data=False)
    body, length = Client.generate_request_body([a])
    assert length is None
    req = parse_infer_request(body, "m")
    assert req.call.outputs is None
    assert req.binary_default and req.wants_binary("anything")
    assert req.call.parameters == {}  # binary_data_output is for the HTTP layer only
    assert isinstance(req.call.inputs[0].data, np.ndarray)
    assert req.call.inputs[0].data.dtype == np.int32


def test_binary_data_output_is_overridden_per_output() -> None:
    req = parse_doc(
        {
            "inputs": [tensor("A", "INT32", [1], data=[1])],
            "outputs": [{"name": "X"}, {"name": "Y", "parameters": {"binary_data": False}}],
            "parameters": {"binary_data_output": True},
        }
    )
    assert req.wants_binary("X") and not req.wants_binary("Y")
    assert parse_doc({"inputs": [], "outputs": []}).call.outputs is None


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("FP32", [[1, 2.5, 3], [4, 5, 6]], np.array([[1, 2.5, 3], [4, 5, 6]], np.float32)),
        ("FP16", [[0.5, 1], [2, -3]], np.array([[0.5, 1], [2, -3]], np.float16)),
        ("FP64", [1, 2], np.array([1, 2], np.float64)),
        ("INT8", [[-128], [127]], np.array([[-128], [127]], np.int8)),
        ("UINT8", [0, 255], np.array([0, 255], np.uint8)),
        ("UINT64", [2**64 - 1], np.array([2**64 - 1], np.uint64)),
        ("INT64", [[[-(2**63)]]], np.array([[[-(2**63)]]], np.int64)),
        ("BOOL", [[True, False]], np.array([[True, False]])),
        ("INT32", [], np.empty(0, np.int32)),
    ],
)
def test_json_data_flat_and_nested(datatype: str, data: Any, expected: np.ndarray) -> None:
    inp = parse_doc({"inputs": [tensor("A", datatype, list(expected.shape), data=data)]}).call.inputs[0]
    assert isinstance(inp.data, np.ndarray)
    assert inp.data.dtype == expected.dtype
    np.testing.assert_array_equal(inp.data, expected)


def test_json_bytes_flat_and_nested() -> None:
    flat = parse_doc({"inputs": [tensor("S", "BYTES", [2], data=["a", "ü"])]}).call.inputs[0].data
    nested = parse_doc({"inputs": [tensor("S", "BYTES", [2, 1], data=[["a"], ["ü"]])]}).call.inputs[0].data
    for arr in (flat, nested):
        assert isinstance(arr, np.ndarray) and arr.dtype == object
        assert arr.tolist() == [b"a", "ü".encode()]


@pytest.mark.parametrize(
    ("datatype", "data", "match"),
    [
        ("UINT8", [300], "300 is out of range for UINT8"),
        ("INT8", [-129], "out of range for INT8"),
        ("UINT32", [-1], "out of range for UINT32"),
        ("INT32", [1.5], "expected INT32 values, got numbers"),
        ("INT32", ["1"], "got strings"),
        ("BOOL", [1, 0], "expected BOOL values, got integers"),
        ("FP32", [True], "got booleans"),
        ("FP32", [[1, 2], [3]], "Unable to parse 'data' of input 'A'"),
        ("FP32", [None], "mixed types"),
        ("FP32", 5, "expected a JSON array"),
        ("BYTES", ["a", 1], "BYTES elements must be JSON strings"),
        ("BF16", [1.0], "receiving BF16 data via JSON is not supported"),
    ],
)
def test_json_data_errors(datatype: str, data: Any, match: str) -> None:
    invalid({"inputs": [tensor("A", datatype, [1], data=data)]}, match=match)


def test_truncated_body() -> None:
    doc = {"inputs": [tensor("A", "FP32", [4], parameters={"binary_data_size": 16})]}
    invalid(doc, b"\0" * 12, match="unexpected size for input 'A', expecting 4 additional bytes")


def test_binary_sizes_short_of_body() -> None:
    doc = {"inputs": [tensor("A", "FP32", [1], parameters={"binary_data_size": 4})]}
    invalid(doc, b"\0" * 6, match="unexpected additional input data for model 'm': 2 bytes")


def test_binary_parts_follow_input_order() -> None:
    doc = {
        "inputs": [
            tensor("A", "UINT8", [2], parameters={"binary_data_size": 2}),
            tensor("J", "INT32", [1], data=[9]),
            tensor("B", "UINT8", [3], parameters={"binary_data_size": 3}),
            tensor("E", "UINT8", [0], parameters={"binary_data_size": 0}),
        ]
    }
    a, _j, b, e = parse_doc(doc, b"ab", b"cde").call.inputs
    assert (bytes(a.data), bytes(b.data), bytes(e.data)) == (b"ab", b"cde", b"")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("length", "match"),
    [(-1, r"range \(0, 10\), got: -1"), (11, r"range \(0, 10\), got: 11")],
)
def test_bad_header_length(length: int, match: str) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        parse_infer_request(b'{"inputs"}', "m", "", length)
    assert err.value.status == Status.INVALID_ARG


def test_header_length_header() -> None:
    assert parse_header_length(None) is None
    assert parse_header_length("12") == 12
    with pytest.raises(ConveyorError, match="Unable to parse Inference-Header-Content-Length"):
        parse_header_length("12abc")


def test_raw_binary_request_is_unsupported() -> None:
    with pytest.raises(ConveyorError, match="raw binary requests") as err:
        parse_infer_request(b"\0\0\0\0", "m", "", 0)
    assert err.value.status == Status.UNSUPPORTED


@pytest.mark.parametrize(
    ("body", "length", "match"),
    [
        (b'{"inputs": [', None, "failed to parse the request JSON"),
        (b'{"inputs": []}xyz', 12, "failed to parse the request JSON"),
        (b"[1, 2]", None, "must be an object"),
        (b"{}", None, "needs an 'inputs' array"),
    ],
)
def test_malformed_json(body: bytes, length: int | None, match: str) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        parse_infer_request(body, "m", "", length)
    assert err.value.status == Status.INVALID_ARG


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"inputs": [5]}, "input 0 is not a JSON object"),
        ({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, "Unable to parse 'name' of input 0"),
        ({"inputs": [tensor("A", "FLOAT", [1], data=[1])]}, "Unable to parse 'datatype' of input 'A'"),
        ({"inputs": [tensor("A", "FP32", [-1], data=[1])]}, "attempt to access JSON non-unsigned-integer"),
        ({"inputs": [tensor("A", "FP32", [True], data=[1])]}, "Unable to parse 'shape'"),
        ({"inputs": [tensor("A", "FP32", [1])]}, "But no field is set"),
        ({"inputs": [tensor("A", "FP32", [1], parameters=[])]}, "'parameters' of input 'A'"),
        (
            {"inputs": [tensor("A", "FP32", [1], data=[1], parameters={"binary_data_size": 4})]},
            "But set 'data' 'binary_data_size'",
        ),
        (
            {"inputs": [tensor("A", "FP32", [1], parameters={"binary_data_size": 4})]},
            "must specify valid 'Inference-Header-Content-Length'",
        ),
        ({"inputs": [], "id": 5}, "Unable to parse 'id'"),
        ({"inputs": [], "outputs": {}}, "Unable to parse 'outputs'"),
        ({"inputs": [], "outputs": [{"name": 1}]}, "'name' of output 0"),
        (
            {"inputs": [], "outputs": [{"name": "X", "parameters": {"binary_data": 1}}]},
            "'binary_data' of output",
        ),
        (
            {"inputs": [], "outputs": [{"name": "X", "parameters": {"classification": -1}}]},
            "'classification'",
        ),
        ({"inputs": [], "parameters": []}, "Unable to parse 'parameters'"),
        ({"inputs": [], "parameters": {"sequence_start": 1}}, "Unable to parse 'sequence_start'"),
        ({"inputs": [], "parameters": {"priority": -1}}, "Unable to parse 'priority'"),
        ({"inputs": [], "parameters": {"timeout": 1.5}}, "Unable to parse 'timeout'"),
        ({"inputs": [], "parameters": {"sequence_id": [1]}}, "Unable to parse 'sequence_id'"),
        ({"inputs": [], "parameters": {"binary_data_output": "yes"}}, "Unable to parse 'binary_data_output'"),
        ({"inputs": [], "parameters": {"triton_x": 1}}, "reserved for Triton usage"),
        ({"inputs": [], "parameters": {"custom": {"a": 1}}}, "parameter 'custom' has invalid type"),
    ],
)
def test_malformed_requests(doc: dict[str, Any], match: str) -> None:
    # A shape Triton's JSON reader cannot read is its INTERNAL (500): Triton's status by default.
    invalid(doc, match=match, status=Status.CLIENT_MISTAKE if "Unable to parse 'shape'" in match or
            "non-unsigned-integer" in match else Status.INVALID_ARG)


def test_binary_data_size_must_be_a_count() -> None:
    doc = {"inputs": [tensor("A", "FP32", [1], parameters={"binary_data_size": "4"})]}
    invalid(doc, b"\0" * 4, match="'binary_data_size' of input 'A'")


def test_shared_memory_tensors_carry_their_placement() -> None:
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": 8}
    doc = {"inputs": [tensor("A", "FP32", [1], parameters=region)],
           "outputs": [{"name": "X", "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 64}}]}
    call = parse_doc(doc).call
    assert (call.inputs[0].data, call.inputs[0].shm) == (None, ShmPlacement("r", 8, 4))
    assert call.outputs is not None and call.outputs[0].shm == ShmPlacement("o", 0, 64)


def test_shared_memory_input_with_data_or_bad_size_is_refused() -> None:
    region = {"shared_memory_region": "r", "shared_memory_byte_size": 4}
    invalid({"inputs": [tensor("A", "FP32", [1], data=[1], parameters=region)]},
            match="But set 'data' 'shared_memory_region'")
    invalid({"inputs": [tensor("A", "FP32", [1], parameters={"shared_memory_region": "r"})]},
            match="no 'shared_memory_byte_size'")
    invalid({"inputs": [tensor("A", "FP32", [1], parameters={**region, "shared_memory_offset": -1})]},
            match="'shared_memory_offset' of input 'A'")


def test_extra_tensor_parameters_pass_through() -> None:
    doc = {
        "inputs": [tensor("A", "UINT8", [1], parameters={"binary_data_size": 1, "note": "x"})],
        "outputs": [{"name": "X", "parameters": {"binary_data": True, "classification": 2, "k": 1}}],
    }
    call = parse_doc(doc, b"\1").call
    assert call.inputs[0].parameters == {"note": "x"}
    assert call.outputs is not None and call.outputs[0].parameters == {"k": 1}


# --- responses ------------------------------------------------------------------------


class FakeRegions:
    """Stands in for RegionCache: the release flag lands in ``flags``."""

    def __init__(self) -> None:
        self.flags = np.zeros(4, np.uint8)

    def view(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        return self.flags[offset : offset + nbytes]

    def array(self, name: str) -> np.ndarray:
        return self.flags


def output(name: str, datatype: str, array: np.ndarray) -> OutputTensor:
    if datatype == "BYTES":
        raw = np.frombuffer(serialize_bytes(array), np.uint8)
    else:
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return OutputTensor(name, datatype, list(array.shape), raw)


def result_of(
    outputs: list[OutputTensor], *, id: str = "", parameters: dict[str, Any] | None = None
) -> tuple[InferResult, FakeRegions]:
    regions = FakeRegions()
    result = InferResult("m", "1", id, outputs, parameters or {}, [m.Release("r", 1)], regions)  # type: ignore[arg-type]
    return result, regions


def request_for(outputs: dict[str, bool] | None = None, *, binary_output: bool = False) -> HttpInferRequest:
    doc: dict[str, Any] = {"inputs": [], "parameters": {"binary_data_output": binary_output}}
    if outputs is not None:
        doc["outputs"] = [{"name": n, "parameters": {"binary_data": b}} for n, b in outputs.items()]
    return parse_doc(doc)


def test_binary_response_layout_parsed_by_tritonclient() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = np.array([[1, -2]], np.int64)
    s = np.array([b"ab", b"\xffz", b""], dtype=object)
    h = np.array([0.5, -1.25], np.float16)
    e = np.zeros((0, 3), np.int32)
    outs = [
        output("X", "FP32", x),
        output("Y", "INT64", y),
        output("S", "BYTES", s),
        output("H", "FP16", h),
        output("E", "INT32", e),
    ]
    result, regions = result_of(outs, id="req-7", parameters={"p": 1})
    req = request_for({"X": True, "Y": False, "S": True, "H": True, "E": True})
    resp = build_infer_response(result, req)
    assert regions.flags[1] == 1  # released
    assert resp.header_length is not None
    assert resp.content_type == "application/octet-stream"
    header = orjson.loads(resp.body[: resp.header_length])
    assert header["model_name"] == "m" and header["model_version"] == "1" and header["id"] == "req-7"
    assert header["parameters"] == {"p": 1}
    assert [o["name"] for o in header["outputs"]] == ["X", "Y", "S", "H", "E"]
    assert header["outputs"][1]["data"] == [1, -2]
    assert header["outputs"][4]["parameters"] == {"binary_data_size": 0}
    # Binary bytes follow the JSON in output order, nothing else.
    assert resp.body[resp.header_length :] == x.tobytes() + serialize_bytes(s) + h.tobytes()

    parsed = Client.parse_response_body(resp.body, header_length=resp.header_length)
    np.testing.assert_array_equal(parsed.as_numpy("X"), x)
    np.testing.assert_array_equal(parsed.as_numpy("Y"), y)
    assert parsed.as_numpy("S").tolist() == [b"ab", b"\xffz", b""]
    np.testing.assert_array_equal(parsed.as_numpy("H"), h)
    assert parsed.as_numpy("E").shape == (0, 3)


def test_json_response_parsed_by_tritonclient() -> None:
    outs = [
        output("F", "FP32", np.array([[0.1, 2.5]], np.float32)),
        output("H", "FP16", np.array([0.1, 3], np.float16)),
        output("B", "BOOL", np.array([True, False])),
        output("U", "UINT64", np.array([2**64 - 1], np.uint64)),
        output("S", "BYTES", np.array(["é".encode(), b"x"], dtype=object).reshape(2, 1)),
    ]
    result, regions = result_of(outs)
    resp = build_infer_response(result, request_for())
    assert regions.flags[1] == 1
    assert resp.header_length is None and resp.content_type == "application/json"
    doc = orjson.loads(resp.body)
    assert "id" not in doc and "parameters" not in doc
    assert doc["outputs"][0]["data"] == [0.1, 2.5]  # flat, shortest float32 repr
    assert doc["outputs"][3]["data"] == [2**64 - 1]
    assert doc["outputs"][4]["data"] == ["é", "x"]
    parsed = Client.parse_response_body(resp.body)
    np.testing.assert_array_equal(parsed.as_numpy("F"), np.array([[0.1, 2.5]], np.float32))
    np.testing.assert_array_equal(parsed.as_numpy("H"), np.array([0.1, 3], np.float16))
    np.testing.assert_array_equal(parsed.as_numpy("B"), [True, False])
    assert parsed.as_numpy("U").tolist() == [2**64 - 1]
    assert parsed.as_numpy("S").tolist() == [["é"], ["x"]]


def test_all_outputs_follow_binary_data_output() -> None:
    outs = [output("X", "INT32", np.array([1, 2], np.int32)), output("Y", "INT32", np.array([3], np.int32))]
    result, _ = result_of(outs)
    resp = build_infer_response(result, request_for(binary_output=True))
    parsed = Client.parse_response_body(resp.body, header_length=resp.header_length)
    assert parsed.as_numpy("X").tolist() == [1, 2] and parsed.as_numpy("Y").tolist() == [3]
    assert all("data" not in o for o in parsed.get_response()["outputs"])


def test_bf16_json_output_is_widened() -> None:
    words = (np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    result, _ = result_of([OutputTensor("B", "BF16", [2], words.view(np.uint8))])
    doc = orjson.loads(build_infer_response(result, request_for()).body)
    assert doc["outputs"][0]["data"] == [1.5, -2.0]


def test_non_utf8_bytes_as_json_fails_and_still_releases() -> None:
    result, regions = result_of([output("S", "BYTES", np.array([b"\xff"], dtype=object))])
    with pytest.raises(ConveyorError, match=r"not valid UTF-8.*binary_data=true") as err:
        build_infer_response(result, request_for())
    assert err.value.status == Status.INVALID_ARG
    assert regions.flags[1] == 1


def test_output_size_mismatch_is_internal() -> None:
    result, regions = result_of([OutputTensor("X", "FP32", [3], np.zeros(8, np.uint8))])
    with pytest.raises(ConveyorError, match="does not match size of output for 'X'") as err:
        build_infer_response(result, request_for())
    assert err.value.status == Status.INTERNAL
    assert regions.flags[1] == 1


# --- compression ----------------------------------------------------------------------

PAYLOAD = b'{"inputs":[]}' + bytes(range(256)) * 40


@pytest.mark.parametrize(
    ("coding", "encode"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", lambda b: zlib.compress(b, wbits=-15))],
)
def test_request_decompression(coding: str, encode: Any) -> None:
    # tritonclient: gzip.compress for gzip, zlib.compress for deflate; raw deflate from others.
    assert compression.request_coding(coding) == coding
    assert compression.decompress(encode(PAYLOAD), coding, 1 << 20) == PAYLOAD


def test_gzip_multi_member() -> None:
    body = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert compression.decompress(body, "gzip", 100) == b"abcd"


@pytest.mark.parametrize(
    ("coding", "body", "limit", "match"),
    [
        ("gzip", b"not gzip at all", 1 << 20, "failed to decompress the gzip request body"),
        ("gzip", gzip.compress(PAYLOAD)[:-12], 1 << 20, "truncated"),
        ("deflate", zlib.compress(PAYLOAD) + b"junk", 1 << 20, "trailing bytes"),
        # Triton's words for a body that inflates past its limit.
        ("gzip", gzip.compress(b"\0" * 100_000), 1000,
         "^Decompressed data size exceeds the maximum allowed value of 1000 bytes. Use --http-max-input-size"),
    ],
)
def test_bad_compressed_bodies(coding: str, body: bytes, limit: int, match: str) -> None:
    with pytest.raises(ConveyorError, match=match) as err:
        compression.decompress(body, coding, limit)
    assert err.value.status == Status.INVALID_ARG


def test_request_codings() -> None:
    assert compression.request_coding(None) is None
    assert compression.request_coding("identity") is None
    assert compression.request_coding(" GZIP ") == "gzip"
    with pytest.raises(ConveyorError, match="unsupported Content-Encoding 'br'") as err:
        compression.request_coding("br")
    assert err.value.status == Status.UNSUPPORTED


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        (None, None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),  # aiohttp's default: ties go to the first
        ("deflate;q=0.5, gzip;q=0.8", "gzip"),
        ("gzip;q=0.2, identity", None),
        ("gzip;q=0", None),
        ("br, deflate;q=0.1", "deflate"),
        ("*", None),
    ],
)
def test_response_coding_negotiation(accept: str | None, coding: str | None) -> None:
    assert compression.response_coding(accept) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_response_parsed_by_tritonclient(coding: str) -> None:
    x = np.arange(1000, dtype=np.int32)
    result, _ = result_of([output("X", "INT32", x), output("Y", "INT32", x[:3])])
    resp = build_infer_response(result, request_for({"X": True, "Y": False}))
    body = compression.compress([resp.body], coding)
    assert len(body) < len(resp.body)
    parsed = Client.parse_response_body(body, header_length=resp.header_length, content_encoding=coding)
    np.testing.assert_array_equal(parsed.as_numpy("X"), x)
    assert parsed.as_numpy("Y").tolist() == [0, 1, 2]


def test_compress_parts_equals_whole() -> None:
    parts = [b"abc", memoryview(b"def"), b"ghi"]
    assert gzip.decompress(compression.compress(parts, "gzip")) == b"abcdefghi"  # type: ignore[arg-type]
    assert zlib.decompress(compression.compress(parts, "deflate")) == b"abcdefghi"  # type: ignore[arg-type]
