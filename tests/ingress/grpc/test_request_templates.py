"""gRPC infer requests whose description was seen before are made from its template:
the codec's call over the new raw tensors, and the codec's errors whenever the raw
tensors do not fit it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as tg

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.grpc import codec
from conveyor.ingress.grpc.request_templates import RequestTemplates
from conveyor.ingress.grpc.wire import SPLIT_MIN_BYTES, parse_infer_request
from conveyor.proto.errors import ConveyorError
from tests.ingress.grpc.test_grpc_codec import client_request, typed_request

LEVEL = "unit"


def wire(a: np.ndarray, b: np.ndarray, **kw: Any) -> bytes:
    inputs = [tg.InferInput("INPUT0", list(a.shape), "INT32"), tg.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client_request(inputs, [tg.InferRequestedOutput("OUTPUT0")], **kw)


def by_templates(templates: RequestTemplates, buf: bytes) -> InferCall:
    req = parse_infer_request(buf)
    return templates.call(req.message, req.raw, timeout_s=2.0)


def by_codec(buf: bytes) -> InferCall:
    req = parse_infer_request(buf)
    return codec.to_infer_call(req.message, req.raw, timeout_s=2.0)


def same(a: InferCall, b: InferCall) -> None:
    assert (a.model, a.version, a.id, a.parameters, a.timeout_s, a.outputs) == (
        b.model, b.version, b.id, b.parameters, b.timeout_s, b.outputs)
    assert [(i.name, i.datatype, i.shape, i.parameters, i.shm, i.data and bytes(i.data)) for i in a.inputs] == [
        (i.name, i.datatype, i.shape, i.parameters, i.shm, i.data and bytes(i.data)) for i in b.inputs]


@pytest.mark.parametrize("elements", [16, SPLIT_MIN_BYTES // 4])  # a message protobuf parses whole, one split
def test_a_repeated_description_gives_the_codecs_call_over_the_new_tensors(elements: int) -> None:
    templates = RequestTemplates()
    rng = np.random.default_rng(1)
    keys = set()
    for _ in range(3):
        a, b = (rng.integers(-9, 9, (1, elements), dtype=np.int32) for _ in range(2))
        buf = wire(a, b, request_id="x", priority=3)
        got = by_templates(templates, buf)
        same(got, by_codec(buf))
        assert np.array_equal(np.frombuffer(got.inputs[1].data, np.int32), b.ravel())  # type: ignore[arg-type]
        keys.add(got.shape_key)
    assert len(keys) == 1 and None not in keys


def test_each_call_owns_what_it_may_change() -> None:
    templates = RequestTemplates()
    a = np.ones((1, 16), np.int32)
    first = by_templates(templates, wire(a, a, priority=3))
    first.parameters["forwarded"] = "x"  # header forwarding adds to a call's parameters
    first.inputs[0].shape[1] = 99
    second = by_templates(templates, wire(a, a, priority=3))
    assert second.parameters == {"priority": 3}
    assert second.inputs[0].shape == [1, 16]


def test_other_raw_sizes_are_another_description() -> None:
    templates = RequestTemplates()
    a = np.ones((1, 16), np.int32)
    by_templates(templates, wire(a, a))
    inputs = [tg.InferInput("INPUT0", [1, 16], "INT32"), tg.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    req = parse_infer_request(client_request(inputs, [tg.InferRequestedOutput("OUTPUT0")]))
    raw = [req.raw[0], bytes(req.raw[1])[:8]]  # the same message, a short second tensor
    call = templates.call(req.message, raw)
    assert call.shape_key is not by_templates(templates, wire(a, a)).shape_key
    assert len(call.inputs[1].data) == 8  # type: ignore[arg-type]  # the data plane's checks refuse it


def test_a_malformed_request_is_refused_every_time() -> None:
    templates = RequestTemplates()
    a = np.ones((1, 16), np.int32)
    req = parse_infer_request(wire(a, a))
    for _ in range(2):
        with pytest.raises(ConveyorError, match="raw_input_contents holds 1 tensor"):
            templates.call(req.message, req.raw[:1])


def test_requests_naming_client_shared_memory_are_made_from_templates() -> None:
    """The placement is part of the description: the same region, offset and size give the
    template's call, another offset is another description."""
    templates = RequestTemplates()
    x = tg.InferInput("INPUT0", [1, 16], "INT32")
    x.set_shared_memory("in_region", 64)
    y = tg.InferInput("INPUT1", [1, 16], "INT32")
    y.set_data_from_numpy(np.ones((1, 16), np.int32))
    out = tg.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out_region", 64)
    for inputs, outputs in (([x, y], None), ([y], [out]), ([x], [out])):
        keys = set()
        for _ in range(2):
            buf = client_request(inputs, outputs)
            call = by_templates(templates, buf)
            same(call, by_codec(buf))
            keys.add(call.shape_key)
        assert len(keys) == 1 and None not in keys
    x.set_shared_memory("in_region", 64, offset=64)
    moved = by_templates(templates, client_request([x], [out]))
    assert moved.inputs[0].shm is not None and moved.inputs[0].shm.offset == 64


def test_typed_contents_are_converted_every_time() -> None:
    templates = RequestTemplates()
    buf = typed_request("INT32", "int_contents", [1, 2]).SerializeToString()
    for _ in range(2):
        call = by_templates(templates, buf)
        assert call.shape_key is None
        assert np.array_equal(call.inputs[0].data, [1, 2])  # type: ignore[arg-type]
    assert len(templates._cache) == 0
