"""Triton's trace and logging extensions over HTTP: the router keeps the settings.

The bodies are JSON whatever their Content-Type says (``curl -d`` sends a form's type), as in Triton.
A client may not set the log or trace file (``proto/start_only.py``): the router refuses it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.http.codec import encode_json
from conveyor.ingress.http.deep_json import is_depth_error, shallow_object
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import invalid_arg
from conveyor.proto.start_only import refuse_log_file, refuse_trace_file

# A settings body is a handful of short members; 1 MiB holds any real one many times over and bounds
# what one request makes the ingress read and parse.
MAX_SETTINGS_BODY = 1 << 20


async def _body(req: falcon.asgi.Request, refuse_file: Callable[[Mapping[str, Any]], None]) -> dict[str, Any]:
    """The settings in the request's JSON body ({} when empty, as Triton); ``refuse_file`` is the
    file check, made here only for a body too deep to send on (the router makes it for the others)."""
    raw = await req.stream.read(MAX_SETTINGS_BODY + 1)
    if len(raw) > MAX_SETTINGS_BODY:
        raise invalid_arg("the request body is too large")
    if not raw:
        return {}
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if is_depth_error(exc):
            # Triton parses any depth and refuses a client's file before it looks at the other members.
            try:
                members = shallow_object(raw)
            except orjson.JSONDecodeError:
                pass
            else:
                refuse_file(members)
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, dict):
        raise invalid_arg("the request body must be a JSON object")
    return doc


class TraceSetting:
    """``GET|POST /v2[/models/{model}]/trace/setting``."""

    api = "trace"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str = "") -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.trace_settings(model))

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, model: str = "") -> None:
        settings = await _body(req, refuse_trace_file)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.trace_settings(model, settings))


class Logging:
    """``GET|POST /v2/logging``."""

    api = "logging"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.log_settings())

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        settings = await _body(req, refuse_log_file)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = encode_json(await self._link.log_settings(settings))


def add_observability_routes(app: falcon.asgi.App, link: RouterClient) -> None:
    trace = TraceSetting(link)
    app.add_route("/v2/trace/setting", trace)
    app.add_route("/v2/models/{model}/trace/setting", trace)
    app.add_route("/v2/logging", Logging(link))
