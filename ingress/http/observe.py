"""Triton's trace and logging extensions over HTTP: the router keeps the settings."""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi

from conveyor.ingress.http.codec import encode_json
from conveyor.ingress.router_link import RouterLink
from conveyor.proto.errors import invalid_arg


async def _body(req: falcon.asgi.Request) -> dict[str, Any]:
    doc = await req.get_media()
    if not isinstance(doc, dict):
        raise invalid_arg("the request body must be a JSON object")
    return doc


class TraceSetting:
    """``GET|POST /v2[/models/{model}]/trace/setting``."""

    def __init__(self, link: RouterLink) -> None:
        self._link = link

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str = "") -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.control("trace_settings", model=model))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str = "") -> None:
        settings = await _body(req)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.control("trace_settings", model=model, settings=settings))


class Logging:
    """``GET|POST /v2/logging``."""

    def __init__(self, link: RouterLink) -> None:
        self._link = link

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.control("log_settings"))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        settings = await _body(req)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.control("log_settings", settings=settings))


def add_observability_routes(app: falcon.asgi.App, link: RouterLink) -> None:
    trace = TraceSetting(link)
    app.add_route("/v2/trace/setting", trace)
    app.add_route("/v2/models/{model}/trace/setting", trace)
    app.add_route("/v2/logging", Logging(link))
