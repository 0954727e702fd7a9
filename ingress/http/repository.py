"""Triton's model repository extension over HTTP: index, load, unload.

The router owns the lifecycle (``router/lifecycle/``); a load call returns once
the model has loaded or failed, as in Triton.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.http.deep_json import is_depth_error, shallow_object
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import invalid_arg

Request = falcon.asgi.Request
Response = falcon.asgi.Response
_MAX_BODY = 256 << 20  # a load may carry model files


class Index:
    api = "model-repository"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_post(self, req: Request, resp: Response) -> None:
        body = await _json_body(req)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("Invalid value for 'ready': expected a boolean")
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(await self._link.repository_index(ready))


class Load:
    api = "model-repository"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_post(self, req: Request, resp: Response, model: str) -> None:
        params = _parameters(await _json_body(req))
        config = params.pop("config", "")
        if not isinstance(config, str):
            raise invalid_arg("Unable to parse 'config': expected a JSON string")
        files: dict[str, bytes] = {}
        for key, value in params.items():
            if key.startswith("file:"):
                files[key[5:]] = _b64(key, value)
        await self._link.repository_load(model, config, files)
        resp.status = 200


class Unload:
    api = "model-repository"

    def __init__(self, link: RouterClient) -> None:
        self._link = link

    async def on_post(self, req: Request, resp: Response, model: str) -> None:
        params = _parameters(await _json_body(req))
        dependents = params.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise invalid_arg("Unable to parse 'unload_dependents': expected a boolean")
        await self._link.repository_unload(model, dependents)
        resp.status = 200


def add_repository_routes(app: falcon.asgi.App, link: RouterClient) -> None:
    app.add_route("/v2/repository/index", Index(link))
    app.add_route("/v2/repository/models/{model}/load", Load(link))
    app.add_route("/v2/repository/models/{model}/unload", Unload(link))


async def _json_body(req: Request) -> dict[str, Any]:
    raw = await req.stream.read(_MAX_BODY + 1)
    if len(raw) > _MAX_BODY:
        raise invalid_arg("the request body is too large")
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        body = None
        if is_depth_error(exc):
            try:
                body = shallow_object(raw)  # as Triton, which parses any depth
            except orjson.JSONDecodeError as again:
                exc = again
        if body is None:
            raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_arg("the request body must be a JSON object")
    return body


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    params = body.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid_arg("Unable to parse 'parameters': expected a JSON object")
    return dict(params)


def _b64(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise invalid_arg(f"Unable to parse '{key}': expected base64 content")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_arg(f"Unable to parse '{key}': expected base64 content") from None
