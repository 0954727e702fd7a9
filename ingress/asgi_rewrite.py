"""ASGI plumbing for the cloud endpoints: a request re-addressed to a KServe v2 route of
the HTTP app, and the answer's status and headers adjusted on the way out.

SageMaker and Vertex AI serve Triton's own handlers under their platform's routes
(``/invocations``, ``AIP_PREDICT_ROUTE``); here the same falcon app that serves
``/v2`` does the work, so parsing, checks, errors and statistics are the HTTP
ingress's, and only the envelope differs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Any, Any, Any], Awaitable[None]]  # falcon's App types its own signature

HEADER_LENGTH = b"inference-header-content-length"
CONTENT_TYPE = b"content-type"


def header(scope: Scope, name: bytes) -> str | None:
    """A request header (``name`` lower-case), or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


def readdressed(scope: Scope, path: str, method: str | None = None, *, drop: tuple[bytes, ...] = (),
                add: tuple[tuple[bytes, bytes], ...] = ()) -> Scope:
    """``scope`` sent to ``path`` (and ``method``), less the ``drop`` headers, plus ``add``."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in drop]
    headers.extend(add)
    out = dict(scope)
    out.update(path=path, raw_path=path.encode(), query_string=b"", headers=headers)
    if method is not None:
        out["method"] = method
    return out


class MisplacedBinaryMime(ValueError):
    """A content type that holds the platform's binary MIME type anywhere but at its start: Triton's
    SageMaker and Vertex AI servers refuse it (INVALID_ARG, 400) in these words."""

    def __init__(self, mime: str, content_type: str) -> None:
        super().__init__(f"expect MIME type for binary data starts with '{mime}', got: {content_type}")


def binary_header_length(content_type: str | None, mime: str) -> tuple[bytes, bytes] | None:
    """The platform's ``<mime><N>`` content type as an Inference-Header-Content-Length
    header; None when the body is plain JSON. A malformed value is passed on as it is:
    the HTTP codec refuses it with Triton's words. Raises MisplacedBinaryMime when the
    type is there but not first."""
    if not content_type:
        return None
    at = content_type.find(mime)
    if at < 0:
        return None
    if at:
        raise MisplacedBinaryMime(mime, content_type)
    return HEADER_LENGTH, content_type[len(mime):].strip().encode()


async def reply(send: Send, status: int, body: bytes = b"", content_type: bytes = b"application/json") -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers.append((CONTENT_TYPE, content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def binary_content_type(send: Send, mime: str) -> Send:
    """A send that turns a binary answer's Inference-Header-Content-Length into the
    platform's ``<mime><N>`` content type (SageMaker's response convention)."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            length = next((bytes(v) for k, v in headers if k.lower() == HEADER_LENGTH), None)
            if length is not None:
                message = dict(message)
                message["headers"] = [(k, v) for k, v in headers if k.lower() not in (HEADER_LENGTH, CONTENT_TYPE)]
                message["headers"].append((CONTENT_TYPE, mime.encode() + length))
        await send(message)

    return wrapped
