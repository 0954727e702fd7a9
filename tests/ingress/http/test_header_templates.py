"""Binary requests whose JSON header was seen before are made from its template:
the same request as the codec's, over the new body's bytes, and the codec's
errors whenever the body does not fit the template."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
import tritonclient.http as th

from conveyor.ingress.dataplane import InferResult, OutputTensor
from conveyor.ingress.http.codec import HttpInferRequest, build_infer_response, parse_infer_request
from conveyor.ingress.http.header_templates import HeaderTemplates
from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.shm.arena import RELEASED, Arena
from conveyor.shm.naming import segment_name
from conveyor.shm.regions import RegionCache

LEVEL = "unit"


def tritonclient_body(a: np.ndarray, b: np.ndarray, **kwargs: Any) -> tuple[bytes, int | None]:
    inputs = [th.InferInput("INPUT0", list(a.shape), "INT32"), th.InferInput("INPUT1", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=True), th.InferRequestedOutput("OUTPUT1")]
    body, length = th.InferenceServerClient.generate_request_body(inputs, outputs, **kwargs)
    return bytes(body), length


def same(a: HttpInferRequest, b: HttpInferRequest) -> None:
    """Equal requests: the same call, tensors compared by their bytes."""
    ca, cb = a.call, b.call
    assert (ca.model, ca.version, ca.id, ca.parameters) == (cb.model, cb.version, cb.id, cb.parameters)
    assert [(i.name, i.datatype, i.shape, i.parameters, i.shm, i.data and bytes(i.data)) for i in ca.inputs] == [
        (i.name, i.datatype, i.shape, i.parameters, i.shm, i.data and bytes(i.data)) for i in cb.inputs
    ]
    assert ca.outputs == cb.outputs
    assert (a.binary_default, a.binary) == (b.binary_default, b.binary)


def test_a_repeated_header_gives_the_codecs_request_over_the_new_bytes() -> None:
    templates = HeaderTemplates()
    rng = np.random.default_rng(0)
    keys = set()
    for _ in range(3):
        a, b = (rng.integers(-100, 100, (1, 16), dtype=np.int32) for _ in range(2))
        body, length = tritonclient_body(a, b, request_id="r1", parameters={"p": 1})
        got = templates.parse(body, "simple", "2", length)
        same(got, parse_infer_request(body, "simple", "2", length))
        assert np.array_equal(np.frombuffer(got.call.inputs[0].data, np.int32), a.ravel())  # type: ignore[arg-type]
        keys.add(got.call.shape_key)
    assert len(keys) == 1 and None not in keys  # the 2nd and 3rd came from the 1st's template


def test_each_request_owns_what_it_may_change() -> None:
    templates = HeaderTemplates()
    a = np.ones((1, 16), np.int32)
    body, length = tritonclient_body(a, a, parameters={"p": 1})
    first = templates.parse(body, "simple", "", length)
    first.call.parameters["forwarded"] = "x"  # header forwarding adds to a request's parameters
    first.call.inputs[0].shape[0] = 99
    second = templates.parse(body, "simple", "", length)
    assert second.call.parameters == {"p": 1}
    assert second.call.inputs[0].shape == [1, 16]


def test_a_body_that_does_not_fit_the_template_gets_the_codecs_error() -> None:
    templates = HeaderTemplates()
    a = np.ones((1, 16), np.int32)
    body, length = tritonclient_body(a, a)
    templates.parse(body, "simple", "", length)
    with pytest.raises(ConveyorError, match="expecting 4 additional bytes"):
        templates.parse(body[:-4], "simple", "", length)
    with pytest.raises(ConveyorError, match="unexpected additional input data"):
        templates.parse(body + b"1234", "simple", "", length)
    assert templates.parse(body, "simple", "", length).call.shape_key is not None  # the template is still there


def test_json_data_is_parsed_every_time() -> None:
    templates = HeaderTemplates()
    doc = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}
    header = orjson.dumps(doc)
    for length in (None, len(header)):
        for _ in range(2):
            assert templates.parse(header, "m", "", length).call.shape_key is None


def test_a_full_cache_starts_over() -> None:
    templates = HeaderTemplates(capacity=2)
    a = np.ones((1, 16), np.int32)
    bodies = [tritonclient_body(a, a, request_id=str(i)) for i in range(3)]
    for body, length in bodies:
        templates.parse(body, "simple", "", length)
    assert len(templates._cache) == 1  # cleared at the third
    body, length = bodies[2]
    assert templates.parse(body, "simple", "", length).call.shape_key is not None


def test_requests_naming_client_shared_memory_are_made_from_templates() -> None:
    """A JSON-only body (every input in client shared memory) is its own key; a body with a
    binary input behind its header keeps the placement in the header's template."""
    templates = HeaderTemplates()
    x = th.InferInput("INPUT0", [1, 16], "INT32")
    x.set_shared_memory("in_region", 64)
    y = th.InferInput("INPUT1", [1, 16], "INT32")
    y.set_data_from_numpy(np.ones((1, 16), np.int32))
    out = th.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out_region", 64)
    for inputs, outputs in (([x, y], None), ([x], [out])):
        body, length = th.InferenceServerClient.generate_request_body(inputs, outputs)
        json_only = length is None or length == len(body)
        for header_length in {length, None} if json_only else {length}:
            keys = set()
            for _ in range(2):
                request = templates.parse(bytes(body), "simple", "", header_length)
                same(request, parse_infer_request(bytes(body), "simple", "", header_length))
                assert request.call.inputs[0].shm is not None
                keys.add(request.call.shape_key)
            assert len(keys) == 1 and None not in keys


# --- answers: the template's last answer's layout (``codec.AnswerLayout``) --------------------------------


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(segment_name(f"l{os.getpid()}", "test"), 1 << 16)
    yield arena
    arena.close()


def binary_request(templates: HeaderTemplates, *, binary: bool = True) -> HttpInferRequest:
    a = np.ones((1, 16), np.int32)
    inputs = [th.InferInput("INPUT0", [1, 16], "INT32"), th.InferInput("INPUT1", [1, 16], "INT32")]
    for x in inputs:
        x.set_data_from_numpy(a)
    outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=True),
               th.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    body, length = th.InferenceServerClient.generate_request_body(inputs, outputs)
    templates.parse(bytes(body), "simple", "", length)
    return templates.parse(bytes(body), "simple", "", length)


def answer_in(arena: Arena, values: list[np.ndarray], flag: int, **fields: Any) -> m.InferResponse:
    """A worker's answer: ``values`` as OUTPUT0, OUTPUT1... in ``arena``, released through byte ``flag``."""
    outputs = []
    for i, value in enumerate(values):
        raw = value.tobytes()
        start = arena.alloc(max(len(raw), 1))
        arena.put(start, raw)
        outputs.append(m.TensorRef(f"OUTPUT{i}", "INT32", list(value.shape), arena.name, start, len(raw)))
    arena.array[flag] = 0
    response = m.InferResponse(1, "simple", "1", outputs, release=[m.Release(arena.name, flag)])
    return msgspec.structs.replace(response, **fields)


def result_of(response: m.InferResponse, regions: RegionCache) -> InferResult:
    """``DataPlane.result``'s result (no client regions here)."""
    outputs = [OutputTensor(t.name, t.datatype, t.shape, regions.view(t.region, t.offset, t.nbytes))
               for t in response.outputs]
    return InferResult(response.model, response.version, "", outputs, response.parameters, response.release, regions)


def test_an_answer_laid_out_as_the_last_one_is_the_codecs_over_its_own_bytes(arena: Arena) -> None:
    regions = RegionCache()
    request = binary_request(HeaderTemplates())
    layout = request.layout
    assert layout is not None
    rng = np.random.default_rng(1)
    first = answer_in(arena, [rng.integers(0, 99, (1, 16), dtype=np.int32) for _ in range(2)], 0)
    rendered = build_infer_response(result_of(first, regions), request)
    assert layout.body(first, regions) is None  # nothing kept yet
    assert layout.keep(first, result_of(first, regions), request, rendered)
    assert layout.body(first, regions) is None  # no head lines yet: the transport sets them
    layout.head = b"lines"
    for flag in range(1, 4):
        values = [rng.integers(0, 99, (1, 16), dtype=np.int32) for _ in range(2)]
        again = answer_in(arena, values, flag)
        expected = build_infer_response(result_of(answer_in(arena, values, 100), regions), request).body
        assert layout.body(again, regions) == expected
        assert arena.array[flag] == RELEASED
        parsed = th.InferenceServerClient.parse_response_body(expected, header_length=len(rendered.body) - 128)
        assert np.array_equal(parsed.as_numpy("OUTPUT1"), values[1])


def test_an_answer_laid_out_otherwise_is_rendered_afresh(arena: Arena) -> None:
    regions = RegionCache()
    request = binary_request(HeaderTemplates())
    layout = request.layout
    assert layout is not None
    a = np.ones((1, 16), np.int32)
    first = answer_in(arena, [a, a], 0)
    assert layout.keep(first, result_of(first, regions), request, build_infer_response(result_of(first, regions),
                                                                                     request))
    layout.head = b"lines"
    others = [
        answer_in(arena, [a, a], 1, model="simple_two_instances"),
        answer_in(arena, [a, a], 1, version="2"),
        answer_in(arena, [a, a], 1, parameters={"p": 1}),
        answer_in(arena, [a, a.reshape(2, 8)], 1),  # the same size, another shape
        answer_in(arena, [a, np.ones((1, 8), np.int32)], 1),
        answer_in(arena, [a], 1),
        answer_in(arena, [a, a, a], 1),
    ]
    renamed = answer_in(arena, [a, a], 1)
    renamed.outputs[1] = msgspec.structs.replace(renamed.outputs[1], name="OUTPUT9")
    client = answer_in(arena, [a, a], 1)
    client.outputs[1] = msgspec.structs.replace(client.outputs[1], region=m.CLIENT_REGION_PREFIX + "r")
    for response in [*others, renamed, client]:
        assert layout.body(response, regions) is None
        assert arena.array[1] == 0  # not released: the codec's path does it
    assert layout.body(answer_in(arena, [a, a], 1), regions) is not None


def test_answers_with_json_data_or_parameters_are_not_kept(arena: Arena) -> None:
    regions = RegionCache()
    a = np.ones((1, 16), np.int32)
    json_request = binary_request(HeaderTemplates(), binary=False)
    first = answer_in(arena, [a, a], 0)
    assert json_request.layout is not None
    assert not json_request.layout.keep(first, result_of(first, regions), json_request,
                                        build_infer_response(result_of(first, regions), json_request))
    request = binary_request(HeaderTemplates())
    assert request.layout is not None
    hinted = result_of(first, regions)
    hinted.parameters = {"conveyor_host": "h"}  # the routing hint of a sequence request
    assert not request.layout.keep(first, hinted, request, build_infer_response(result_of(first, regions), request))
