"""The falcon ASGI app: KServe v2 routes plus Triton's extensions, as thin adapters.

Resources only move bytes: parsing and rendering live in ``codec``, the work in
``DataPlane`` (inference) and the router (``RouterClient``: readiness,
metadata, config, statistics). Every error goes through ``errors.render_error``.
A model version of "" lets the server pick.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi

from conveyor.ingress.context import IngressContext
from conveyor.ingress.dataplane import ROUTING_HINT, DataPlane, InferResult
from conveyor.ingress.drain import IngressDrain
from conveyor.ingress.header_forward import RAW_HEADERS
from conveyor.ingress.http.body import OFFLOAD_BYTES, read_body
from conveyor.ingress.http.codec import (
    HEADER_LENGTH,
    AnswerLayout,
    HttpInferRequest,
    build_infer_response,
    encode_json,
    parse_header_length,
)
from conveyor.ingress.http.compression import compress, response_coding
from conveyor.ingress.http.deadline import TIMEOUT_HEADER, parse_timeout, within
from conveyor.ingress.http.errors import render_error
from conveyor.ingress.http.generate import Generate
from conveyor.ingress.http.header_templates import HeaderTemplates
from conveyor.ingress.http.observe import add_observability_routes
from conveyor.ingress.http.raw_body import raw_infer_request
from conveyor.ingress.http.repository import add_repository_routes
from conveyor.ingress.http.restricted import CategorizedApp, RestrictedApis
from conveyor.ingress.http.shared_memory import add_shared_memory_routes
from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES, check_json_size
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.router_link import RouterLink
from conveyor.ingress.server_metadata import server_metadata
from conveyor.proto import messages as m
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import ConveyorError

ROUTING_HEADER = "conveyor-host"  # on answers to sequence requests: see dataplane.ROUTING_HINT

Request = falcon.asgi.Request
Response = falcon.asgi.Response


def _json(resp: Response, doc: Any) -> None:
    resp.content_type = falcon.MEDIA_JSON
    resp.data = encode_json(doc)


def _status(resp: Response, ok: bool) -> None:
    # Triton answers readiness with an empty body: 200, or 400 when not ready.
    resp.status = 200 if ok else 400


# Each resource's ``api`` is its Triton API category (ingress/restricted.py): the
# restricted-API middleware looks it up, and the app refuses a route without one (http/restricted.py).


class Live:
    api = "health"

    def __init__(self, link: RouterLink) -> None:
        self._link = link

    async def on_get(self, req: Request, resp: Response) -> None:
        # This process answering is the liveness, unless the server failed to initialize (Triton's 400).
        _status(resp, self._link.live)


class ServerReady:
    api = "health"

    def __init__(self, link: RouterClient, drain: IngressDrain) -> None:
        self._link = link
        self._drain = drain

    async def on_get(self, req: Request, resp: Response) -> None:
        # Draining: not ready at once, so balancers stop sending before requests are refused.
        _status(resp, not self._drain.draining and await self._link.server_ready())


class ServerMetadata:
    api = "metadata"

    def __init__(self) -> None:
        self._body = encode_json(server_metadata())  # fixed for the life of the process

    async def on_get(self, req: Request, resp: Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self._body


class ModelControl:
    """A per-model GET answered by one router control op."""

    def __init__(self, op: Callable[[str, str], Awaitable[dict[str, Any]]], api: str) -> None:
        self._op = op  # a RouterClient method
        self.api = api

    async def on_get(self, req: Request, resp: Response, model: str, version: str = "") -> None:
        _json(resp, await self._op(model, version))


class ModelReady:
    api = "health"  # as in Triton: readiness, per model too

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_get(self, req: Request, resp: Response, model: str, version: str = "") -> None:
        _status(resp, await self._link.model_ready(model, version))


class Stats:
    """``/v2/models/stats`` (every model) and the per-model, per-version forms."""

    api = "statistics"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_get(self, req: Request, resp: Response, model: str = "", version: str = "") -> None:
        _json(resp, await self._link.model_stats(model, version))


@dataclass(slots=True)
class InferAnswer:
    """A successful infer response, whichever way it is sent (falcon or ``fast_infer``)."""

    content_type: str
    data: bytes
    headers: list[tuple[str, str]]  # beside Content-Type and Content-Length
    coding: str | None = None  # a Content-Encoding still to apply to ``data``, off the loop (``compressed``)
    layout: AnswerLayout | None = None  # kept for the next answer of the template: its head still to set


class Infer:
    api = "inference"

    def __init__(self, dataplane: DataPlane, max_body_bytes: int) -> None:
        self.dataplane = dataplane
        self._limit = max_body_bytes
        self.forward = dataplane.limits.header_forward  # --http-header-forward-pattern; None: off
        self.templates = HeaderTemplates()

    async def on_post(self, req: Request, resp: Response, model: str, version: str = "") -> None:
        try:
            header_length = parse_header_length(req.get_header(HEADER_LENGTH))
            # A body that is all JSON may not inflate past the JSON limit either.
            body = await read_body(req, resp, self._limit,
                                   self.dataplane.limits.max_json_bytes if header_length is None else 0)
        except ConveyorError as exc:  # counted as the model's REJECTED failure
            self.dataplane.refused(model, version, exc)
            raise
        try:
            request = await self.parse(body, model, version, header_length)
        except ConveyorError as exc:
            raise await self.model_first(exc, model, version) from None
        del body  # a JSON-only body is garbage now; binary inputs keep their views of it alive
        forwarded: Iterable[tuple[str, Any]] = ()
        if self.forward is not None:
            forwarded = req.scope.get(RAW_HEADERS) or req.headers.items()
        answer = await self.answer(request, req.get_header("traceparent") or "", req.get_header("Accept-Encoding"),
                                   forwarded, req.get_header(TIMEOUT_HEADER))
        for name, value in answer.headers:
            resp.set_header(name, value)
        resp.content_type = answer.content_type
        resp.data = answer.data

    async def parse(self, body: bytes, model: str, version: str, header_length: int | None) -> HttpInferRequest:
        """The request in ``body``; a refusal is counted as the model's REJECTED failure."""
        if header_length != 0:
            return self.parse_json(body, model, version, header_length)
        try:  # a raw binary body (no JSON): read by the model's signature
            sig = await self.dataplane.models.get(model, version)
            return raw_infer_request(memoryview(body), model, version, sig)
        except ConveyorError as exc:
            self.dataplane.refused(model, version, exc)
            raise

    async def model_first(self, refusal: ConveyorError, model: str, version: str) -> ConveyorError:
        """The answer to a request whose body was refused: Triton looks the model up before it reads the
        body (TRITONSERVER_InferenceRequestNew), so a model that is not there, or not ready, is the answer
        ("Request for unknown model: ..."). Only a refused request of a model not known here asks the router."""
        if self.dataplane.models.cached(model, version) is not None:
            return refusal
        try:
            await self.dataplane.models.get(model, version)
        except ConveyorError as missing:
            return missing
        return refusal

    def parse_json(self, body: bytes, model: str, version: str, header_length: int | None) -> HttpInferRequest:
        """``parse`` for a body with a JSON header (``header_length`` None or positive): nothing to wait for."""
        try:
            check_json_size(len(body) if header_length is None else header_length,
                            self.dataplane.limits.max_json_bytes)
            return self.templates.parse(body, model, version, header_length)
        except ConveyorError as exc:
            self.dataplane.refused(model, version, exc)
            raise

    async def answer(self, request: HttpInferRequest, traceparent: str, accept_encoding: str | None,
                     forwarded: Iterable[tuple[str, Any]] = (), timeout: str | None = None) -> InferAnswer:
        """Run ``request``; its response. ``forwarded``: the headers to match against
        ``--http-header-forward-pattern`` (when it is set); ``timeout``: the client's deadline
        header (``deadline.py``), if it sent one."""
        call = request.call
        call.traceparent = traceparent
        if self.forward is not None:
            self.forward.apply(forwarded, call.parameters)
        if timeout is None:
            result = await self.dataplane.infer(call)
        else:
            try:
                call.timeout_s = parse_timeout(timeout)
            except ConveyorError as exc:
                self.dataplane.refused(call.model, call.version, exc)
                raise
            result = await within(call.timeout_s, self.dataplane.infer(call))
        answer = self.render(result, request, accept_encoding)
        return answer if answer.coding is None else await self.compressed(answer)

    def render(self, result: InferResult, request: HttpInferRequest, accept_encoding: str | None,
               answered: m.InferResponse | None = None) -> InferAnswer:
        """``result`` as the answer to ``request`` (releasing it); a body big enough to compress
        off the loop is left to ``compressed`` (``InferAnswer.coding``). With ``answered``, the
        response ``result`` is made of, an uncompressed answer may be kept in ``request.layout``
        for the next request of its template (``InferAnswer.layout``: the caller sets its head)."""
        headers: list[tuple[str, str]] = []
        host = result.parameters.get(ROUTING_HINT)
        if host:  # the same hint as a header: a load balancer need not parse the body
            headers.append((ROUTING_HEADER, host))
        response = build_infer_response(result, request)  # releases the result
        data = response.body
        later = None
        if accept_encoding is not None and (coding := response_coding(accept_encoding)) is not None:
            if len(data) >= OFFLOAD_BYTES:
                later = coding
            else:
                data = compress((data,), coding)
            headers.append(("Content-Encoding", coding))
        elif answered is not None and (layout := request.layout) is not None:
            kept = layout if layout.keep(answered, result, request, response) else None
            if response.header_length is not None:
                headers.append((HEADER_LENGTH, str(response.header_length)))
            return InferAnswer(response.content_type, data, headers, None, kept)
        if response.header_length is not None:
            # The uncompressed JSON size, as Triton sends it.
            headers.append((HEADER_LENGTH, str(response.header_length)))
        return InferAnswer(response.content_type, data, headers, later)

    @staticmethod
    async def compressed(answer: InferAnswer) -> InferAnswer:
        """``answer`` with its body compressed in a thread (``InferAnswer.coding``)."""
        assert answer.coding is not None
        data = await asyncio.to_thread(compress, (answer.data,), answer.coding)
        return InferAnswer(answer.content_type, data, answer.headers)


def build_app(
    ctx: IngressContext,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    restricted: dict[str, Restriction] | None = None,
) -> falcon.asgi.App:
    """The HTTP/REST app over ``ctx``'s router link and data plane; ``restricted``
    maps API categories to the header each needs (``--http-restricted-api``)."""
    # No middleware at all unless something is restricted: nothing on the hot path.
    middleware = [RestrictedApis(restricted)] if restricted else []
    app = CategorizedApp(media_type=falcon.MEDIA_JSON, middleware=middleware)
    app.add_error_handler([Exception, falcon.HTTPError], render_error)

    link = ctx.link
    app.add_route("/v2/health/live", Live(link))
    app.add_route("/v2/health/ready", ServerReady(link, ctx.drain))
    app.add_route("/v2", ServerMetadata())

    stats = Stats(link)
    app.add_route("/v2/models/stats", stats)
    per_model: dict[str, object] = {
        "": ModelControl(link.model_metadata, "metadata"),
        "/ready": ModelReady(link),
        "/config": ModelControl(link.model_config, "model-config"),
        "/stats": stats,
        "/infer": Infer(ctx.dataplane, max_body_bytes),
        "/generate": Generate(ctx.dataplane, max_body_bytes, stream=False),
        "/generate_stream": Generate(ctx.dataplane, max_body_bytes, stream=True),
    }
    for suffix, resource in per_model.items():
        app.add_route("/v2/models/{model}" + suffix, resource)
        app.add_route("/v2/models/{model}/versions/{version}" + suffix, resource)
    add_shared_memory_routes(app, link)
    add_repository_routes(app, link)
    add_observability_routes(app, link)
    return app
