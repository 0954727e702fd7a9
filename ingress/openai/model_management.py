"""Triton's OpenAI frontend's model management: ``POST /v1/models/{name}/load`` and
``POST /v1/models/{name}/unload`` (``--model-control-mode=explicit`` only).

Each is the router's ``repository_load`` / ``repository_unload`` (the KServe ``/v2/repository`` calls),
asked with Triton's frontend's rules (``router/lifecycle/calls.py``: ``check_frontend_call``): a load of a
model loaded or loading, an unload of a model not loaded, and a call in another mode are refused. A load
answers once the model is ready, with its model card; an unload at once, ``{"status": "success", "model"}``.
A failure is answered as Triton's FastAPI routes answer it, ``{"detail": message}``: 400 for what its
engine calls a client's error (those refusals, and what the server refuses as an invalid argument, as a
name with path traversal), with its "Failed to load model '<name>': " before the server's words; 500 for
the rest (a model the repository does not hold: Triton's "failed to poll from model repository").
"""

from __future__ import annotations

import time

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai.catalog import Card, Catalog
from conveyor.proto.errors import ConveyorError, Status

# The router's answers that are Triton's frontend's own refusals, in its words as they are.
_REFUSALS = (Status.UNSUPPORTED, Status.ALREADY_EXISTS, Status.NOT_FOUND)
# Client errors besides (400): what the server refuses as an invalid argument, and a load cancelled by an
# unload of the same model (Triton's frontend, whose lock lets the load finish first, never meets this).
_CLIENT_ERRORS = (Status.INVALID_ARG, Status.CANCELLED)


def _detail(resp: falcon.asgi.Response, status: int, message: str) -> None:
    resp.status = status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = orjson.dumps({"detail": message})


def _route(name: str) -> None:
    """``/v1/models//load`` is no route of Triton's (its path parameter is never empty): a 404 as any other."""
    if not name:
        raise falcon.HTTPNotFound()


def _failed(resp: falcon.asgi.Response, what: str, name: str, error: ConveyorError) -> None:
    if error.status in _REFUSALS:
        _detail(resp, 400, error.message)
    else:
        status = 400 if error.status in _CLIENT_ERRORS else 500
        _detail(resp, status, f"Failed to {what} model '{name}': {error.message}")


class LoadModel:
    def __init__(self, dataplane: DataPlane, catalog: Catalog, max_body_bytes: int) -> None:
        self._dataplane = dataplane
        self._catalog = catalog
        self._max_body_bytes = max_body_bytes

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        _route(name)
        await read_body(req, resp, self._max_body_bytes)  # none is taken; one over the limit is a 413, as Triton's
        try:
            await self._dataplane.link.repository_load(name, frontend=True)
        except ConveyorError as exc:
            _failed(resp, "load", name, exc)
            return
        finally:
            self._dataplane.models.forget(name)
        try:
            card = await self._catalog.card(name)
        except ConveyorError:  # unloaded again meanwhile (a concurrent unload): the card of the load done
            card = Card(name, int(time.time()), name)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps(card.doc())


class UnloadModel:
    def __init__(self, dataplane: DataPlane, max_body_bytes: int) -> None:
        self._dataplane = dataplane
        self._max_body_bytes = max_body_bytes

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        _route(name)
        await read_body(req, resp, self._max_body_bytes)
        try:
            await self._dataplane.link.repository_unload(name, frontend=True)
        except ConveyorError as exc:
            _failed(resp, "unload", name, exc)
            return
        finally:
            self._dataplane.models.forget(name)
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"status": "success", "model": name})
