"""The OpenAI ingress's error answers, rendered without a group."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import falcon
import falcon.asgi
import falcon.testing

from conveyor.ingress.openai.catalog import Catalog
from conveyor.ingress.openai.errors import render_error
from conveyor.ingress.openai.model_management import LoadModel, UnloadModel
from conveyor.proto.errors import ConveyorError, Status, not_found
from tests.support.fake_http import FakeLink

LEVEL = "unit"


class _Refusing:
    def __init__(self, error: ConveyorError) -> None:
        self.error = error

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        raise self.error


def _answer(error: ConveyorError) -> falcon.testing.Result:
    app = falcon.asgi.App()
    app.add_error_handler(Exception, render_error)
    app.add_route("/v1/chat/completions", _Refusing(error))
    return falcon.testing.TestClient(app).simulate_post("/v1/chat/completions", json={})


def test_a_refusal_for_overload_tells_the_client_when_to_retry() -> None:
    # The openai client retries a 503 after the Retry-After it is given.
    r = _answer(ConveyorError(Status.UNAVAILABLE, "Exceeds maximum queue size"))
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json["error"]["type"] == "service_unavailable"


def test_a_client_mistake_has_no_retry_after() -> None:
    r = _answer(ConveyorError(Status.INVALID_ARG, "bad"))
    assert r.status_code == 400 and "Retry-After" not in r.headers


def _management(answer: object, call: str = "load") -> falcon.testing.Result:
    """``POST /v1/models/m/<call>`` with the router's ``answer`` (a result, or an error it raises)."""
    link = FakeLink({"repository_load": answer, "repository_unload": answer, "lora_adapters": {"adapters": {},
                                                                                               "generation": 0}})

    async def gone(model: str, version: str) -> None:
        raise not_found(f"Request for unknown model: '{model}' is not found")  # unloaded again at once

    models = SimpleNamespace(forget=lambda name: None, get=gone, generation=0)
    dataplane: Any = SimpleNamespace(link=link, models=models)
    app = falcon.asgi.App()
    app.add_error_handler(Exception, render_error)
    app.add_route("/v1/models/{name}/load", LoadModel(dataplane, Catalog(dataplane), 1 << 20))
    app.add_route("/v1/models/{name}/unload", UnloadModel(dataplane, 1 << 20))
    return falcon.testing.TestClient(app).simulate_post(f"/v1/models/m/{call}")


def test_model_management_answers_as_tritons_fastapi_routes() -> None:
    """Triton's frontend's {"detail"} body: its own refusals as they are, 400 for a client's error with its
    "Failed to load model" before the server's words, 500 for the rest."""
    for status, message, expected in [
        (Status.ALREADY_EXISTS, "Model 'm' is already loaded", (400, "Model 'm' is already loaded")),
        (Status.INVALID_ARG, "invalid model name", (400, "Failed to load model 'm': invalid model name")),
        # A load cancelled by an unload of the model (Triton's lock would have let it finish): the clients' doing.
        (Status.CANCELLED, "'m' was unloaded while it was loading",
         (400, "Failed to load model 'm': 'm' was unloaded while it was loading")),
        (Status.CLIENT_MISTAKE, "failed to load 'm', failed to poll from model repository",
         (500, "Failed to load model 'm': failed to load 'm', failed to poll from model repository")),
    ]:
        r = _management(ConveyorError(status, message))
        assert (r.status_code, r.json) == (expected[0], {"detail": expected[1]}), status
    r = _management(ConveyorError(Status.NOT_FOUND, "Unknown model: m"), "unload")
    assert (r.status_code, r.json) == (400, {"detail": "Unknown model: m"})
    assert _management(None, "unload").json == {"status": "success", "model": "m"}
    # A load done, then an unload of the model before its card is read (Triton's stress test): the load's card.
    r = _management(None)
    assert r.status_code == 200 and (r.json["id"], r.json["object"], r.json["owned_by"]) == (
        "m", "model", "Triton Inference Server")
