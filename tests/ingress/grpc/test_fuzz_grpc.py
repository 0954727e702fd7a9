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

import grpc
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.grpc import codec, wire
from conveyor.ingress.grpc.handlers import Malformed, lenient
from conveyor.ingress.grpc.server import start_server
from conveyor.proto import grpc_service_pb2 as pb
from conveyor.proto.errors import ConveyorError
from tests.support.fuzz import bounded, tried
from tests.support.fuzz_data_plane import data_plane, send
from tests.support.fuzz_grpc_requests import infer_requests, labelled_infer_requests

LEVEL = "unit"

parse = lenient(wire.parse_infer_request)

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
@given(labelled_infer_requests())
def test_infer_requests_that_lie_are_refused(case: tuple[bytes, bool | None]) -> None:
    tried("grpc ModelInferRequest")
    buf, honest = case
    accepted = accepted_or_refused(buf)
    if honest is not None:
        assert accepted == honest, "an honest request refused" if honest else "a request that lies accepted"


@bounded(200)
@given(st.binary(max_size=96))
def test_arbitrary_bytes_are_malformed_or_refused(buf: bytes) -> None:
    tried("grpc arbitrary bytes")
    assert not accepted_or_refused(buf), "random bytes made a request the model accepts"


# --- over loopback ----------------------------------------------------------------------

ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS}


@pytest.fixture(scope="module", params=["grpcio", "h2", "ngh2"])
def channel(request: pytest.FixtureRequest) -> Iterator[grpc.Channel]:
    """A gRPC ingress (real servicer and data plane, fake router) on its own loop thread, each server."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    with data_plane() as plane:
        ctx = SimpleNamespace(link=plane.link, dataplane=plane, drain=IngressDrain())
        server, port = asyncio.run_coroutine_threadsafe(
            start_server(ctx, "127.0.0.1", 0, implementation=request.param), loop  # type: ignore[arg-type]
        ).result(30)
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
        return err.code()
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
