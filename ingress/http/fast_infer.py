"""Plain infer requests served straight from ASGI, without falcon.

``POST /v2/models/{model}[/versions/{version}]/infer`` is nearly all the HTTP
ingress does under load, and falcon's request and response objects, routing
and rendering were about an eighth of the ingress's CPU per request for a small
model (docs/PERFORMANCE.md). This wrapper serves such a request itself with the
same ``Infer`` steps (``parse``, ``answer``) and the same error rendering
(``errors.error_status``), and hands everything else to the falcon app: other
routes and methods, compressed or chunked bodies, duplicated headers that falcon
would join, and the whole app when APIs are restricted or headers forwarded
(``build_fast_app`` then returns the falcon app itself).
"""

from __future__ import annotations

import re
from typing import Any

from conveyor.ingress.http.app import Infer
from conveyor.ingress.http.body import Receive, Send
from conveyor.ingress.http.codec import parse_header_length
from conveyor.ingress.http.errors import error_body, error_status
from conveyor.proto.errors import ConveyorError

# What falcon's ``{model}`` and ``{version}`` fields match: one non-empty path segment each.
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")

_JSON = b"application/json"


class _Headers:
    """The request headers this path reads, latin-1 as falcon decodes them."""

    __slots__ = ("accept_encoding", "header_length", "traceparent")

    def __init__(self) -> None:
        self.header_length: str | None = None
        self.accept_encoding: str | None = None
        self.traceparent = ""


def _plain_headers(raw: list[tuple[bytes, bytes]]) -> _Headers | None:
    """The headers, or None when falcon must serve the request: no ``Content-Length``,
    a chunked or compressed body, or a header this path reads given twice."""
    headers = _Headers()
    length = False
    for name, value in raw:  # ASGI header names are lower-case
        if name == b"content-length":
            if length or not value.isdigit():
                return None
            length = True
        elif name == b"inference-header-content-length":
            if headers.header_length is not None:
                return None
            headers.header_length = value.decode("latin-1")
        elif name == b"accept-encoding":
            if headers.accept_encoding is not None:
                return None
            headers.accept_encoding = value.decode("latin-1")
        elif name == b"traceparent":
            if headers.traceparent:
                return None
            headers.traceparent = value.decode("latin-1")
        elif name == b"transfer-encoding" or name == b"content-encoding":
            return None
    return headers if length else None


class FastInfer:
    """ASGI app: plain infer requests here, the rest to ``app`` (falcon)."""

    def __init__(self, app: Any, infer: Infer) -> None:
        self.app = app
        self._infer = infer

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                headers = _plain_headers(scope["headers"])
                if headers is not None:
                    await self._serve(match[1], match[2] or "", headers, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, model: str, version: str, headers: _Headers, scope: dict[str, Any], receive: Receive,
                     send: Send) -> None:
        infer = self._infer
        try:
            try:
                header_length = parse_header_length(headers.header_length)
            except ConveyorError as exc:  # counted as the model's REJECTED failure, as falcon's path does
                infer.dataplane.refused(model, version, exc)
                raise
            body = await _read_body(receive)
            if body is None:
                return  # the client went away before its request arrived
            request = await infer.parse(body, model, version, header_length)
            del body  # a JSON-only body is garbage now; binary inputs keep their views of it alive
            answer = await infer.answer(request, headers.traceparent, headers.accept_encoding)
        except Exception as exc:
            status, message = error_status(exc, "POST", scope["path"])
            data = error_body(message)
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", _JSON), (b"content-length", b"%d" % len(data))]})
            await send({"type": "http.response.body", "body": data})
            return
        data = answer.data
        out = [(b"content-type", answer.content_type.encode()), (b"content-length", b"%d" % len(data))]
        for name, value in answer.headers:
            out.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        await send({"type": "http.response.start", "status": 200, "headers": out})
        await send({"type": "http.response.body", "body": data})


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body (its ``Content-Length`` was checked by ``BodyLimit``); None when the
    client disconnected first. A disconnect later ends the body, as in falcon."""
    event = await receive()
    if event["type"] == "http.disconnect":
        return None
    body: bytes = event.get("body", b"")
    if not event.get("more_body", False):
        return body
    chunks = [body]
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body", False):
            return b"".join(chunks)


def build_fast_app(falcon_app: Any, infer: Infer, restricted: bool) -> Any:
    """``falcon_app`` behind ``FastInfer``, unless APIs are restricted (falcon's middleware checks
    each request) or headers are forwarded (the case-keeping headers): then falcon alone."""
    if restricted or infer.forward is not None:
        return falcon_app
    return FastInfer(falcon_app, infer)
