"""API keys on the OpenAI port (vLLM's ``--api-key``): a request to a model route carries one of the keys,
``Authorization: Bearer <key>`` (the Anthropic routes also take ``x-api-key: <key>``, as Anthropic's clients
send it), or is refused with 401 in its API's own error form before anything else reads it.

As in vLLM, the keys are kept as SHA-256 digests and a presented key is compared with every one of them in
constant time, so neither a key's length nor its first differing byte shows in the time of a refusal. The
middleware is installed only when keys are set; health, metrics and /version stay open, as vLLM leaves them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from typing import Any

import falcon
import falcon.asgi
import orjson

OPENAI_FORM, ANTHROPIC_FORM = "openai", "anthropic"

# The bodies of a refusal: OpenAI's own for a wrong key, Anthropic's for its routes.
_REFUSALS = {
    OPENAI_FORM: orjson.dumps({"error": {
        "message": "Incorrect API key provided. Send 'Authorization: Bearer <key>' with one of the server's keys.",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}),
    ANTHROPIC_FORM: orjson.dumps({"type": "error", "error": {
        "type": "authentication_error", "message": "invalid x-api-key"}}),
}


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class ApiKeys:
    """The falcon middleware: each guarded resource's error form, and the keys' digests."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = [_digest(k) for k in keys if k]
        self._forms: dict[int, str] = {}  # id(resource) -> the error form of its refusal

    def __bool__(self) -> bool:
        return bool(self._digests)

    def guard(self, resource: object, form: str) -> None:
        self._forms[id(resource)] = form

    def accepts(self, key: str | None) -> bool:
        if key is None:
            return False
        presented = _digest(key)
        found = False
        for digest in self._digests:  # every key, whatever matched: the time says nothing
            found |= secrets.compare_digest(presented, digest)
        return found

    def presented(self, req: falcon.asgi.Request, form: str) -> str | None:
        authorization = req.get_header("Authorization")
        if authorization:
            scheme, _, key = authorization.partition(" ")
            if scheme.lower() == "bearer":
                return key.strip()
        return req.get_header("x-api-key") if form == ANTHROPIC_FORM else None

    async def process_resource(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        form = self._forms.get(id(resource))
        if form is None or req.method == "OPTIONS" or self.accepts(self.presented(req, form)):
            return
        resp.status = 401
        resp.content_type = falcon.MEDIA_JSON
        resp.data = _REFUSALS[form]
        resp.complete = True  # falcon runs no responder
