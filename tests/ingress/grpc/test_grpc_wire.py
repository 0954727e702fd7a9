"""The zero-copy framing of the infer messages agrees with protobuf's own."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from conveyor.ingress.grpc import wire
from conveyor.proto import grpc_service_pb2 as pb

LEVEL = "unit"


def test_field_numbers_match_the_descriptors() -> None:
    fields = pb.ModelInferRequest.DESCRIPTOR.fields_by_name
    assert fields["raw_input_contents"].number == wire.RAW_INPUT_CONTENTS
    assert pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number == wire.RAW_OUTPUT_CONTENTS
    stream_fields = pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name
    assert stream_fields["infer_response"].number == wire.STREAM_INFER_RESPONSE


@pytest.fixture
def always_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take the walk whatever the size, so small cases exercise it too."""
    monkeypatch.setattr(wire, "SPLIT_MIN_BYTES", 0)


def request(*raw: bytes) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="m", model_version="1", id="abc")
    req.parameters["p"].int64_param = 5
    for i, _ in enumerate(raw):
        t = req.inputs.add(name=f"in{i}", datatype="UINT8", shape=[1, 2])
        t.parameters["q"].string_param = "x"
    req.outputs.add(name="out")
    req.raw_input_contents.extend(raw)
    return req


def without_raw(req: pb.ModelInferRequest) -> pb.ModelInferRequest:
    copy = pb.ModelInferRequest()
    copy.CopyFrom(req)
    copy.ClearField("raw_input_contents")
    return copy


@pytest.mark.usefixtures("always_split")
@pytest.mark.parametrize("sizes", [[], [0], [1, 127, 128], [16384, 3], [1 << 21]])
def test_split_matches_a_full_parse(sizes: list[int]) -> None:
    raw = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    req = request(*raw)
    buf = req.SerializeToString()
    split = wire.parse_infer_request(buf)
    assert split.message == without_raw(req)
    assert [bytes(r) for r in split.raw] == raw
    assert all(r.obj is buf for r in split.raw)  # type: ignore[union-attr]


@pytest.mark.usefixtures("always_split")
def test_raw_contents_anywhere_and_unknown_fields_of_every_wire_type() -> None:
    head = request().SerializeToString()
    raw_field = bytes([wire.RAW_INPUT_CONTENTS << 3 | 2])
    unknown = (
        bytes([99 << 3 & 0x7F | 0x80, 99 >> 4, 0x96, 0x01])  # field 99, varint 150
        + bytes([100 << 3 & 0x7F | 0x80 | 1, 100 >> 4])
        + b"\1" * 8  # 64-bit
        + bytes([101 << 3 & 0x7F | 0x80 | 5, 101 >> 4])
        + b"\2" * 4  # 32-bit
    )
    buf = raw_field + b"\x02ab" + head + raw_field + b"\x00" + unknown + raw_field + b"\x01z"
    split = wire.parse_infer_request(buf)
    assert [bytes(r) for r in split.raw] == [b"ab", b"", b"z"]
    full = pb.ModelInferRequest.FromString(buf)
    assert list(full.raw_input_contents) == [b"ab", b"", b"z"]
    assert split.message == without_raw(full)
    assert split.message.SerializeToString() == without_raw(full).SerializeToString()  # unknown fields kept


@pytest.mark.usefixtures("always_split")
def test_malformed_buffers_are_left_to_protobuf() -> None:
    buf = request(b"abcd").SerializeToString()
    with pytest.raises(DecodeError):
        wire.parse_infer_request(buf[:-2])  # a truncated raw tensor


@pytest.mark.usefixtures("always_split")
def test_only_raw_contents() -> None:
    req = pb.ModelInferRequest(raw_input_contents=[b"xyz"])
    split = wire.parse_infer_request(req.SerializeToString())
    assert split.message == pb.ModelInferRequest()
    assert [bytes(r) for r in split.raw] == [b"xyz"]


def test_large_requests_are_split_without_copies() -> None:
    raw = [b"a" * wire.SPLIT_MIN_BYTES, b"b"]
    buf = request(*raw).SerializeToString()
    split = wire.parse_infer_request(buf)
    assert len(split.message.raw_input_contents) == 0
    assert all(isinstance(r, memoryview) and r.obj is buf for r in split.raw)
    assert [bytes(r) for r in split.raw] == raw


def test_small_requests_are_parsed_by_protobuf() -> None:
    buf = request(b"xy", b"").SerializeToString()
    split = wire.parse_infer_request(buf)
    assert split.message == pb.ModelInferRequest.FromString(buf)
    assert list(split.raw) == [b"xy", b""]


@pytest.mark.parametrize("stream", [False, True])
def test_framed_response_parses_as_protobuf_built_one(stream: bool) -> None:
    tensors = [np.arange(n, dtype=np.uint8) for n in (0, 5, 200, 70000)]
    head = pb.ModelInferResponse(model_name="m", id="i")
    for i, t in enumerate(tensors):
        head.outputs.add(name=f"o{i}", datatype="UINT8", shape=[t.size])
    buf = wire.frame_infer_response(head.SerializeToString(), tensors, stream=stream)
    expected = pb.ModelInferResponse()
    expected.CopyFrom(head)
    expected.raw_output_contents.extend(t.tobytes() for t in tensors)
    if stream:
        assert buf == pb.ModelStreamInferResponse(infer_response=expected).SerializeToString()
    else:
        assert buf == expected.SerializeToString()


@pytest.mark.parametrize(
    ("model", "version", "request_id", "outputs"),
    [
        ("simple", "1", "req-7", [("OUTPUT0", "INT32", [1, 16]), ("OUTPUT1", "INT32", [1, 16])]),
        ("m", "", "", [("scalar", "FP32", [])]),  # empty strings and shape are not written
        ("é-model", "12", "x" * 300, [("o", "BYTES", [0, 3, 1 << 40, -1])]),  # long id, big/negative dims
        ("m", "1", "i", []),
    ],
)
def test_response_head_is_what_protobuf_writes(
    model: str, version: str, request_id: str, outputs: list[tuple[str, str, list[int]]]
) -> None:
    expected = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    for name, datatype, shape in outputs:
        expected.outputs.add(name=name, datatype=datatype, shape=shape)
    for _ in range(2):  # the second time from the cache
        assert wire.infer_response_head(model, version, request_id, outputs) == expected.SerializeToString()


def test_response_head_places_the_parameters_where_protobuf_does() -> None:
    params = pb.ModelInferResponse()
    params.parameters["flag"].bool_param = True
    expected = pb.ModelInferResponse(model_name="m", id="i")
    expected.parameters["flag"].bool_param = True
    expected.outputs.add(name="o", datatype="UINT8", shape=[2])
    head = wire.infer_response_head("m", "", "i", [("o", "UINT8", [2])], params.SerializeToString())
    assert head == expected.SerializeToString()
