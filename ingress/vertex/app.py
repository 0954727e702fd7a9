"""The Vertex AI endpoint (``--allow-vertex-ai``): Triton's routes on ``--vertex-ai-port``.

* ``AIP_HEALTH_ROUTE`` (GET): server readiness
* ``AIP_PREDICT_ROUTE`` (POST): a KServe v2 inference of the default model
  (``--vertex-ai-default-model``, else the only ready model)
* ``AIP_PREDICT_ROUTE`` with ``X-Vertex-Ai-Triton-Redirect: <route>`` (POST): the
  KServe v2 / Triton route ``/<route>`` (``v2/models/m/infer``, ``v2/models/m/config``,
  ``v2/repository/index``, ``metrics``, ...), with the method that route expects,
  since Vertex AI only sends POST; not the trace and logging routes; shared-memory
  registration and model load/unload are a 403 whatever the restricted-API headers say

Binary tensor data in a request is announced in the content type,
``application/vnd.vertex-ai-triton.binary+json;json-header-size=<N>``; answers are
the HTTP endpoint's own. Bodies are never compressed; errors use the HTTP endpoint's
statuses; any other route is a 400 with no body. As in Triton.
"""

from __future__ import annotations

import asyncio
import logging
import re

import orjson

from conveyor.deploy.runtime.leaving import exit_now
from conveyor.ingress.asgi_rewrite import (
    App,
    MisplacedBinaryMime,
    Receive,
    Scope,
    Send,
    binary_header_length,
    header,
    readdressed,
    reply,
)
from conveyor.ingress.context import IngressContext
from conveyor.ingress.default_model import DefaultModel
from conveyor.ingress.http.app import build_app
from conveyor.ingress.metrics import MetricsOptions, build_metrics_app
from conveyor.ingress.restricted import Restriction
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import ConveyorError, Status, triton_log_line
from conveyor.proto.exit_codes import START_REFUSED_CODE
from conveyor.proto.triton_cli import checks_endpoints_at_start

log = logging.getLogger(__name__)

BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT = b"x-vertex-ai-triton-redirect"
PREDICT_ROUTE_ENV = "AIP_PREDICT_ROUTE"
HEALTH_ROUTE_ENV = "AIP_HEALTH_ROUTE"
_IGNORED = (b"content-encoding", b"accept-encoding", b"inference-header-content-length")
# Redirected routes Triton serves with POST; every other one is read with GET.
_POST_SUFFIXES = ("/infer", "/register", "/unregister", "/index", "/load", "/unload")
# Routes Triton's Vertex AI server does not redirect to (vertex_ai_server.cc): the trace and logging
# extensions, answered like any other unknown route.
_NOT_REDIRECTED = re.compile(r"/v2/(?:logging|trace/setting|models/[^/]+(?:/versions/[^/]+)?/trace/setting)/?")
# Redirected routes Triton's Vertex AI server refuses with a 403 and no body, whatever the restricted-API headers
# say: shared-memory registration and model load/unload (only their status and the index are redirected).
_FORBIDDEN = re.compile(r"/v2/(?:(?:system|cuda)sharedmemory(?:/region/[^/]+)?/(?:register|unregister)"
                        r"|repository(?:/[^/]+)?/models/[^/]+/(?:load|unload))")
_NO_DEFAULT = "Expect the model repository contains only a single model if default model is not specified"
_START_CHECKS: set[asyncio.Task[None]] = set()
# How often the start-up check asks the router whether its start-up loads have settled (one control call each):
# Triton starts its endpoints once they have, and checks the default model then. The wait doubles up to the
# longest, so a server that never gets ready (a failed model under --strict-readiness) is asked seldom.
_START_POLL_S = 0.2
_START_POLL_MAX_S = 2.0


class VertexApp:
    def __init__(self, kserve: App, metrics: App, default: DefaultModel, predict_route: str,
                 health_route: str) -> None:
        self._kserve = kserve
        self._metrics = metrics
        self._default = default
        self._predict = predict_route
        self._health = health_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == self._health:
            await self._kserve(readdressed(scope, "/v2/health/ready"), receive, send)
            return
        if path != self._predict:
            await reply(send, 400)
            return
        redirect = header(scope, REDIRECT)
        if redirect is None:
            model = await self._default.get()
            if not model:
                await reply(send, 400, orjson.dumps({"error": _NO_DEFAULT}))
                return
            await self._redirect(scope, receive, send, f"/v2/models/{model}/infer")
            return
        if scope["method"] != "POST":
            await reply(send, 405)
            return
        target = "/" + redirect
        if target == "/metrics":
            await self._metrics(readdressed(scope, target, "GET"), receive, send)
        elif _NOT_REDIRECTED.fullmatch(target):
            await reply(send, 400)
        elif _FORBIDDEN.fullmatch(target):
            log.debug("Vertex AI redirect blocked: %s", target)
            await reply(send, 403)
        elif target == "/v2" or target.startswith("/v2/"):
            method = "POST" if target.endswith(_POST_SUFFIXES) else "GET"
            await self._redirect(scope, receive, send, target, method)
        else:
            await reply(send, 400)

    async def _redirect(self, scope: Scope, receive: Receive, send: Send, path: str, method: str | None = None) -> None:
        try:
            length = binary_header_length(header(scope, b"content-type"), BINARY_MIME)
        except MisplacedBinaryMime as error:
            await reply(send, 400, orjson.dumps({"error": str(error)}))
            return
        inner = readdressed(scope, path, method, drop=_IGNORED, add=(length,) if length else ())
        await self._kserve(inner, receive, send)


async def _ready(link: RouterClient) -> bool:
    try:
        return await link.server_ready()
    except ConveyorError:
        return False  # a router still starting (or restarting): asked again


async def default_model_problem(link: RouterClient, name: str) -> str:
    """Triton's check of the default model as its Vertex AI endpoint starts (VertexAiAPIServer::Create), once the
    router is ready: the model named must be in the index of ready models, or, none named, that index must hold
    exactly one entry. The message Triton refuses with; '' when the endpoint may start."""
    wait = _START_POLL_S
    while not await _ready(link):
        await asyncio.sleep(wait)
        wait = min(wait * 2, _START_POLL_MAX_S)
    rows = await link.repository_index(True)
    if not name:
        return "" if len(rows) == 1 else _NO_DEFAULT
    return "" if any(row["name"] == name for row in rows) else f"Expect the default model '{name}' is loaded"


async def _refuse_start_without_default(link: RouterClient, name: str) -> None:
    problem = await default_model_problem(link, name)
    if problem:
        refusal = ConveyorError(Status.INVALID_ARG, problem)
        log.error("%s", triton_log_line("failed to start Vertex AI service", refusal))
        exit_now(START_REFUSED_CODE)  # the supervisor stops the group: Triton's tritonserver exits 1


def build_vertex_app(ctx: IngressContext, *, predict_route: str, health_route: str, default_model: str,
                     max_body_bytes: int, restricted: dict[str, Restriction] | None = None,
                     metrics_restricted: dict[str, Restriction] | None = None) -> VertexApp:
    """``restricted``: the KServe routes' restrictions; ``metrics_restricted``: the redirect to ``metrics``'s.
    Under ``tritonserver`` the endpoint refuses the group's start as Triton's does when the default model is
    missing or ambiguous (``default_model_problem``); ``conveyor serve`` answers each prediction 400 instead."""
    if checks_endpoints_at_start():
        check = asyncio.get_running_loop().create_task(_refuse_start_without_default(ctx.link, default_model))
        _START_CHECKS.add(check)  # held: the loop keeps only a weak reference to a task
        check.add_done_callback(_START_CHECKS.discard)
    return VertexApp(
        build_app(ctx, max_body_bytes=max_body_bytes, restricted=restricted),
        build_metrics_app(ctx, MetricsOptions(allow_cpu=False, allow_gpu=False), metrics_restricted),
        DefaultModel(ctx.link, default_model, "", ready_only=True), predict_route, health_route,
    )
