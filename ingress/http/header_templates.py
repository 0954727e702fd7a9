"""HTTP infer requests whose JSON header was seen before (``call_templates.py``).

The key is the header's bytes: the whole body when no binary data follows (inputs
in client shared memory). Binary inputs lie one after the other behind the
header, in the order of the inputs, each as long as its ``binary_data_size``
says (the codec's layout): a template keeps where each one lies, and a body
whose length does not match it is parsed afresh, so that it gets the codec's
error. Headers longer than ``MAX_HEADER_BYTES``, and those whose inputs carry
JSON data (``call_templates.template_of``), are parsed every time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from conveyor.ingress.call_templates import MAX_TEMPLATES, CallTemplate, TemplateCache, template_of
from conveyor.ingress.http.codec import AnswerLayout, HttpInferRequest, parse_infer_request

MAX_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class HeaderTemplate:
    call: CallTemplate
    spans: tuple[tuple[int, int], ...]  # each binary input's bytes in the body
    binary_default: bool
    binary: dict[str, bool]
    body_bytes: int  # the header plus every binary input
    layout: AnswerLayout = field(default_factory=AnswerLayout)  # its requests' last answer (``codec``)

    def request(self, view: memoryview, model: str, version: str) -> HttpInferRequest:
        call = self.call.call(model, version, [view[start:end] for start, end in self.spans])
        return HttpInferRequest(call, self.binary_default, self.binary, self.layout)


class HeaderTemplates:
    """The HTTP ingress's templates, by header bytes."""

    def __init__(self, capacity: int = MAX_TEMPLATES) -> None:
        self._cache: TemplateCache[bytes, HeaderTemplate] = TemplateCache(capacity)

    def parse(self, body: bytes | bytearray | memoryview, model: str, version: str,
              header_length: int | None) -> HttpInferRequest:
        """``parse_infer_request``'s result, made from a template when the header was seen before."""
        end = len(body) if header_length is None else header_length
        if not 0 < end <= min(MAX_HEADER_BYTES, len(body)):
            return parse_infer_request(body, model, version, header_length)  # with the codec's error, if any
        view = memoryview(body)
        if isinstance(body, bytes):  # the usual body: a slice is one copy, no memoryview of the header made first
            key = body if end == len(body) else body[:end]
        else:
            key = bytes(view[:end])
        template = self._cache.get(key)
        if template is not None and template.body_bytes == view.nbytes:
            return template.request(view, model, version)
        request = parse_infer_request(view, model, version, header_length)
        sources = [inp.data for inp in request.call.inputs if isinstance(inp.data, memoryview)]
        call = template_of(request.call, sources)
        if call is not None:
            spans, offset = [], end
            for data in sources:
                spans.append((offset, offset + data.nbytes))
                offset += data.nbytes
            # A copy of ``binary``: the first request goes on with the codec's own.
            template = HeaderTemplate(call, tuple(spans), request.binary_default, dict(request.binary), view.nbytes)
            self._cache.put(key, template)
            request.call.shape_key = call
            request.layout = template.layout
        return request
