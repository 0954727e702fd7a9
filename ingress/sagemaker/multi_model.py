"""SageMaker's multi-model endpoint API, as Triton implements it (its sagemaker_server.cc).

``POST /models {"model_name": <hash>, "url": <dir>}`` registers the directory that
holds the model as a repository of its own, its model directory served under the
target model's name (the ``X-Amzn-SageMaker-Target-Model`` header, else ``model_name``),
then loads it. ``GET /models`` lists the loaded ones that are ready, ``GET
/models/<hash>`` names one, ``DELETE /models/<hash>`` unloads it (and the ensembles
using it) and unregisters its repository. ``POST /models/<hash>/invoke`` is an
inference (``app.py``). The loaded list lives in this process, as in Triton's.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.http.errors import error_body
from conveyor.ingress.http.restricted import CategorizedApp, RestrictedApis
from conveyor.ingress.restricted import Restriction
from conveyor.ingress.sagemaker import DEFAULT_MODEL_ROOT
from conveyor.proto.control import RouterClient
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.repository_files import read_text

log = logging.getLogger(__name__)

TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"
# Never a repository, however spelled (``//proc``, ``/./sys``, ``/x/../dev``, a symlink): the kernel's own trees.
_FORBIDDEN_ROOTS = ("/dev", "/proc", "/sys")
_HASH = r"[0-9A-Za-z._]+"  # a path segment as Triton's model_path_regex_ takes it
_ENSEMBLE = re.compile(r'platform:(\s)*"ensemble"')
# Messages that mean the model did not fit: SageMaker expects 507 for them (Triton's list).
OOM_MARKERS = (
    "CUDA out of memory", "CUDA_OUT_OF_MEMORY", "Out of memory", "Out Of Memory", "out of memory", "MemoryError",
    "OutOfMemory", "OOM", "Dst tensor is not initialized", "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY", "CUDNN_STATUS_NOT_INITIALIZED", "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED", "Failed to allocate memory", "failed to allocate memory",
    "No space left on device",
)


def is_oom(message: str) -> bool:
    return any(marker in message for marker in OOM_MARKERS)


@dataclass(frozen=True)
class LoadedModel:
    target: str  # the name the model is served under
    repository: str  # the registered repository (modelUrl in the answers)


class LoadedModels(dict[str, LoadedModel]):
    """model_name (SageMaker's hash) -> what was loaded for it."""


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def _lexical(path: str) -> str:
    """``path`` absolute and normal, as Triton's ``absolute(lexically_normal())`` makes it: POSIX lets
    ``normpath`` keep a leading ``//`` (``//proc/self``), which the kernel and Triton read as ``/``."""
    path = os.path.normpath(os.path.abspath(path))
    return "/" + path.lstrip("/") if path.startswith("//") else path


def checked_url(url: str, model_root: str = DEFAULT_MODEL_ROOT) -> str:
    """A load's ``url`` as the directory to load, or the refusal (400): never under ``/dev``, ``/proc`` or
    ``/sys``, lexically or once symlinks are resolved, and of Triton's form ``<root>/<hash>/model[/<subdir>]``
    (``--sagemaker-model-root``, Triton's ``/opt/ml/models``). Errors name the client's ``url`` only."""
    path = _lexical(url)
    if _under(path, _FORBIDDEN_ROOTS) or _under(os.path.realpath(path), _FORBIDDEN_ROOTS):
        log.error("refused SageMaker load of url '%s' (%s)", url, os.path.realpath(path))
        raise ConveyorError(
            Status.INVALID_ARG, f'Invalid URL: {url}. "url" property value cannot start with /dev/, /proc/, or /sys/.')
    root = _lexical(model_root).rstrip("/")
    if not re.fullmatch(re.escape(root) + rf"/{_HASH}/model(?:/{_HASH})?", path):
        # Triton's words, naming its default root when that is the one in force.
        raise ConveyorError(
            Status.INVALID_ARG,
            f"Invalid \"url\" '{url}': expected a path of the form {root}/<hash>/model[/<subdir>]")
    return path


def model_location(url: str) -> tuple[str, str]:
    """The repository to register and the model directory in it, for a load's ``url``.

    ``url`` holding config.pbtxt is the model directory itself; otherwise it is a
    repository whose model is its ensemble's directory, or its (only) subdirectory."""
    if os.path.isfile(os.path.join(url, "config.pbtxt")):
        return os.path.dirname(url), os.path.basename(url)
    subdirs = sorted(d for d in os.listdir(url) if os.path.isdir(os.path.join(url, d))) if os.path.isdir(url) else []
    chosen = subdirs[-1] if subdirs else ""
    for d in subdirs:
        try:  # on the event loop: never a FIFO's wait (proto/repository_files.py)
            if _ENSEMBLE.search(read_text(os.path.join(url, d, "config.pbtxt"), errors="replace")):
                chosen = d
        except OSError:
            continue  # the router's load says what is wrong with it
    return url, chosen


_VALUE_STARTS = frozenset(b'{["-0123456789tfn')


def _parse_error(raw: bytes, exc: orjson.JSONDecodeError) -> str:
    """Why ``raw`` is not JSON, in RapidJSON's words (Triton's parser) where the first value cannot start:
    ``The document is empty. at N`` / ``Invalid value. at N``; else orjson's."""
    text = raw.lstrip(b" \t\r\n")
    at = len(raw) - len(text)
    if not text:
        return f"The document is empty. at {at}"
    if text[0] not in _VALUE_STARTS:
        return f"Invalid value. at {at}"
    return str(exc)


class _Base:
    api = "model-repository"

    def __init__(self, link: RouterClient, loaded: LoadedModels, model_root: str = DEFAULT_MODEL_ROOT) -> None:
        self._link = link
        self._loaded = loaded
        self._model_root = model_root


class Models(_Base):
    """``/models``: list (GET) and load (POST)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        rows: list[dict[str, str]] = []
        for name, model in list(self._loaded.items()):
            if await self._link.model_ready(model.target):
                rows.append({"modelName": name, "modelUrl": model.repository})
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"models": rows})

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raw = await req.stream.readall()
        try:
            body: Any = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as exc:
            raise ConveyorError(Status.INVALID_ARG,
                                f"failed to parse the request JSON buffer: {_parse_error(raw, exc)}") from None
        if not isinstance(body, dict):
            raise ConveyorError(Status.INVALID_ARG, "the load model request must be a JSON object")
        name, url = body.get("model_name", ""), body.get("url", "")
        if not isinstance(name, str) or not isinstance(url, str) or not url:
            raise ConveyorError(Status.INVALID_ARG, "the load model request needs 'model_name' and 'url' strings")
        url = checked_url(url, self._model_root)
        target = req.get_header(TARGET_MODEL) or name
        repository, subdir = model_location(url)
        log.info("Loading SageMaker TargetModel: %s from %s", target, url)
        await self._link.repository_register(repository, {subdir: target})
        try:
            await self._link.repository_load(target, "", {})
        except ConveyorError:
            await self._link.repository_unregister(repository)
            raise
        self._loaded[name] = LoadedModel(target, repository)
        resp.status = 200


class Model(_Base):
    """``/models/<hash>``: describe (GET) and unload (DELETE)."""

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        model = self._loaded.get(name)
        if model is None:
            resp.status = 404
            return
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"modelName": name, "modelUrl": model.repository})

    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, name: str) -> None:
        model = self._loaded.get(name)
        if model is None:
            resp.status = 404
            return
        log.info("Unloading SageMaker TargetModel: %s", model.target)
        await self._link.repository_unload(model.target, unload_dependents=True)
        del self._loaded[name]
        await self._link.repository_unregister(model.repository)
        resp.status = 200


async def _render_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, error: Exception,
                        params: dict[str, Any], **_: Any) -> None:
    """Triton's SageMaker answers: 409 for a name already in use, 507 for a load that ran
    out of memory, 400 for every other failure; ``{"error": message}``."""
    if resp is None:
        return
    if isinstance(error, falcon.HTTPError):
        resp.status = error.status_code
        message = error.description or ""
    elif isinstance(error, ConveyorError):
        message = error.message
        resp.status = 409 if error.status is Status.ALREADY_EXISTS else 507 if is_oom(message) else 400
    else:
        log.exception("unhandled error serving %s %s", req.method, req.path)
        resp.status, message = 500, f"internal error: {type(error).__name__}"
    resp.content_type = falcon.MEDIA_JSON
    resp.data = error_body(message)


def build_multi_model_app(link: RouterClient, loaded: LoadedModels, restricted: dict[str, Restriction] | None = None,
                          model_root: str = DEFAULT_MODEL_ROOT) -> falcon.asgi.App:
    app = CategorizedApp(middleware=[RestrictedApis(restricted)] if restricted else [])
    app.add_error_handler([Exception, falcon.HTTPError], _render_error)
    models = Models(link, loaded, model_root)
    app.add_route("/models", models)
    app.add_route("/models/", models)
    app.add_route("/models/{name}", Model(link, loaded))
    return app
