"""Triton's generate extension: ``POST .../generate`` and ``.../generate_stream``.

A flat JSON object in, a flat JSON object out. Each key of the request that names
a model input becomes that input (its elements shaped by the model's dims as
Triton does: fixed dimensions first, the innermost -1 takes the rest, a batched
model gets a batch of one; the model's datatype decides the dtype); ``parameters``
are the request parameters, and so is every other key with a string, number or
bool value (any other value is refused), as in Triton.
Each output becomes a key of the response: one element as a scalar, more as a
(nested) list, BYTES as text; so does each response parameter (an output of the
same name wins).

``generate_stream`` answers with Server-Sent Events, one ``data:`` event per
response, which is what lets decoupled models stream over HTTP (Triton's HTTP
infer endpoint refuses them, server#2168). Errors after the stream started are
``data: {"error": ...}`` events, as in Triton.

A vLLM model's request whose worker dies is sent again to another engine, a stream resumed from its
token ids where it can go on exactly (``tensor_migration.py``, ``MAX_MIGRATIONS``): the client's stream
goes on without a gap or a repeat; one that cannot ends with the worker's error and why.

A model of the LLM contract (one that takes ``sampling_parameters``: Triton's vLLM backend) has its sampling
parameters (that input's JSON, or else the request's ``parameters``) checked against ``proto/llm_limits.py``
first: a request over one is a 400 at once, as the vLLM backend refuses it on every other route.

The ``conveyor-timeout-ms`` header (``deadline.py``) is the client's deadline on both: a request
still queued when it passes ends there; ``generate`` is answered DEADLINE_EXCEEDED at it, while a
stream that has started runs on until the client goes away.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import falcon
import falcon.asgi
import numpy as np
import orjson

from conveyor.ingress import tensor_migration
from conveyor.ingress.dataplane import DataPlane, InferCall, InferResult, StreamError
from conveyor.ingress.http.body import read_body
from conveyor.ingress.http.deadline import TIMEOUT_HEADER, parse_timeout, within
from conveyor.ingress.http.deep_json import is_depth_error
from conveyor.ingress.http.json_tensors import array_from_json
from conveyor.ingress.limits import check_json_size
from conveyor.proto import llm_limits
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.proto.prefix_keys import SESSION_HEADER, session_key
from conveyor.proto.request_checks import InferInput
from conveyor.proto.signature import ModelSignature

Request = falcon.asgi.Request
Response = falcon.asgi.Response
_RESERVED = ("id", "parameters")
SAMPLING = "sampling_parameters"  # the vLLM backend's input: vLLM's SamplingParams as a JSON object


class Generate:
    api = "inference"

    def __init__(self, dataplane: DataPlane, max_body_bytes: int, *, stream: bool) -> None:
        self._dataplane = dataplane
        self._limit = max_body_bytes
        self._stream = stream

    async def on_post(self, req: Request, resp: Response, model: str, version: str = "") -> None:
        json_limit = self._dataplane.limits.max_json_bytes
        body = await read_body(req, resp, self._limit, json_limit)
        check_json_size(len(body), json_limit)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
        if not isinstance(doc, dict):
            raise invalid_arg("the generate request must be a JSON object")
        sig = await self._dataplane.models.get(model, version)
        call = generate_call(doc, sig, model, version)
        if SAMPLING in sig.inputs:
            check_sampling(doc, call.parameters)
        call.timeout_s = parse_timeout(req.get_header(TIMEOUT_HEADER))  # the router ends it queued past it
        session = req.get_header(SESSION_HEADER)
        if session:  # its turns on one engine (router/scheduling/engine_placement.py)
            call.session = session_key(session)
        resume = tensor_migration.plan(call, sig)  # a vLLM model's request moves if its worker dies
        if self._stream:
            # As Triton, a request refused before any response (bad inputs, a full queue)
            # answers a plain JSON error with its status, not a stream of one error event.
            events = self._responses(call, resume)
            try:
                first = await anext(events)
            except StopAsyncIteration:
                first = None
            if isinstance(first, StreamError) and first.final:
                await events.aclose()
                raise first.error
            resp.content_type = "text/event-stream; charset=utf-8"
            resp.sse = self._events(first, events)
            return
        if sig.decoupled:
            result = await within(call.timeout_s, self._one_of_stream(call, resume))
        else:
            result = await within(call.timeout_s, self._dataplane.infer(call))
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(render(result))

    def _responses(self, call: InferCall,
                   resume: tensor_migration.TensorMigration | None) -> AsyncGenerator[InferResult | StreamError, None]:
        """The responses to ``call``; with ``resume``, read on across its moves to other engines."""
        if resume is None:
            return self._dataplane.infer_stream(call)
        return tensor_migration.resumed_stream(self._dataplane, call, resume)

    async def _one_of_stream(self, call: InferCall, resume: tensor_migration.TensorMigration | None) -> InferResult:
        """``generate`` answers once: a decoupled model must send one response with outputs."""
        found: InferResult | None = None
        async for item in self._responses(call, resume):
            if isinstance(item, StreamError):
                raise item.error
            if item.outputs:
                if found is not None:
                    item.release()
                    found.release()
                    raise invalid_arg("the model sent more than one response: use generate_stream")
                found = item
            else:
                item.release()
        if found is None:
            raise invalid_arg("the model sent no response")
        return found

    async def _events(self, first: InferResult | StreamError | None,
                      rest: AsyncGenerator[InferResult | StreamError, None]) -> AsyncIterator[falcon.asgi.SSEvent]:
        try:
            async for item in _chained(first, rest):
                if isinstance(item, StreamError):
                    yield falcon.asgi.SSEvent(data=orjson.dumps({"error": item.error.message}))
                    continue
                if item.outputs:
                    yield falcon.asgi.SSEvent(data=orjson.dumps(render(item)))
                else:
                    item.release()
        except ConveyorError as exc:  # the status line is sent already: errors are events
            yield falcon.asgi.SSEvent(data=orjson.dumps({"error": exc.message}))


def check_sampling(doc: dict[str, Any], parameters: dict[str, Any]) -> None:
    """The sampling parameters of a request to an LLM (the backend reads ``sampling_parameters`` when given,
    else the request's ``parameters``: the object's and the top-level keys that name no input) within
    ``proto/llm_limits.py``'s bounds; what cannot be read as an object is left to the backend's refusal."""
    values: Any = doc.get(SAMPLING)
    if isinstance(values, str):
        try:
            values = orjson.loads(values)
        except orjson.JSONDecodeError as exc:
            if is_depth_error(exc):
                raise invalid_arg(f"'{SAMPLING}' is nested too deeply to decode") from None
            return  # not JSON: the backend refuses it in its words
    elif values is None:
        values = parameters
    if isinstance(values, dict):
        llm_limits.check_sampling(values)


def generate_call(doc: dict[str, Any], sig: ModelSignature, model: str, version: str) -> InferCall:
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    params = dict(params)
    inputs: list[InferInput] = []
    for key, value in doc.items():
        if key in _RESERVED:
            continue
        spec = sig.inputs.get(key)
        if spec is None:  # as Triton's generate: a key that names no input is a request parameter
            if not isinstance(value, (str, int, float)):  # bool is an int
                raise invalid_arg(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                                  "'string'.")
            params.setdefault(key, value)
            continue
        flat = _flatten(value) if isinstance(value, list) else [value]
        shape = _shape(key, spec.dims, sig.max_batch_size > 0, len(flat))
        inputs.append(InferInput(key, spec.datatype, shape, array_from_json(key, spec.datatype, flat)))
    request_id = doc.get("id", "")
    return InferCall(model=model, version=version, inputs=inputs, outputs=None,
                     id=request_id if isinstance(request_id, str) else "", parameters=params)


def render(result: InferResult) -> dict[str, Any]:
    """The response object; releases ``result``."""
    try:
        doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version}
        if result.id:
            doc["id"] = result.id
        for key, value in result.parameters.items():  # the response's parameters, merged in as Triton does
            doc.setdefault(key, value)
        for out in result.outputs:
            if out.raw is None:
                continue  # placed in the client's shared memory
            arr = out.as_array()
            if out.datatype == "BYTES":
                arr = np.vectorize(lambda b: b.decode("utf-8", "replace"), otypes=[object])(arr)
            if arr.size == 1:
                first = arr.reshape(-1)[0]
                doc[out.name] = first if out.datatype == "BYTES" else first.item()
            else:
                doc[out.name] = arr.tolist()
        return doc
    finally:
        result.release()


def _shape(name: str, dims: tuple[int, ...], batched: bool, count: int) -> list[int]:
    """The shape of an input of ``count`` elements, as Triton's generate endpoint makes it from the model's
    shape (its metadata's: a batched model's starts with -1): the fixed dimensions take their share of the
    elements, the innermost -1 the rest, every other -1 is 1; elements that do not fit are refused."""
    shape = [-1, *dims] if batched else list(dims)
    rest = count
    for dim in shape:
        if dim != -1:
            if dim <= 0 or rest % dim:
                raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
            rest //= dim
    for at in range(len(shape) - 1, -1, -1):
        if shape[at] == -1:
            shape[at], rest = rest, 1
    if rest != 1:
        raise invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")
    return shape


def _flatten(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, list):
            out += _flatten(v)
        else:
            out.append(v)
    return out


async def _chained(first: InferResult | StreamError | None,
                   rest: AsyncGenerator[InferResult | StreamError, None]) -> AsyncIterator[InferResult | StreamError]:
    async with contextlib.aclosing(rest):
        if first is not None:
            yield first
        async for item in rest:
            yield item
