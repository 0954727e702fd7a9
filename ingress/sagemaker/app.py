"""The SageMaker endpoint (``--allow-sagemaker``): Triton's routes on ``--sagemaker-port``.

* ``GET /ping``: server readiness (``SAGEMAKER_TRITON_PING_MODE=live``: liveness)
* ``POST /invocations``: a KServe v2 inference of the endpoint's model,
  ``SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`` or else the repository's only model; with
  ``SAGEMAKER_TRITON_INFERENCE_TYPE=generate`` (or ``generate_stream``) Triton's generate
  extension instead, its JSON object in and out (Server-Sent Events), as Triton 2.56+
* ``/models...``: the multi-model endpoint API (``multi_model.py``)

Bodies are KServe v2 inference requests and responses; binary tensor data is
announced in the content type, ``application/vnd.sagemaker-triton.binary+json;
json-header-size=<N>``, both ways. As in Triton, every failure is a 400 (507 when
the model ran out of memory) with ``{"error": message}``, bodies are never
compressed, and any other route is a 400 with no body. A generate request's failures
keep the generate endpoint's statuses, as Triton's (its SageMaker server hands those to
the plain HTTP server's handler).
"""

from __future__ import annotations

import os
import re

from conveyor.ingress.asgi_rewrite import (
    App,
    Message,
    MisplacedBinaryMime,
    Receive,
    Scope,
    Send,
    binary_content_type,
    binary_header_length,
    header,
    readdressed,
    reply,
)
from conveyor.ingress.context import IngressContext
from conveyor.ingress.default_model import DefaultModel
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.errors import error_body
from conveyor.ingress.restricted import Restriction, http_refusal
from conveyor.ingress.sagemaker import DEFAULT_MODEL_ROOT
from conveyor.ingress.sagemaker.multi_model import LoadedModels, build_multi_model_app, is_oom
from conveyor.proto.triton_cli import picks_the_only_model

BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
DEFAULT_MODEL_ENV = "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
PING_MODE_ENV = "SAGEMAKER_TRITON_PING_MODE"
INFERENCE_TYPE_ENV = "SAGEMAKER_TRITON_INFERENCE_TYPE"  # checked at start (deploy/cloud_options.py)
_UNSPECIFIED = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"  # Triton's name when none is set
_MODELS = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")
# Triton's SageMaker server ignores these: no compression, the header length is in the content type.
_IGNORED = (b"content-encoding", b"accept-encoding", b"inference-header-content-length", b"content-type")
_KEPT = (403, 405)  # statuses an inference's answer keeps (every other failure is a 400 or 507)


class SageMakerApp:
    def __init__(self, kserve: App, multi_model: App, loaded: LoadedModels,
                 default: DefaultModel, ping_mode: str = "ready", inference_type: str = "infer",
                 inference_rule: Restriction | None = None) -> None:
        self._kserve = kserve
        # Checked before anything else of an inference (as Triton's handlers do): no default model looked
        # up, no loaded name told apart from an unknown one, without the header.
        self._inference_rule = inference_rule
        self._generate = "" if inference_type == "infer" else inference_type
        self._multi_model = multi_model
        self._loaded = loaded
        self._default = default
        self._ping = "/v2/health/live" if ping_mode == "live" else "/v2/health/ready"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/ping":
            await self._kserve(readdressed(scope, self._ping), receive, send)
            return
        if path == "/invocations":
            if await self._refused(scope, send):
                return
            model = await self._default.get()
            if self._generate:
                inner = readdressed(scope, f"/v2/models/{model}/{self._generate}", drop=_IGNORED)
                await self._kserve(inner, receive, send)
            else:
                await self._infer(scope, receive, send, model)
            return
        match = _MODELS.fullmatch(path)
        if match is None:
            await reply(send, 400)
            return
        name, invoke = match.groups()
        if not invoke:
            await self._multi_model(scope, receive, send)
        elif scope["method"] != "POST":
            await reply(send, 400)
        elif await self._refused(scope, send):
            return
        elif name not in self._loaded:
            await reply(send, 404)
        else:
            target = header(scope, b"x-amzn-sagemaker-target-model") or name
            await self._infer(scope, receive, send, target)

    async def _refused(self, scope: Scope, send: Send) -> bool:
        """Whether an inference lacks the header ``inference`` needs: then refused, 403 in Triton's words."""
        rule = self._inference_rule
        if rule is None or header(scope, rule.header.lower().encode("latin-1")) == rule.value:
            return False
        await reply(send, 403, error_body(http_refusal(rule)))
        return True

    async def _infer(self, scope: Scope, receive: Receive, send: Send, model: str) -> None:
        try:
            length = binary_header_length(header(scope, b"content-type"), BINARY_MIME)
        except MisplacedBinaryMime as error:
            await reply(send, 400, error_body(str(error)))
            return
        inner = readdressed(scope, f"/v2/models/{model}/infer", drop=_IGNORED, add=(length,) if length else ())
        await self._kserve(inner, receive, _sagemaker_status(binary_content_type(send, BINARY_MIME)))


def _sagemaker_status(send: Send) -> Send:
    """Every failure of an inference as Triton's SageMaker server answers it: 400, or 507
    when the message says the model ran out of memory (405 for a wrong method stays)."""
    held: list[Message] = []

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400 and message["status"] != 405:
            held.append(dict(message))  # the status depends on the body
            return
        if held and message["type"] == "http.response.body":
            start = held.pop()
            start["status"] = 507 if is_oom(bytes(message.get("body", b"")).decode("utf-8", "replace")) else 400
            await send(start)
        await send(message)

    return wrapped


def build_sagemaker_app(ctx: IngressContext, *, max_body_bytes: int,
                        restricted: dict[str, Restriction] | None = None,
                        model_root: str = DEFAULT_MODEL_ROOT) -> SageMakerApp:
    """``restricted``: category -> the header it needs; ``model_root``: where multi-model loads' urls lie."""
    loaded = LoadedModels()
    name = os.environ.get(DEFAULT_MODEL_ENV, "") or ("" if picks_the_only_model() else _UNSPECIFIED)
    default = DefaultModel(ctx.link, name, _UNSPECIFIED)
    return SageMakerApp(
        build_app(ctx, max_body_bytes=max_body_bytes, restricted=restricted),
        build_multi_model_app(ctx.link, loaded, restricted, model_root), loaded, default,
        os.environ.get(PING_MODE_ENV, "ready"), os.environ.get(INFERENCE_TYPE_ENV) or "infer",
        (restricted or {}).get("inference"),
    )

