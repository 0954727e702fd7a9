"""gRPC infer requests whose description was seen before (``call_templates.py``).

The key is the ``ModelInferRequest`` without its raw contents, serialized, with
the length of each raw tensor. Not deterministically: that costs ten times more
(about 5 µs here), and any serialization names one description only (it parses
back to it). The same bytes parse to maps serialized in the same order, so a
client that sends its maps in one order finds its template; one that changes
the order only makes another. The raw
contents are taken off the parsed message first (``wire.parse_infer_request``
already split them off a large one); requests with typed ``contents`` are
converted every time (a template would keep nothing of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conveyor.ingress.call_templates import MAX_TEMPLATES, CallTemplate, TemplateCache, template_of
from conveyor.ingress.dataplane import InferCall
from conveyor.ingress.grpc.codec import to_infer_call
from conveyor.proto.request_checks import TensorData


class RequestTemplates:
    """The gRPC ingress's templates, by request description."""

    def __init__(self, capacity: int = MAX_TEMPLATES) -> None:
        self._cache: TemplateCache[tuple[bytes, tuple[int, ...]], CallTemplate] = TemplateCache(capacity)

    def call(self, message: Any, raw: Sequence[TensorData], timeout_s: float | None = None) -> InferCall:
        """``codec.to_infer_call``'s result, made from a template when the description was seen before."""
        if not raw and any(inp.HasField("contents") for inp in message.inputs):
            return to_infer_call(message, raw, timeout_s=timeout_s)  # typed contents: nothing to keep
        if message.raw_input_contents:
            message.ClearField("raw_input_contents")  # ``raw`` holds them
        key = (message.SerializeToString(), tuple(map(len, raw)))
        template = self._cache.get(key)
        if template is not None:
            return template.call(message.model_name, message.model_version, raw, timeout_s)
        call = to_infer_call(message, raw, timeout_s=timeout_s)
        template = template_of(call, raw)
        if template is not None:
            self._cache.put(key, template)
            call.shape_key = template
        return call
