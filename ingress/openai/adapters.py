"""vLLM's ``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: LoRA adapters added to
a model and taken away while it serves. Bodies as vLLM's (``lora_name``, ``lora_path``,
``load_inplace``); a success is vLLM's plain-text line, a failure OpenAI's error body.

The router does the work (``router/runtime_lora.py``: every instance of the model gets the adapter,
and each one that loads later). vLLM's server has one base model; a group may serve several, so the
body may name the base model in ``base_model_name`` (Conveyor's field), which may be left out when one
model takes runtime adapters (the config parameter ``ALLOW_RUNTIME_LORA_UPDATING``, vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``).
"""

from __future__ import annotations

import falcon
import falcon.asgi
import msgspec

from conveyor.ingress.dataplane import DataPlane
from conveyor.ingress.http.body import read_body
from conveyor.ingress.openai.catalog import Catalog, LlmModel
from conveyor.ingress.openai.schema import decode
from conveyor.proto.errors import invalid_arg
from conveyor.proto.lora import RUNTIME_PARAMETER

MAX_BODY_BYTES = 64 << 10


class LoadRequest(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_path: str
    load_inplace: bool = False
    base_model_name: str | None = None  # Conveyor's: the model the adapter is for


class UnloadRequest(msgspec.Struct, kw_only=True):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; as there, the name alone says which adapter goes


def load_request(body: bytes) -> LoadRequest:
    """The body, checked as vLLM checks it first (the router checks names against what it serves)."""
    req = decode(body, LoadRequest)
    if not req.lora_name or not req.lora_path:
        raise invalid_arg("Both 'lora_name' and 'lora_path' must be provided.")
    return req


def unload_request(body: bytes) -> UnloadRequest:
    req = decode(body, UnloadRequest)
    if not req.lora_name:
        raise invalid_arg("'lora_name' needs to be provided to unload a LoRA adapter.")
    return req


def base_model(candidates: list[LlmModel]) -> str:
    """The model an adapter is for when the body names none: the one model that takes runtime
    adapters (``candidates``: the generative models served)."""
    allowing = [m.name for m in candidates if m.runtime_lora]
    if len(allowing) == 1:
        return allowing[0]
    if not allowing:
        raise invalid_arg(f"no model takes LoRA adapters at run time: set the parameter {RUNTIME_PARAMETER} "
                          "to \"true\" in a model's config.pbtxt")
    raise invalid_arg(f"several models take LoRA adapters at run time ({', '.join(sorted(allowing))}): "
                      "name one in 'base_model_name'")


def _plain(resp: falcon.asgi.Response, message: object) -> None:
    resp.content_type = falcon.MEDIA_TEXT
    resp.data = str(message).encode()


class LoadLoraAdapter:
    def __init__(self, dataplane: DataPlane, catalog: Catalog) -> None:
        self._dataplane = dataplane
        self._catalog = catalog

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = load_request(await read_body(req, resp, MAX_BODY_BYTES))
        model = request.base_model_name or base_model(await self._catalog.models())
        reply = await self._dataplane.link.lora_load(model, request.lora_name, request.lora_path,
                                                     request.load_inplace)
        self._catalog.forget_adapters()
        _plain(resp, reply.message)


class UnloadLoraAdapter:
    def __init__(self, dataplane: DataPlane, catalog: Catalog) -> None:
        self._dataplane = dataplane
        self._catalog = catalog

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        request = unload_request(await read_body(req, resp, MAX_BODY_BYTES))
        reply = await self._dataplane.link.lora_unload(request.lora_name)
        self._catalog.forget_adapters()
        _plain(resp, reply.message)
