"""Triton's system and CUDA shared-memory extensions over HTTP.

Thin adapters: the router keeps the registry (one namespace for every ingress),
these resources only check the JSON bodies' form.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.proto.control import RouterClient
from conveyor.proto.errors import invalid_arg

Request = falcon.asgi.Request
Response = falcon.asgi.Response
_MAX_REGISTER_BODY = 64 << 10


class Status:
    api = "shared-memory"

    def __init__(self, link: RouterClient, kind: str) -> None:
        self._link = link
        self._kind = kind

    async def on_get(self, req: Request, resp: Response, name: str = "") -> None:
        rows = await self._link.shm_status(self._kind, name)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(rows)


class Unregister:
    api = "shared-memory"

    def __init__(self, link: RouterClient, kind: str) -> None:
        self._link = link
        self._kind = kind

    async def on_post(self, req: Request, resp: Response, name: str = "") -> None:
        await self._link.shm_unregister(self._kind, name)
        resp.status = 200


class Register:
    api = "shared-memory"

    def __init__(self, link: RouterClient, kind: str) -> None:
        self._link = link
        self._kind = kind

    async def on_post(self, req: Request, resp: Response, name: str) -> None:
        body = await _json_body(req)
        byte_size = _count(body, "byte_size", required=True)
        if self._kind == "system":
            key = body.get("key")
            if not isinstance(key, str) or not key:
                raise invalid_arg("Shared memory register request has no 'key' field")
            await self._link.shm_register(self._kind, name, byte_size, key=key, offset=_count(body, "offset"))
        else:
            await self._link.shm_register(self._kind, name, byte_size, handle=_raw_handle(body),
                                          device_id=_count(body, "device_id"))
        resp.status = 200


def add_shared_memory_routes(app: falcon.asgi.App, link: RouterClient) -> None:
    for kind, prefix in (("system", "/v2/systemsharedmemory"), ("cuda", "/v2/cudasharedmemory")):
        status, unregister = Status(link, kind), Unregister(link, kind)
        app.add_route(prefix + "/status", status)
        app.add_route(prefix + "/region/{name}/status", status)
        app.add_route(prefix + "/unregister", unregister)
        app.add_route(prefix + "/region/{name}/unregister", unregister)
        app.add_route(prefix + "/region/{name}/register", Register(link, kind))


async def _json_body(req: Request) -> dict[str, Any]:
    if req.content_length is not None and req.content_length > _MAX_REGISTER_BODY:
        raise invalid_arg("Shared memory register request body is too large")
    raw = await req.stream.read(_MAX_REGISTER_BODY + 1)
    if len(raw) > _MAX_REGISTER_BODY:
        raise invalid_arg("Shared memory register request body is too large")
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_arg("Shared memory register request must be a JSON object")
    return body


def _count(body: dict[str, Any], key: str, *, required: bool = False) -> int:
    value = body.get(key)
    if value is None:
        if required:
            raise invalid_arg(f"Shared memory register request has no '{key}' field")
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid_arg(f"Shared memory register request: '{key}' must be a non-negative integer")
    return value


def _raw_handle(body: dict[str, Any]) -> bytes:
    handle = body.get("raw_handle")
    b64 = handle.get("b64") if isinstance(handle, dict) else None
    if not isinstance(b64, str):
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
    try:
        return base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t") from None
