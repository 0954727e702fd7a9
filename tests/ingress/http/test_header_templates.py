"""Binary requests whose JSON header was seen before are made from its template:
the same request as the codec's, over the new body's bytes, and the codec's
errors whenever the body does not fit the template."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as th

from conveyor.ingress.http.codec import HttpInferRequest, parse_infer_request
from conveyor.ingress.http.header_templates import HeaderTemplates
from conveyor.proto.errors import ConveyorError


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
