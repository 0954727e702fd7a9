"""Property-based tests of the gRPC parsers: a ModelInferRequest that lies (raw
contents that do not match its inputs, typed contents of the wrong kind, shapes
and parameters of any value) or bytes that are not a protobuf message at all are
refused with the protocol's status, never UNKNOWN or INTERNAL.

Two levels: the codec and data plane without sockets (many cases), and a real
grpc.aio server over loopback with a fake router behind a real data plane.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc import codec, wire
from conveyor.ingress.grpc.handlers import Malformed, lenient
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto.datatypes import DATATYPES
from conveyor.proto.errors import ConveyorError
from tests.fuzz import bounded, tried
from tests.fuzz_data_plane import INPUTS, data_plane, send

parse = lenient(wire.parse_infer_request)

# --- strategies ---------------------------------------------------------------------

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


@st.composite
def infer_requests(draw: st.DrawFn) -> bytes:
    """A serialized ModelInferRequest whose parts may disagree with each other."""
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
    return buf


def valid_request(draw: st.DrawFn, request: Any) -> bytes:
    """A request the model accepts, as tritonclient sends it (raw contents), maybe with one lie."""
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
        at = draw(st.integers(0, len(raw) - 1))
        raw[at] = raw[at][: max(len(raw[at]) - 1, 0)]  # a tensor one byte short
    elif lie == 4:
        request.inputs[0].contents.fp32_contents.extend([1.0])  # contents beside raw contents
    request.raw_input_contents.extend(raw)
    return request.SerializeToString()  # type: ignore[no-any-return]


# --- codec and data plane -------------------------------------------------------------


def accepted_or_refused(buf: bytes) -> bool:
    request = parse(buf)
    if isinstance(request, Malformed):
        event("malformed protobuf")
        assert "failed to parse" in request.error("ModelInfer").message
        return False
    try:
        call = codec.to_infer_call(request.message, request.raw)
    except ConveyorError:
        event("refused by the codec")
        return False
    with data_plane(max_input_elements=1 << 16) as plane:
        try:
            send(plane, call)
        except ConveyorError:
            event("refused by the data plane")
            return False
    event("accepted")
    return True


@bounded(400)
@given(infer_requests())
def test_infer_requests_that_lie_are_refused(buf: bytes) -> None:
    tried("grpc ModelInferRequest")
    accepted_or_refused(buf)


@bounded(200)
@given(st.binary(max_size=96))
def test_arbitrary_bytes_are_malformed_or_refused(buf: bytes) -> None:
    tried("grpc arbitrary bytes")
    accepted_or_refused(buf)


# --- over loopback ----------------------------------------------------------------------

ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS}


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    """A gRPC ingress (real servicer and data plane, fake router) on its own loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with data_plane() as plane:
        ctx = SimpleNamespace(link=plane.link, dataplane=plane, drain=IngressDrain())
        server, port = asyncio.run_coroutine_threadsafe(start_server(ctx, "127.0.0.1", 0), loop).result(30)  # type: ignore[arg-type]
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as chan:
                yield chan
        finally:
            asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def call_status(channel: grpc.Channel, method: str, buf: bytes) -> grpc.StatusCode:
    rpc = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
    try:
        rpc(buf, timeout=30)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_a_malformed_message_is_invalid_argument(channel: grpc.Channel) -> None:
    # Field 1 (model_name) claims 100 bytes that are not there.
    for method in ("ModelInfer", "ModelMetadata", "SystemSharedMemoryRegister", "RepositoryModelLoad"):
        assert call_status(channel, method, b"\x0a\x64abc") == grpc.StatusCode.INVALID_ARGUMENT, method
    health = channel.unary_unary("/grpc.health.v1.Health/Check")
    with pytest.raises(grpc.RpcError) as err:
        health(b"\x0a\x64abc", timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_malformed_message_on_a_stream_is_an_in_band_error(channel: grpc.Channel) -> None:
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
    replies = list(stream(iter([b"\x0a\x64abc", b"\x0a\x01m"]), timeout=30))
    first, second = (pb.ModelStreamInferResponse.FromString(r) for r in replies)
    assert "failed to parse the ModelStreamInfer request message" in first.error_message
    assert second.error_message  # the stream went on: the next request got its own answer


@bounded(120)
@given(infer_requests() | st.binary(max_size=64),
       st.sampled_from(["ModelInfer", "ModelInfer", "ModelMetadata", "ModelConfig", "SystemSharedMemoryRegister",
                        "CudaSharedMemoryRegister", "RepositoryModelLoad", "ModelStatistics"]))
def test_every_rpc_answers_a_protocol_status(channel: grpc.Channel, buf: bytes, method: str) -> None:
    tried("grpc loopback rpc")
    code = call_status(channel, method, buf)
    event(f"{method}: {code.name}")
    assert code in ALLOWED, code
