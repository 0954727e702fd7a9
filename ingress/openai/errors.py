"""The OpenAI port's error answers, in the form ``--openai-error-form`` names (``forms.py``).

``openai`` (``render_error``): OpenAI's error body, ``{"error": {"message", "type", "param", "code"}}``, with
the status the OpenAI API uses: 400 for a bad request, 404 for an unknown model (and adapter) or stored
response (``UnknownResponse``, the Responses API's), 413 for a body over --http-max-input-size (Triton's
frontend's ``content_too_large``), 503 when the group cannot serve now, 500 otherwise.

``triton`` (``render_triton_error``): what Triton's OpenAI frontend (FastAPI) answers. A body outside the
request's schema (``SchemaError``) is 422 ``{"detail": [...]}``, pydantic's account of each error
(``triton_schema.detail``); every other refusal is ``{"detail": message}`` with the same status as above,
but for an unknown model, which Triton's routes refuse with 400 ``Unknown model: <name>`` (404 from
``GET /v1/models/{name}``), and a route or method there is none of, FastAPI's ``Not Found`` / ``Method Not
Allowed``. The 413 is OpenAI's body in both (Triton's middleware answers so).

Every failure of the app goes through one of the two; a failure after a stream started is an event in OpenAI's
form, as vLLM's (Triton's frontend ends the stream without one).

Anthropic's routes (``/v1/messages``, ``messages.py``) answer in Anthropic's form in either, since Triton's
frontend has no such route: ``{"type": "error", "error": {"type", "message"}, "request_id"}``, with the
statuses Anthropic documents: 400 ``invalid_request_error``, 401 ``authentication_error``, 403
``permission_error``, 404 ``not_found_error``, 413 ``request_too_large``, 429 ``rate_limit_error``, 500
``api_error``, and 529 ``overloaded_error`` where the OpenAI routes answer 503 (the group cannot serve now;
the ``anthropic`` client retries it, after ``Retry-After``).
"""

from __future__ import annotations

import json
import logging
import os
from http import HTTPStatus
from typing import Any

import falcon
import falcon.asgi
import orjson

from conveyor.ingress.http.body import BodyTooLarge
from conveyor.ingress.http.errors import RETRY_AFTER
from conveyor.ingress.openai.forms import TRITON
from conveyor.ingress.openai.schema import SchemaError
from conveyor.ingress.openai.triton_schema import detail
from conveyor.proto.errors import ConveyorError, Status, http_status, internal

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error",
          503: "service_unavailable", 413: "invalid_request_error"}
_STATUS = {Status.INVALID_ARG: 400, Status.NOT_FOUND: 404, Status.UNAVAILABLE: 503, Status.UNSUPPORTED: 400,
           Status.INTERNAL: 500, Status.CLIENT_MISTAKE: 400}  # not Triton's API: a client's mistake is a 400


# Anthropic's routes: their errors are in Anthropic's form, whatever raised them and whatever the error form.
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    529: "overloaded_error"}
OVERLOADED = 529  # Anthropic's status where the OpenAI routes answer 503


class UnknownModel(ConveyorError):
    """NOT_FOUND: a model name that names no model (or adapter) served; ``triton``: Triton's frontend's words."""

    def __init__(self, name: str, message: str = "", triton: str = "") -> None:
        super().__init__(Status.NOT_FOUND, message or f"The model `{name}` does not exist.")
        self.name = name
        self.triton = triton or f"Unknown model: {name}"


class UnknownResponse(ConveyorError):
    """NOT_FOUND: a response id no stored response has (never stored, deleted, evicted or expired): OpenAI's 404,
    in vLLM's words, ``param`` the field that named it."""

    def __init__(self, response_id: str, param: str) -> None:
        super().__init__(Status.NOT_FOUND, f"Response with id '{response_id}' not found.")
        self.param = param


def unreadable(path: str, exc: Exception) -> ConveyorError:
    """A model's file (tokenizer, template, config) that cannot be read: the server logs where it is,
    the client learns which file of the model, not the server's folders."""
    log.error("cannot read '%s': %s", path, exc)
    reason = exc.strerror if isinstance(exc, OSError) else exc
    return internal(f"cannot read the model's '{os.path.basename(path)}': {reason}")


def status_of(error: ConveyorError) -> int:
    return _STATUS.get(error.status) or http_status(error.status)


def error_doc(error: ConveyorError) -> dict[str, Any]:
    if isinstance(error, UnknownResponse):
        return _doc(404, error.message, error.param)
    return _doc(status_of(error), error.message, "model" if error.status is Status.NOT_FOUND else None)


def _doc(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    code: str | int = "model_not_found" if status == 404 and param == "model" else status
    return {"error": {"message": message, "type": _TYPES.get(status, "server_error" if status >= 500 else
                                                             "invalid_request_error"),
                      "param": param, "code": code}}


def anthropic_status(status: int) -> int:
    return OVERLOADED if status == 503 else status


def anthropic_doc(error: ConveyorError, request_id: str | None = None) -> dict[str, Any]:
    return _anthropic(anthropic_status(status_of(error)), error.message, request_id)


def _anthropic(status: int, message: str, request_id: str | None = None) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    doc: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    if request_id:
        doc["request_id"] = request_id
    return doc


def is_anthropic(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def too_large_doc(size: int, limit: int) -> dict[str, Any]:
    """A body over --http-max-input-size, as Triton's frontend answers it (its RequestSizeLimitMiddleware):
    413, code ``content_too_large``, its words."""
    return {"error": {"message": f"Request size of {size} bytes exceeds the maximum allowed input size of {limit} "
                                 "bytes. Use --http-max-input-size to increase the limit.",
                      "type": "invalid_request_error", "code": "content_too_large"}}


def body_refusal(size: int, limit: int, path: str = "") -> tuple[int, bytes]:
    """The answer to a Content-Length over the limit, before the app reads anything (``BodyLimit``)."""
    doc = too_large_doc(size, limit)
    if is_anthropic(path):
        doc = _anthropic(413, doc["error"]["message"])
    return 413, orjson.dumps(doc)


def _answered_alike(req: falcon.asgi.Request, resp: falcon.asgi.Response, error: Exception) -> bool:
    """What both error forms answer the same way, answered: Anthropic's routes in Anthropic's form, a body over
    the limit as Triton's frontend answers it. False: the form's own answer is needed."""
    if is_anthropic(req.path):
        _render_anthropic(req, resp, error)
        return True
    if isinstance(error, BodyTooLarge):
        _answer(resp, 413, orjson.dumps(too_large_doc(error.size, error.limit)))
        return True
    return False


async def render_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, error: Exception,
                       params: dict[str, Any], *, ws: falcon.asgi.WebSocket | None = None) -> None:
    """``--openai-error-form openai``."""
    if resp is None or _answered_alike(req, resp, error):
        return
    if isinstance(error, ConveyorError):
        status, doc = status_of(error), error_doc(error)
    elif isinstance(error, falcon.HTTPError):
        status = error.status_code
        doc = _doc(status, error.description or error.title or str(status))
        if error.headers:
            resp.set_headers(error.headers)
    else:
        status = 500
        doc = _doc(500, _unhandled(req, error))
    _answer(resp, status, orjson.dumps(doc))


async def render_triton_error(req: falcon.asgi.Request, resp: falcon.asgi.Response | None, error: Exception,
                              params: dict[str, Any], *, ws: falcon.asgi.WebSocket | None = None) -> None:
    """``--openai-error-form triton``: Triton's frontend's statuses and FastAPI's bodies."""
    if resp is None or _answered_alike(req, resp, error):
        return
    doc: dict[str, Any]
    if isinstance(error, SchemaError):
        found = detail(error.kind, error.body, error.message)
        if found is None:  # FastAPI's words for a body it cannot read as text
            status, doc = 400, {"detail": "There was an error parsing the body"}
        else:
            status, doc = 422, {"detail": found}
    elif isinstance(error, UnknownModel):
        # Triton's frontend: its model card route answers 404, its inference routes 400 (a client error).
        status, doc = (404 if req.method == "GET" else 400), {"detail": error.triton}
    elif isinstance(error, ConveyorError):
        status, doc = status_of(error), {"detail": error.message}
    elif isinstance(error, falcon.HTTPError):
        status = error.status_code
        doc = {"detail": error.description or HTTPStatus(status).phrase}
        if error.headers:
            resp.set_headers(error.headers)
    else:
        status, doc = 500, {"detail": _unhandled(req, error)}
    _answer(resp, status, _dumps(doc))


def _render_anthropic(req: falcon.asgi.Request, resp: falcon.asgi.Response, error: Exception) -> None:
    if isinstance(error, BodyTooLarge):
        status, message = 413, too_large_doc(error.size, error.limit)["error"]["message"]
    elif isinstance(error, ConveyorError):
        status, message = status_of(error), error.message
    elif isinstance(error, falcon.HTTPError):
        status, message = error.status_code, error.description or error.title or str(error.status_code)
        if error.headers:
            resp.set_headers(error.headers)
    else:
        status, message = 500, _unhandled(req, error)
    status = anthropic_status(status)
    _answer(resp, status, orjson.dumps(_anthropic(status, message, req.context.get("request_id"))))


def error_handler(form: str) -> Any:
    return render_triton_error if form == TRITON else render_error


def _unhandled(req: falcon.asgi.Request, error: Exception) -> str:
    log.exception("unhandled error serving %s %s", req.method, req.path)
    return f"internal error: {type(error).__name__}" + (f": {error}" if str(error) else "")


def _dumps(doc: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(doc)
    except TypeError:  # an integer past 64 bits, echoed back in a 422's ``input``: Python's json writes it
        return json.dumps(doc).encode()


def _answer(resp: falcon.asgi.Response, status: int, data: bytes) -> None:
    resp.sse = None
    resp.status = status
    if status in (503, OVERLOADED):
        resp.set_header("Retry-After", RETRY_AFTER)  # the openai and anthropic clients' retries wait as told
    resp.content_type = falcon.MEDIA_JSON
    resp.data = data
