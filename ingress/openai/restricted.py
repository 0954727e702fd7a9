"""Restricted APIs on the OpenAI port (``--openai-restricted-api``, joined with ``--http-restricted-api``:
ingress/restricted.py ``port_rules``). Each route names the categories it belongs to (``app.py``); the
middleware is installed only when some category is restricted, and checks the resource falcon routed to,
so every spelling of a path that reaches a route (a trailing ``/``, ``%2F``, any method) meets the same
check. Refused as Triton's OpenAI frontend refuses: 401 ``{"error": {"message": "This API is restricted,
expecting header '<key>' with valid value", "type": "authentication_error", "code": "invalid_auth"}}``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.restricted import Restriction, openai_refusal


def refusal_body(rule: Restriction) -> bytes:
    return orjson.dumps({"error": {"message": openai_refusal(rule), "type": "authentication_error",
                                   "code": "invalid_auth"}})


def anthropic_refusal_body(rule: Restriction) -> bytes:
    """The same refusal on Anthropic's routes, in Anthropic's form."""
    return orjson.dumps({"type": "error", "error": {"type": "authentication_error", "message": openai_refusal(rule)}})


class OpenAiRestrictions:
    def __init__(self) -> None:
        # id(resource) -> the restrictions its requests meet, with their refusals (made once)
        self._by_resource: dict[int, tuple[tuple[Restriction, bytes], ...]] = {}

    def guard(self, resource: object, categories: Iterable[str], rules: dict[str, Restriction],
              anthropic: bool = False) -> None:
        """``resource``'s requests need the header of each of its ``categories`` that ``rules`` restricts;
        ``anthropic``: it is one of Anthropic's routes, refused in Anthropic's form."""
        body = anthropic_refusal_body if anthropic else refusal_body
        needed = tuple((rule, body(rule)) for c in categories if (rule := rules.get(c)) is not None)
        if needed:
            self._by_resource[id(resource)] = needed

    def __bool__(self) -> bool:
        return bool(self._by_resource)

    async def process_resource(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        for rule, body in self._by_resource.get(id(resource), ()):
            if req.get_header(rule.header) != rule.value:
                resp.status = 401
                resp.content_type = falcon.MEDIA_JSON
                resp.data = body
                resp.complete = True  # falcon runs no responder
                return
