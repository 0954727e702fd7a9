"""Reading a request body: size limit first, then decompression.

The limit is checked against ``Content-Length`` before a byte is read, and
while reading chunked bodies. A compressed body inflates chunk by chunk as it
arrives (once its first MiB is in), against the limit its uncompressed form
has (``compression.Inflater``); what a chunk inflates to past
``compression.INLINE_INFLATE`` is inflated on a worker thread (zlib releases the
GIL) so one big request does not stall every other connection of this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import falcon.asgi

from conveyor.ingress.http.compression import Inflater, request_coding
from conveyor.ingress.http.errors import RETRY_AFTER, error_body
from conveyor.ingress.limits import json_too_large
from conveyor.proto.errors import ConveyorError, Status, http_status
from conveyor.shm.arena import arena_full

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

# Below this, compressing a response inline is cheaper than a hop to a thread.
OFFLOAD_BYTES = 1 << 20
# Set in an ASGI request's scope by the protocol (``protocol.py``) when its client went away and its
# task was cancelled for it: ``BodyLimit`` ends that task quietly (uvicorn would log an error).
CLIENT_LEFT = "conveyor.client_left"


class BodyTooLarge(ConveyorError):
    """A body over the limit (``size`` bytes read so far, or its ``Content-Length``): INVALID_ARG in
    Triton's words for its one input-size limit, here the body's (--http-max-body-bytes); the OpenAI
    port answers it as Triton's frontend does (``ingress/openai/errors.py``: 413)."""

    def __init__(self, size: int, limit: int, *, at_least: bool = False) -> None:
        qualifier = "at least " if at_least else ""
        super().__init__(Status.INVALID_ARG,
                         f"request size of {qualifier}{size} bytes exceeds the maximum allowed input size of "
                         f"{limit} bytes. Use --http-max-input-size to increase the limit. (conveyor serve: "
                         "--http-max-body-bytes)")
        self.size = size
        self.limit = limit


# The answer to a body whose Content-Length is over the limit, before the app sees it: (status, JSON body)
# of (Content-Length, limit, the request's path: an app may answer each API in its own form); None: KServe's.
Refusal = Callable[[int, int, str], tuple[int, bytes]]


def _too_large(size: int, limit: int, *, at_least: bool = False) -> ConveyorError:
    return BodyTooLarge(size, limit, at_least=at_least)


async def read_body(req: falcon.asgi.Request, resp: falcon.asgi.Response, limit: int,
                    json_limit: int = 0) -> bytes:
    """The whole (decompressed) request body; INVALID_ARG when it is over ``limit``, or inflates past
    it or, for a body that is all JSON, past ``json_limit`` (--max-json-bytes; 0: none)."""
    coding = request_coding(req.get_header("Content-Encoding"))  # unsupported codings fail before reading
    length = req.content_length
    json_only = 0 < json_limit < limit  # the whole body is JSON, and its limit is the tighter one
    if length is not None and (length > limit or (json_only and coding is None and length > json_limit)):
        # The body stays unread: close the connection rather than let the server drain it.
        resp.set_header("Connection", "close")
        raise _too_large(length, limit) if length > limit else json_too_large(length, json_limit)
    if coding is not None:
        return await _inflated(req, resp, coding, limit, json_limit)
    if length is not None:
        return await req.stream.readall()
    chunks: list[bytes] = []
    size = 0
    cap = json_limit if json_only else limit
    async for chunk in req.stream:
        size += len(chunk)
        if size > cap:
            resp.set_header("Connection", "close")
            raise json_too_large(size, cap) if json_only else _too_large(size, limit, at_least=True)
        chunks.append(chunk)
    return b"".join(chunks)


async def _inflated(req: falcon.asgi.Request, resp: falcon.asgi.Response, coding: str, limit: int,
                    json_limit: int) -> bytes:
    """The body inflated as it arrives, against the limit its uncompressed form has: a bomb is
    refused once its output passes that, with the rest of it unread (CVE-2025-33201's class)."""
    inflater = Inflater(coding, json_limit, "--max-json-bytes") if 0 < json_limit < limit else Inflater(coding, limit)
    size = 0
    try:
        async for chunk in req.stream:
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit, at_least=True)
            if inflater.feed(chunk):
                # A chunk that inflates to much more (a large or a hostile body) goes on off the loop.
                await asyncio.to_thread(inflater.drain)
        if inflater.end():
            await asyncio.to_thread(inflater.drain)
    except ConveyorError:
        resp.set_header("Connection", "close")  # the rest of the body stays unread
        raise
    return inflater.finish()


class BodyLimit:
    """ASGI wrapper that refuses an over-limit ``Content-Length`` before anything reads.

    falcon awaits the first body event before it routes a request, so a client
    that sends the headers and waits (or expects ``100 Continue``) would never
    hear from ``read_body``. Answering here also spares the server reading a body
    it is going to refuse: the connection closes after the 400.

    In front of every app, it is also where a request cancelled because its client went
    away (``CLIENT_LEFT``) ends: a normal end, nobody to answer.
    """

    def __init__(self, app: falcon.asgi.App, limit: int, arena_bytes: int | None = None,
                 refusal: Refusal | None = None) -> None:
        self.app = app
        self.limit = limit
        self.refusal = refusal
        # The ingress arena's size: binary inputs larger than it could never be taken in, and are
        # refused in its words (those Triton's QA expects of a body past the pool's size).
        self.arena_bytes = arena_bytes

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = chunked = header_length = None
            json_only = True  # no Inference-Header-Content-Length: the whole body is JSON
            for name, value in scope["headers"]:  # ASGI header names are lower-case
                if name == b"content-length":
                    length = value
                elif name == b"transfer-encoding":
                    chunked = value
                elif name == b"inference-header-content-length":
                    json_only = False
                    header_length = value
            if length is not None:
                if length.isdigit() and int(length) > self.limit:
                    if self.refusal is not None:
                        await self._answer(send, *self.refusal(int(length), self.limit, scope.get("path", "")))
                        return
                    error = self._too_large(int(length), None if json_only else header_length)
                    await self._refuse(send, error)
                    return
                if chunked is not None:
                    # Both framings (accepted as Triton accepts them, chunked wins: RFC 9112 6.3):
                    # a sign of request smuggling, so this connection ends after the answer.
                    send = _closing(send)
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not scope.get(CLIENT_LEFT):
                raise  # the server's own cancellation (shutdown past its grace)

    def _too_large(self, size: int, header_length: bytes | None) -> ConveyorError:
        """The refusal of a body of ``size`` bytes; ``header_length``: its JSON part's, None when
        the whole body is JSON."""
        if header_length is None:
            return json_too_large(size, self.limit, "--http-max-body-bytes")
        if self.arena_bytes is not None and header_length.isdigit():
            if size - int(header_length) > self.arena_bytes:
                return arena_full(size - int(header_length), self.arena_bytes)
        return _too_large(size, self.limit)

    async def _refuse(self, send: Send, error: ConveyorError) -> None:
        await self._answer(send, http_status(error.status), error_body(error.message))

    @staticmethod
    async def _answer(send: Send, status: int, body: bytes) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        if status == 503:
            headers.append((b"retry-after", RETRY_AFTER.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _closing(send: Send) -> Send:
    async def send_closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return send_closing
