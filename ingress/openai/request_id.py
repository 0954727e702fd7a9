"""Request ids in and out, as vLLM's server has them (``--enable-request-id-headers``): the client's
``X-Request-Id`` header, else the body's ``request_id`` (vLLM's extension of the completion and chat
bodies), else a fresh id, is the request's id (a completion's ``id`` is
``cmpl-<it>``, a chat completion's ``chatcmpl-<it>``, and the model's request carries it, so the
group's logs and traces name it) and comes back as the response's ``X-Request-Id``, on every route,
errors too (and as ``request-id`` on Anthropic's routes, as Anthropic names it). vLLM echoes the header
only when started with that flag; here it always does: a header costs nothing, and a proxy that correlates
requests needs no server flag to be set.
"""

from __future__ import annotations

import uuid
from typing import Any

import falcon.asgi

from conveyor.ingress.openai.errors import is_anthropic

HEADER = "X-Request-Id"
ANTHROPIC_HEADER = "request-id"  # Anthropic's routes: its header too, which its client reads (``_request_id``)


def request_id(req: falcon.asgi.Request, body_id: str | None = None) -> str:
    """The request's id; ``body_id``: the body's ``request_id``, which a header overrides (as in vLLM)."""
    if body_id and req.get_header(HEADER) is None:
        req.context.request_id = body_id  # the response's header says it too (vLLM's would be another id)
    rid: str = req.context.request_id
    return rid


class RequestIds:
    """Falcon middleware: the id set on the request before the responder, and on the response after."""

    async def process_request(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        req.context.request_id = req.get_header(HEADER) or uuid.uuid4().hex

    async def process_response(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any,
                               req_succeeded: bool) -> None:
        rid = req.context.get("request_id")
        if rid:
            resp.set_header(HEADER, rid)
            if is_anthropic(req.path):
                resp.set_header(ANTHROPIC_HEADER, rid)
