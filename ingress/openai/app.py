"""The OpenAI-compatible app: ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``, ``POST /v1/embeddings`` (``embeddings.py``), Anthropic's
``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (``messages.py``), OpenAI's Responses API
(``POST /v1/responses``, ``GET`` / ``DELETE /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``:
``responses.py``), Triton's frontend's
``POST /v1/models/{name}/load`` and ``/unload`` (``model_management.py``), and vLLM's own routes:
``GET /health`` (ready), ``GET /version``, ``POST /tokenize`` and ``POST /detokenize``,
``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter`` (``adapters.py``); every answer carries
``X-Request-Id`` (``request_id.py``).

It is one more ingress of the group: the same router link and data plane as the
KServe ingress, so its requests share the router, the workers, the statistics and
``/metrics``, and it drains and restarts like the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.context import IngressContext
from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES
from conveyor.ingress.metrics import MetricsOptions, MetricsResource
from conveyor.ingress.openai.adapters import LoadLoraAdapter, UnloadLoraAdapter
from conveyor.ingress.openai.api_keys import ANTHROPIC_FORM, OPENAI_FORM, ApiKeys
from conveyor.ingress.openai.catalog import Catalog
from conveyor.ingress.openai.embeddings import Embeddings
from conveyor.ingress.openai.endpoints import ChatCompletions, Completions, EndpointOptions
from conveyor.ingress.openai.errors import error_handler, is_anthropic
from conveyor.ingress.openai.forms import OPENAI
from conveyor.ingress.openai.media import NO_MEDIA_OPTIONS, MediaOptions
from conveyor.ingress.openai.messages import CountTokens, Messages
from conveyor.ingress.openai.model_management import LoadModel, UnloadModel
from conveyor.ingress.openai.request_id import RequestIds
from conveyor.ingress.openai.response_store import MemoryStore, ResponseStore, SqliteStore, StoreLimits
from conveyor.ingress.openai.responses import CancelResponse, Responses, StoredResponses
from conveyor.ingress.openai.restricted import OpenAiRestrictions
from conveyor.ingress.openai.tokenization import Detokenize, Tokenize
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.router_link import RouterLink
from conveyor.ingress.server_metadata import server_version

# Open whatever --api-key says, as vLLM leaves them: a load balancer's probes and Prometheus carry no key.
OPEN_ROUTES = frozenset({"/health", "/health/ready", "/metrics", "/version"})


@dataclass(frozen=True, slots=True)
class OpenAiOptions:
    lora_separator: str = ""  # "": the model name never names an adapter (Triton's --lora-separator)
    default_max_tokens: int = 16
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # category -> the header it needs (--openai-restricted-api with --http-restricted-api: ingress/restricted.py)
    restricted: dict[str, Restriction] = field(default_factory=dict)
    tool_call_parser: str = ""  # a model's parser when its config names none (--tool-call-parser); "": none
    tokenizer: str = ""  # a model's tokenizer folder when it names none (--tokenizer); "": none
    api_keys: tuple[str, ...] = ()  # a model route needs one (--api-key); (): open
    error_form: str = OPENAI  # --openai-error-form: OpenAI's error bodies, or Triton's frontend's (forms.py)
    media: MediaOptions = NO_MEDIA_OPTIONS  # where a chat request's image_url may point (media.py)
    # the Responses API's stored responses: a file every ingress process of the group opens (--responses-store);
    # "": this process's memory alone (an app without a group)
    responses_store: str = ""
    responses_limits: StoreLimits = field(default_factory=StoreLimits)


class Models:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rows = [card.doc() for card in await self._catalog.cards()]
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"object": "list", "data": rows})


class Model:
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps((await self._catalog.card(name)).doc())


class Health:
    def __init__(self, link: RouterLink, ctx: IngressContext) -> None:
        self._link = link
        self._ctx = ctx

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        ready = not self._ctx.drain.draining and await self._link.server_ready()
        resp.status = 200 if ready else 503


class Version:
    """vLLM's ``{"version": ...}``, with Conveyor's version: the server answering is Conveyor."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"version": server_version()})


def build_openai_app(ctx: IngressContext, options: OpenAiOptions | None = None) -> falcon.asgi.App:
    options = options or OpenAiOptions()
    store: ResponseStore = (SqliteStore(options.responses_store, options.responses_limits)
                            if options.responses_store else MemoryStore(options.responses_limits))
    catalog = Catalog(ctx.dataplane, options.lora_separator, options.tool_call_parser, options.tokenizer)
    json_limit = ctx.dataplane.limits.max_json_bytes
    endpoint = EndpointOptions(options.max_body_bytes, json_limit, options.default_max_tokens, options.error_form,
                               options.media)
    # Each route, its resource and the API categories it serves: Triton's OpenAI frontend's for its own
    # routes (completions, chat and embeddings are inference, /v1/models model-repository), and the KServe
    # category of what it shows (the model list and cards are metadata too, /version the server's).
    routes: list[tuple[str, object, tuple[str, ...]]] = [
        ("/v1/models", Models(catalog), ("model-repository", "metadata")),
        ("/v1/models/{name}", Model(catalog), ("model-repository", "metadata")),
        # Triton's OpenAI frontend's model management (model_management.py)
        ("/v1/models/{name}/load", LoadModel(ctx.dataplane, catalog, options.max_body_bytes), ("model-repository",)),
        ("/v1/models/{name}/unload", UnloadModel(ctx.dataplane, options.max_body_bytes), ("model-repository",)),
        ("/v1/completions", Completions(ctx.dataplane, catalog, endpoint), ("inference",)),
        ("/v1/chat/completions", ChatCompletions(ctx.dataplane, catalog, endpoint), ("inference",)),
        # Anthropic's Messages API, on the chat path (messages.py)
        ("/v1/messages", Messages(ctx.dataplane, catalog, endpoint), ("inference",)),
        ("/v1/messages/count_tokens", CountTokens(catalog, endpoint), ("inference",)),
        # OpenAI's Responses API, on the chat path too (responses.py), its stored responses in the group's store
        ("/v1/responses", Responses(ctx.dataplane, catalog, endpoint, store), ("inference",)),
        ("/v1/responses/{response_id}", StoredResponses(store), ("inference",)),
        ("/v1/responses/{response_id}/cancel", CancelResponse(store), ("inference",)),
        ("/v1/embeddings", Embeddings(ctx.dataplane, catalog, options.max_body_bytes, json_limit, options.error_form),
         ("inference",)),
        ("/health", Health(ctx.link, ctx), ("health",)),
        # Triton's OpenAI frontend's readiness route (vLLM's is /health): the same answer.
        ("/health/ready", Health(ctx.link, ctx), ("health",)),
        ("/version", Version(), ("metadata",)),
        # Triton's OpenAI frontend serves the server's metrics on its own port too.
        ("/metrics", MetricsResource(ctx, MetricsOptions()), ("metrics",)),
        # /tokenize: the model's tokenizer at work
        ("/tokenize", Tokenize(catalog, options.max_body_bytes, json_limit), ("inference",)),
        ("/detokenize", Detokenize(catalog, options.max_body_bytes, json_limit), ("inference",)),
        ("/v1/load_lora_adapter", LoadLoraAdapter(ctx.dataplane, catalog), ("model-repository",)),
        ("/v1/unload_lora_adapter", UnloadLoraAdapter(ctx.dataplane, catalog), ("model-repository",)),
    ]
    guard = OpenAiRestrictions()
    keys = ApiKeys(options.api_keys)
    for path, resource, categories in routes:
        anthropic = is_anthropic(path)  # Anthropic's routes refuse in Anthropic's form, and take x-api-key
        guard.guard(resource, categories, options.restricted, anthropic=anthropic)
        if path not in OPEN_ROUTES:
            keys.guard(resource, ANTHROPIC_FORM if anthropic else OPENAI_FORM)
    # The key and the restriction first, before any other middleware reads the request; none at all unless set.
    app = falcon.asgi.App(cors_enable=False, middleware=[m for m in (keys, guard) if m] + [RequestIds()])
    app.req_options.strip_url_path_trailing_slash = True
    for path, resource, _ in routes:
        app.add_route(path, resource)
    render = error_handler(options.error_form)
    app.add_error_handler(Exception, render)
    app.add_error_handler(falcon.HTTPError, render)
    return app
