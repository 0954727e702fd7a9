"""The OpenAI ingress's error answers, rendered without a group."""

from __future__ import annotations

import falcon
import falcon.asgi
import falcon.testing

from conveyor.ingress.openai.errors import render_error
from conveyor.proto.errors import ConveyorError, Status

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
