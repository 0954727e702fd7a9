"""Hypothesis strategies for gRPC ``ModelInferRequest`` messages whose parts may disagree
with each other, labelled with what the data plane must do with them (the fuzz tests of
the gRPC parsers and of a running group)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from conveyor.ingress.grpc import wire
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto.datatypes import DATATYPES
from tests.support.fuzz_data_plane import INPUTS

int64s = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
small_dims = st.integers(min_value=-2, max_value=5) | st.sampled_from([1 << 40, (1 << 63) - 1])
datatypes = st.sampled_from(sorted(DATATYPES)) | st.text(max_size=5)
_CONTENTS = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(min_value=-(1 << 31), max_value=(1 << 31) - 1),
    "int64_contents": int64s,
    "uint_contents": st.integers(min_value=0, max_value=(1 << 32) - 1),
    "uint64_contents": st.integers(min_value=0, max_value=(1 << 64) - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}


@st.composite
def parameters(draw: st.DrawFn, target: Any, keys: list[str]) -> None:
    for key in draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        param = target[key]
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param",
                                     "uint64_param", "none"]))
        if kind == "bool_param":
            param.bool_param = draw(st.booleans())
        elif kind == "int64_param":
            param.int64_param = draw(int64s | st.integers(-2, 64))
        elif kind == "string_param":
            param.string_param = draw(st.sampled_from(["r", "", "x" * 40]))
        elif kind == "double_param":
            param.double_param = draw(st.floats())
        elif kind == "uint64_param":
            param.uint64_param = draw(st.integers(min_value=0, max_value=(1 << 64) - 1))


def infer_requests() -> st.SearchStrategy[bytes]:
    """A serialized ModelInferRequest whose parts may disagree with each other."""
    return labelled_infer_requests().map(lambda case: case[0])


@st.composite
def labelled_infer_requests(draw: st.DrawFn) -> tuple[bytes, bool | None]:
    """A serialized ModelInferRequest, and whether the model must accept it: True for an
    honest request, False for one that lies about its own parts, None where the parts were
    drawn at random (and may, rarely, agree)."""
    request = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=3)))
    if draw(st.booleans()):
        return valid_request(draw, request)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([*INPUTS, "nope"]))
        tensor = request.inputs.add(name=name, datatype=draw(datatypes),
                                    shape=draw(st.lists(small_dims, max_size=3)))
        if draw(st.integers(0, 2)) == 0:
            field = draw(st.sampled_from(sorted(_CONTENTS)))
            getattr(tensor.contents, field).extend(draw(st.lists(_CONTENTS[field], max_size=6)))
        if draw(st.integers(0, 3)) == 0:
            draw(parameters(tensor.parameters, ["shared_memory_region", "shared_memory_byte_size",
                                                "shared_memory_offset", "binary_data_size", "x"]))
    raw = draw(st.lists(st.binary(max_size=24), max_size=4))
    if draw(st.integers(0, 9)) == 0:
        raw.append(bytes(wire.SPLIT_MIN_BYTES))  # large enough for the zero-copy split path
    request.raw_input_contents.extend(raw)
    for _ in range(draw(st.integers(0, 2))):
        request.outputs.add(name=draw(st.sampled_from(["Y", "F", ""])))
        if draw(st.booleans()):
            draw(parameters(request.outputs[-1].parameters, ["classification", "binary_data",
                                                             "shared_memory_region"]))
    draw(parameters(request.parameters, ["sequence_id", "priority", "timeout", "triton_x",
                                         "triton_enable_empty_final_response", "custom"]))
    buf = request.SerializeToString()
    mutation = draw(st.integers(0, 5))
    if mutation == 1 and buf:  # truncated
        buf = buf[: draw(st.integers(0, len(buf) - 1))]
    elif mutation == 2 and buf:  # one byte changed
        at = draw(st.integers(0, len(buf) - 1))
        buf = buf[:at] + bytes([draw(st.integers(0, 255))]) + buf[at + 1 :]
    elif mutation == 3:  # junk appended
        buf += draw(st.binary(min_size=1, max_size=8))
    return buf, None


def valid_request(draw: st.DrawFn, request: Any) -> tuple[bytes, bool]:
    """A request the model accepts, as tritonclient sends it (raw contents), maybe with one
    lie; and whether it told none."""
    batch, n = draw(st.integers(1, 4)), draw(st.integers(0, 3))
    request.inputs.add(name="F", datatype="FP32", shape=[batch, n])
    raw = [bytes(4 * batch * n)]
    if draw(st.booleans()):
        request.inputs.add(name="S", datatype="BYTES", shape=[batch, 1])
        items = draw(st.lists(st.binary(max_size=4), min_size=batch, max_size=batch))
        raw.append(b"".join(len(i).to_bytes(4, "little") + i for i in items))
    lie = draw(st.integers(0, 4))
    if lie == 1:
        raw.append(b"")  # one raw entry too many
    elif lie == 2:
        raw.pop()  # one too few
    elif lie == 3:
        cuttable = [i for i, r in enumerate(raw) if r]
        if cuttable:
            at = draw(st.sampled_from(cuttable))
            raw[at] = raw[at][:-1]  # a tensor one byte short
        else:
            lie = 0  # every tensor is empty: none can be short
    elif lie == 4:
        request.inputs[0].contents.fp32_contents.extend([1.0])  # contents beside raw contents
    request.raw_input_contents.extend(raw)
    return request.SerializeToString(), lie == 0
