"""``--http-restricted-api`` in the falcon app: a middleware installed only when some
category is restricted. Each resource names its category (``api``), so the check
is one dict lookup per request and a header read for restricted routes.

A resource that named no category would escape the check whatever is restricted (the trace
and logging routes once did): ``CategorizedApp`` refuses such a route when it is added, so
the app does not start with one.
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from conveyor.ingress.restricted import CATEGORIES, Restriction, http_refusal


class CategorizedApp(falcon.asgi.App):
    """A falcon ASGI app whose every route names its Triton API category (``resource.api``)."""

    def add_route(self, uri_template: str, resource: Any, **kwargs: Any) -> None:
        api = getattr(resource, "api", None)
        if api not in CATEGORIES:
            raise TypeError(f"route '{uri_template}': {type(resource).__name__} names no API category "
                            f"(api = {api!r}; expected one of {', '.join(CATEGORIES)})")
        super().add_route(uri_template, resource, **kwargs)


class RestrictedApis:
    def __init__(self, rules: dict[str, Restriction]) -> None:
        self._rules = rules

    async def process_resource(
        self, req: falcon.asgi.Request, resp: falcon.asgi.Response, resource: Any, params: dict[str, Any]
    ) -> None:
        if resource is None:  # no route: falcon answers 404
            return
        rule = self._rules.get(resource.api)
        if rule is not None and req.get_header(rule.header) != rule.value:
            # Rendered by errors.render_error as {"error": ...} with Triton's 403.
            raise falcon.HTTPForbidden(description=http_refusal(rule))
