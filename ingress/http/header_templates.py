"""Binary infer requests whose JSON header was seen before, parsed once.

A client that sends binary tensors sends the same JSON header again and again:
tritonclient and perf_analyzer write the same names, datatypes, shapes and
``binary_data_size`` values for every request of a given shape, and only the
bytes after the header change. ``HeaderTemplates`` keeps what the codec made of
such a header, keyed by its bytes, and makes the next request with those bytes
from it: no JSON parse and none of the codec's checks, only views of the new
body. The template is also the request's ``InferCall.shape_key``: the data
plane keeps the verdict of its signature checks per template
(``ModelSignature.verdicts``), so those are skipped too.

Only headers that the codec parsed without error and whose inputs all travel as
binary data or in client shared memory become templates (JSON data would be
arrays to copy per request); a body whose length does not match the template's
sizes is parsed afresh, so it gets the codec's error. The cache is small and
cleared when full: a client that puts a fresh ``id`` in every header only pays
for a dictionary miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.http.codec import HttpInferRequest, parse_infer_request
from conveyor.ingress.request_checks import InferInput, RequestedOutput
from conveyor.ingress.shm_params import ShmPlacement

MAX_TEMPLATES = 256
MAX_HEADER_BYTES = 4096  # longer headers carry JSON data, or are rare: parsed every time


@dataclass(frozen=True, slots=True)
class TemplateInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    shm: ShmPlacement | None
    start: int  # where its bytes lie in the body (binary inputs)
    end: int


@dataclass(frozen=True, slots=True, eq=False)
class HeaderTemplate:
    """What the codec made of one JSON header; compared and hashed by identity (a shape key)."""

    inputs: tuple[TemplateInput, ...]
    outputs: tuple[RequestedOutput, ...] | None
    request_id: str
    parameters: dict[str, Any]
    binary_default: bool
    binary: dict[str, bool]
    body_bytes: int  # the header plus every binary input

    def request(self, view: memoryview, model: str, version: str) -> HttpInferRequest:
        inputs = [
            InferInput(t.name, t.datatype, list(t.shape), None if t.shm else view[t.start : t.end],
                       dict(t.parameters) if t.parameters else {}, t.shm)
            for t in self.inputs
        ]
        outputs = None if self.outputs is None else list(self.outputs)
        parameters = dict(self.parameters) if self.parameters else {}  # header forwarding adds to it
        call = InferCall(model, version, inputs, outputs, self.request_id, parameters, shape_key=self)
        return HttpInferRequest(call, self.binary_default, self.binary)


def template_of(request: HttpInferRequest, header_length: int, body_bytes: int) -> HeaderTemplate | None:
    """``request``'s template, or None when a later request could not be made from it. Binary
    inputs lie one after the other behind the header, in the order of the inputs (the codec's layout)."""
    inputs: list[TemplateInput] = []
    offset = header_length
    for inp in request.call.inputs:
        if inp.from_json:
            return None
        if inp.shm is not None:
            inputs.append(TemplateInput(inp.name, inp.datatype, tuple(inp.shape), dict(inp.parameters), inp.shm, 0, 0))
            continue
        if not isinstance(inp.data, memoryview):
            return None
        end = offset + inp.data.nbytes
        inputs.append(TemplateInput(inp.name, inp.datatype, tuple(inp.shape), dict(inp.parameters), None, offset, end))
        offset = end
    call = request.call
    outputs = None if call.outputs is None else tuple(call.outputs)
    # Copies: the first request goes on with the codec's own, and may add to its parameters.
    return HeaderTemplate(tuple(inputs), outputs, call.id, dict(call.parameters), request.binary_default,
                          dict(request.binary), body_bytes)


class HeaderTemplates:
    """The HTTP ingress's templates (one per process: the event loop is its only user)."""

    def __init__(self, capacity: int = MAX_TEMPLATES) -> None:
        self.capacity = capacity
        self._by_header: dict[bytes, HeaderTemplate] = {}

    def parse(self, body: bytes | bytearray | memoryview, model: str, version: str,
              header_length: int | None) -> HttpInferRequest:
        """``parse_infer_request``'s result, made from a template when the header was seen before."""
        if header_length is None or not 0 < header_length <= MAX_HEADER_BYTES:
            return parse_infer_request(body, model, version, header_length)
        view = memoryview(body)
        key = bytes(view[:header_length])
        template = self._by_header.get(key)
        if template is not None and template.body_bytes == view.nbytes:
            return template.request(view, model, version)
        request = parse_infer_request(view, model, version, header_length)
        template = template_of(request, header_length, view.nbytes)
        if template is not None:
            if len(self._by_header) >= self.capacity:
                self._by_header.clear()
            self._by_header[key] = template
            request.call.shape_key = template
        return request
