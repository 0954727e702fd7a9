"""The HTTP ingress's one error renderer: every failure becomes ``{"error": msg}``.

* ``ConveyorError``          -> ``http_status(err.status)`` (Triton's mapping)
* ``falcon.HTTPError``       -> its own status (404 unknown route, 405, bad headers ...),
                                with its headers (``Allow``) kept
* anything else              -> 500, logged with its traceback

A 503 (a full queue, a group shutting down, a router too busy) also says ``Retry-After``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.proto.errors import ConveyorError, http_status

log = logging.getLogger(__name__)

# Seconds a client told 503 should wait before it tries again (``Retry-After``): the refusals
# are momentary (a queue full now, an instance leaving), and clients that honour the header
# (the openai client's retries, gateways) then back off instead of retrying at once and
# adding to the overload. Triton sends none; its clients ignore it.
RETRY_AFTER_S = 1
RETRY_AFTER = str(RETRY_AFTER_S)
RETRY_AFTER_LINE = b"retry-after: %d\r\n" % RETRY_AFTER_S  # for the paths that write their own head


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def error_status(error: Exception, method: str, path: str) -> tuple[int, str]:
    """The HTTP status and message of any error but falcon's own (logged when unexpected)."""
    if isinstance(error, ConveyorError):
        return http_status(error.status), error.message
    log.exception("unhandled error serving %s %s", method, path)
    return 500, f"internal error: {type(error).__name__}" + (f": {error}" if str(error) else "")


async def render_error(
    req: falcon.asgi.Request,
    resp: falcon.asgi.Response | None,
    error: Exception,
    params: dict[str, Any],
    *,
    ws: falcon.asgi.WebSocket | None = None,
) -> None:
    """Falcon error handler, registered for ``Exception`` and ``falcon.HTTPError``."""
    if resp is None:  # a WebSocket, which this app does not serve
        return
    if isinstance(error, falcon.HTTPError):
        status = error.status_code
        message = error.description or _phrase(status)
        if error.headers:
            resp.set_headers(error.headers)
    else:
        status, message = error_status(error, req.method, req.path)
    # A failure after headers were staged must not leave binary-response headers behind.
    resp.delete_header("Inference-Header-Content-Length")
    resp.delete_header("Content-Encoding")
    resp.status = status
    if status == 503:
        resp.set_header("Retry-After", RETRY_AFTER)
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body(message)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
