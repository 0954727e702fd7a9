"""``--openai-error-form``: the OpenAI port's refusals in OpenAI's form (``{"error": {...}}``, serve's default) or
in Triton's OpenAI frontend's (FastAPI: 422 with pydantic's ``detail`` for a body outside its request schema,
``{"detail": message}`` otherwise), through the real endpoints without a group (every case here is refused
before a model is asked). The expected 422 bodies are what FastAPI 0.136 with pydantic 2.14 answer for Triton's
``schemas/openai.py`` models (triton-inference-server/server e1db8a6), recorded once from that app."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import falcon
import falcon.asgi
import falcon.testing
import msgspec
import pytest

from conveyor.ingress.openai.app import Model
from conveyor.ingress.openai.catalog import Catalog
from conveyor.ingress.openai.embeddings import Embeddings
from conveyor.ingress.openai.endpoints import ChatCompletions, Completions, EndpointOptions
from conveyor.ingress.openai.errors import error_handler
from conveyor.ingress.openai.fastapi_errors import Float, Int, Optional
from conveyor.ingress.openai.forms import OPENAI, TRITON
from conveyor.ingress.openai.schema import ChatRequest, CompletionRequest, EmbeddingRequest, SchemaError
from conveyor.ingress.openai.triton_schema import _MODELS, decode_triton, detail
from conveyor.proto.errors import not_found
from tests.support.fake_http import FakeLink

LEVEL = "unit"

USER = [{"role": "user", "content": "hi"}]
_MISSING = {"type": "missing", "msg": "Field required", "input": {}}


def _app(form: str) -> falcon.testing.TestClient:
    """The OpenAI port's inference routes and model card, over a group that serves no model."""
    async def unknown(name: str, version: str) -> None:
        raise not_found(f"Request for unknown model: '{name}' is not found")

    link = FakeLink({"lora_adapters": {"adapters": {}, "generation": 0}})
    dataplane: Any = SimpleNamespace(link=link, models=SimpleNamespace(get=unknown, generation=0),
                                     drain=SimpleNamespace(admit=lambda: None))
    catalog = Catalog(dataplane)
    options = EndpointOptions(1 << 20, 0, 16, form)
    app = falcon.asgi.App()
    app.add_route("/v1/completions", Completions(dataplane, catalog, options))
    app.add_route("/v1/chat/completions", ChatCompletions(dataplane, catalog, options))
    app.add_route("/v1/embeddings", Embeddings(dataplane, catalog, 1 << 20, 0, form))
    app.add_route("/v1/models/{name}", Model(catalog))
    app.add_error_handler(Exception, error_handler(form))
    app.add_error_handler(falcon.HTTPError, error_handler(form))
    return falcon.testing.TestClient(app)


def _post(client: falcon.testing.TestClient, path: str, body: Any) -> tuple[int, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.simulate_post(path, body=raw, headers={"Content-Type": "application/json"})
    return r.status_code, r.json


# (route, body, FastAPI's detail for Triton's model)
CASES: list[tuple[str, Any, list[dict[str, Any]]]] = [
    ("/v1/completions", {}, [{**_MISSING, "loc": ["body", "model"]}, {**_MISSING, "loc": ["body", "prompt"]}]),
    ("/v1/completions", {"model": "m", "prompt": "x", "temperature": 2.1}, [
        {"type": "less_than_equal", "loc": ["body", "temperature"], "msg": "Input should be less than or equal to 2",
         "input": 2.1, "ctx": {"le": 2.0}}]),
    ("/v1/completions", {"model": "m", "prompt": "x", "ignore_eos": 123}, [
        {"type": "bool_parsing", "loc": ["body", "ignore_eos"],
         "msg": "Input should be a valid boolean, unable to interpret input", "input": 123}]),
    ("/v1/completions", {"model": "m", "prompt": "x", "logprobs": 7}, [  # Triton's bound (vLLM's: 20)
        {"type": "less_than_equal", "loc": ["body", "logprobs"], "msg": "Input should be less than or equal to 5",
         "input": 7, "ctx": {"le": 5}}]),
    ("/v1/completions", {"model": "m", "prompt": "x", "zz": 1}, [
        {"type": "extra_forbidden", "loc": ["body", "zz"], "msg": "Extra inputs are not permitted", "input": 1}]),
    ("/v1/completions", {"model": 1, "prompt": "x"}, [
        {"type": "string_type", "loc": ["body", "model", "str"], "msg": "Input should be a valid string", "input": 1},
        {"type": "enum", "loc": ["body", "model", "enum[Model1]"],
         "msg": "Input should be 'gpt-3.5-turbo-instruct', 'davinci-002' or 'babbage-002'", "input": 1,
         "ctx": {"expected": "'gpt-3.5-turbo-instruct', 'davinci-002' or 'babbage-002'"}}]),
    # msgspec takes a list of anything; Conveyor's prompt check refuses it, and Triton's model before it.
    ("/v1/completions", {"model": "m", "prompt": [None]}, [
        {"type": "string_type", "loc": ["body", "prompt", "str"], "msg": "Input should be a valid string",
         "input": [None]},
        {"type": "string_type", "loc": ["body", "prompt", "list[str]", 0], "msg": "Input should be a valid string",
         "input": None},
        {"type": "int_type", "loc": ["body", "prompt", "list[int]", 0], "msg": "Input should be a valid integer",
         "input": None},
        {"type": "list_type", "loc": ["body", "prompt", "list[PromptItem]", 0], "msg": "Input should be a valid list",
         "input": None}]),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "seed": 18446744073709551616}', [
        {"type": "less_than_equal", "loc": ["body", "seed"],
         "msg": "Input should be less than or equal to 9223372036854775807", "input": 18446744073709551616,
         "ctx": {"le": 9223372036854775807}}]),
    ("/v1/completions", b'{"model": ', [
        {"type": "json_invalid", "loc": ["body", 10], "msg": "JSON decode error", "input": {},
         "ctx": {"error": "Expecting value"}}]),
    ("/v1/completions", b"[1]", [
        {"type": "model_attributes_type", "loc": ["body"],
         "msg": "Input should be a valid dictionary or object to extract fields from", "input": [1]}]),
    ("/v1/chat/completions", {"model": "m", "messages": []}, [
        {"type": "too_short", "loc": ["body", "messages"],
         "msg": "List should have at least 1 item after validation, not 0", "input": [],
         "ctx": {"field_type": "List", "min_length": 1, "actual_length": 0}}]),
    ("/v1/chat/completions", {"model": "m", "messages": [{}]}, [
        {**_MISSING, "loc": ["body", "messages", 0, message, name]} for message, names in [
            ("ChatCompletionRequestSystemMessage", ["content", "role"]),
            ("ChatCompletionRequestUserMessage", ["content", "role"]),
            ("ChatCompletionRequestAssistantMessage", ["role"]),
            ("ChatCompletionRequestToolMessage", ["role", "content", "tool_call_id"]),
            ("ChatCompletionRequestFunctionMessage", ["role", "content", "name"])] for name in names]),
    ("/v1/chat/completions", {"model": "m", "messages": USER, "top_logprobs": 25, "logprobs": True}, [
        {"type": "less_than_equal", "loc": ["body", "top_logprobs"], "msg": "Input should be less than or equal to 20",
         "input": 25, "ctx": {"le": 20}}]),
    # Taken by msgspec, refused later by the tool plan; Triton's model refuses it first.
    ("/v1/chat/completions", {"model": "m", "messages": USER, "tool_choice": "bad"}, [
        {"type": "enum", "loc": ["body", "tool_choice", "enum[ChatCompletionToolChoiceOption1]"],
         "msg": "Input should be 'none', 'auto' or 'required'", "input": "bad",
         "ctx": {"expected": "'none', 'auto' or 'required'"}},
        {"type": "model_attributes_type", "loc": ["body", "tool_choice", "ChatCompletionNamedToolChoice"],
         "msg": "Input should be a valid dictionary or object to extract fields from", "input": "bad"}]),
    ("/v1/embeddings", {"model": "m", "input": ""}, [
        {"type": "too_short", "loc": ["body", "input"], "msg": "Value should have at least 1 item after validation, "
         "not 0", "input": "", "ctx": {"field_type": "Value", "min_length": 1, "actual_length": 0}}]),
    ("/v1/embeddings", {"model": "m", "input": 123}, [
        {"type": "string_type", "loc": ["body", "input", "str"], "msg": "Input should be a valid string", "input": 123},
        {"type": "list_type", "loc": ["body", "input", "list[int]"], "msg": "Input should be a valid list",
         "input": 123}]),
    ("/v1/embeddings", {"model": "m", "input": "x", "encoding_format": "invalid"}, [
        {"type": "literal_error", "loc": ["body", "encoding_format"], "msg": "Input should be 'float' or 'base64'",
         "input": "invalid", "ctx": {"expected": "'float' or 'base64'"}}]),
]


@pytest.mark.parametrize(("path", "body", "detail"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_body_outside_tritons_schema_is_fastapis_422(path: str, body: Any, detail: list[dict[str, Any]]) -> None:
    triton = _app(TRITON)
    assert _post(triton, path, body) == (422, {"detail": detail})
    # The same body in OpenAI's form: a 400 with OpenAI's error body (a value of vLLM's range is served).
    status, doc = _post(_app(OPENAI), path, body)
    assert status in (400, 404) and set(doc) == {"error"}, (status, doc)


def test_tritons_refusals_are_its_detail_and_status() -> None:
    triton, openai = _app(TRITON), _app(OPENAI)
    # An unknown model: Triton's routes answer 400 (its engine's client error), its model card 404.
    for path, body in [("/v1/completions", {"model": "nope", "prompt": "a"}),
                       ("/v1/chat/completions", {"model": "nope", "messages": USER}),
                       ("/v1/embeddings", {"model": "nope", "input": "a"})]:
        assert _post(triton, path, body) == (400, {"detail": "Unknown model: nope"})
        status, doc = _post(openai, path, body)
        assert (status, doc["error"]["code"]) == (404, "model_not_found")
    assert _post(triton, "/v1/embeddings", {"model": "", "input": "a"}) == (400, {"detail": "Unknown model: "})
    r = triton.simulate_get("/v1/models/nope")
    assert (r.status_code, r.json) == (404, {"detail": "Unknown model: nope"})
    r = openai.simulate_get("/v1/models/nope")
    assert (r.status_code, r.json["error"]["message"]) == (404, "The model `nope` does not exist.")
    # Conveyor's own refusals of what Triton's model takes, with Triton's words where its engine has them.
    for body, message in [({"prompt": "", "model": "m"}, "prompt must be non-empty"),
                          ({"prompt": "a", "model": "m", "suffix": "b"}, "suffix is not currently supported"),
                          ({"prompt": "a", "model": "m", "best_of": 2},
                           "best_of is no longer supported in vLLM backend, removed from vLLM V1 engine"),
                          ({"prompt": "a", "model": "m", "stream_options": {"include_usage": True}},
                           "`stream_options` can only be used when `stream` is True")]:
        assert _post(triton, "/v1/completions", body) == (400, {"detail": message})
        status, doc = _post(openai, "/v1/completions", body)
        assert (status, doc["error"]["message"]) == (400, message)
    assert _post(triton, "/v1/chat/completions", {"model": "m", "messages": USER, "top_logprobs": 2}) == (
        400, {"detail": "`top_logprobs` can only be used when `logprobs` is True"})
    # What Triton's engine refuses and Conveyor serves as vLLM's server does (OpenAI's form: on to the model).
    for path, body, message in [
            ("/v1/completions", {"prompt": "a", "model": "m", "n": 2, "best_of": 1},
             "best_of is no longer supported in vLLM backend, removed from vLLM V1 engine"),
            ("/v1/completions", {"prompt": "a", "model": "m", "n": 2},
             "Received n=2, but only single choice (n=1) is currently supported"),
            ("/v1/chat/completions", {"messages": USER, "model": "m", "n": 3},
             "Received n=3, but only single choice (n=1) is currently supported"),
            ("/v1/completions", {"prompt": "a", "model": "m", "logit_bias": {"0": 0}}, "logit bias is not supported"),
            ("/v1/chat/completions", {"messages": USER, "model": "m", "logit_bias": {"0": 0}},
             "logit bias is not currently supported")]:
        assert _post(triton, path, body) == (400, {"detail": message})
        assert _post(openai, path, body)[0] == 404  # the model, unknown here, is asked for
    # Starlette's answers for a route or a method there is none of.
    r = triton.simulate_get("/v1/nothing")
    assert (r.status_code, r.json) == (404, {"detail": "Not Found"})
    r = triton.simulate_delete("/v1/completions")
    assert (r.status_code, r.json) == (405, {"detail": "Method Not Allowed"})


def test_a_value_pydantics_lax_mode_takes_is_taken() -> None:
    """Triton's model coerces what pydantic's lax mode does (a number as text, 0 and 1 as booleans)."""
    request = decode_triton(b'{"model": "m", "prompt": "x", "temperature": "0.5", "echo": 1, "max_tokens": "3"}',
                            CompletionRequest)
    assert (request.temperature, request.echo, request.max_tokens) == (0.5, True, 3)


def test_the_decoder_refuses_what_the_schema_says_it_refuses() -> None:
    """The two halves of triton_schema.py agree: each bound of Triton's models is a bound of the request's
    decoding, and a value one past it is a 422 that names the field."""
    bodies: dict[type, dict[str, Any]] = {CompletionRequest: {"model": "m", "prompt": "x"},
                                          ChatRequest: {"model": "m", "messages": USER},
                                          EmbeddingRequest: {"model": "m", "input": "x"}}
    seen = 0
    for kind, model in _MODELS.items():
        for name, node, _ in model.fields:
            inner = node.inner if isinstance(node, Optional) else node
            if not isinstance(inner, (Int, Float)) or (inner.ge is None and inner.le is None):
                continue
            step = 1 if isinstance(inner, Int) else 0.5
            for value in ([inner.ge - step] if inner.ge is not None else []) + (
                    [inner.le + step] if inner.le is not None else []):
                body = msgspec.json.encode({**bodies[kind], name: value})
                with pytest.raises(SchemaError) as refused:
                    decode_triton(body, kind)
                found = detail(kind, body, refused.value.message)
                assert found is not None and found[0]["loc"] == ["body", name], (kind, name, found)
                seen += 1
            bound = inner.le if inner.le is not None else inner.ge
            decode_triton(msgspec.json.encode({**bodies[kind], name: bound}), kind)  # the bound itself is taken
    assert seen >= 25


def test_the_openai_form_is_unchanged() -> None:
    """serve's default: a body outside the schema is OpenAI's 400, as vLLM's server answers."""
    status, doc = _post(_app(OPENAI), "/v1/completions", {"prompt": "x"})
    assert status == 400 and doc["error"]["type"] == "invalid_request_error"
    assert doc["error"]["message"] == "invalid request: Object missing required field `model`"
    # Values of vLLM's range past Triton's model's are no refusal in this form (the model is unknown here).
    status, doc = _post(_app(OPENAI), "/v1/completions", {"model": "m", "prompt": "x", "temperature": 2.1})
    assert (status, doc["error"]["code"]) == (404, "model_not_found")
