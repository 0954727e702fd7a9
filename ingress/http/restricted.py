"""``--http-restricted-api`` in the falcon app: a middleware installed only when some
category is restricted. Each resource names its category (``api``), so the check
is one dict lookup per request and a header read for restricted routes."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from conveyor.ingress.restricted import Restriction, http_refusal


class RestrictedApis:
    def __init__(self, rules: dict[str, Restriction]) -> None:
        self._rules = rules

    async def process_resource(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        rule = self._rules.get(getattr(resource, "api", ""))
        if rule is not None and req.get_header(rule.header) != rule.value:
            # Rendered by errors.render_error as {"error": ...} with Triton's 403.
            raise falcon.HTTPForbidden(description=http_refusal(rule))
