"""``--openai-error-form triton`` on a running group: the OpenAI port refuses as Triton's OpenAI frontend does
(FastAPI's 422 with pydantic's ``detail`` for a body outside its schema, ``{"detail": message}`` for its own
refusals, 400 for an unknown model and 404 from its model card), read by the official ``openai`` client and
plain HTTP as Triton's tests read them; what the group serves is served as before. serve's default form:
tests/ingress/openai/test_openai_ingress.py."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from conveyor.deploy.ports import free_port
from tests.support import text_models
from tests.support.group import Server, _listening, start_server

LEVEL = "e2e"

MODEL = text_models.PLAIN
USER: Any = [{"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    repo = str(tmp_path_factory.mktemp("text_models"))
    text_models.build(repo)
    port = free_port()
    srv = start_server(repo, f"of{os.getpid()}", "--workers", "1", "--openai-port", str(port),
                       "--openai-address", "127.0.0.1", "--openai-error-form", "triton", grpc=False)
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    yield srv, port
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def client(group: tuple[Server, int]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group[1]}/v1", api_key="none", max_retries=0, timeout=30)


def _request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def test_a_missing_field_is_fastapis_422(group: tuple[Server, int]) -> None:
    status, doc = _request(group[1], "POST", "/v1/completions", {"prompt": "hello"})
    assert (status, doc) == (422, {"detail": [{"type": "missing", "loc": ["body", "model"], "msg": "Field required",
                                               "input": {"prompt": "hello"}}]})
    status, doc = _request(group[1], "POST", "/v1/chat/completions", {"model": MODEL, "messages": [{}]})
    assert status == 422 and doc["detail"][0]["msg"] == "Field required"  # Triton's test's reading
    assert doc["detail"][0]["loc"] == ["body", "messages", 0, "ChatCompletionRequestSystemMessage", "content"]


def test_a_wrong_type_or_value_is_fastapis_422(group: tuple[Server, int], client: openai.OpenAI) -> None:
    status, doc = _request(group[1], "POST", "/v1/embeddings", {"model": 123, "input": "hello"})
    assert status == 422 and doc["detail"][0] == {"type": "string_type", "loc": ["body", "model", "str"],
                                                  "msg": "Input should be a valid string", "input": 123}
    status, doc = _request(group[1], "POST", "/v1/completions", {"model": MODEL, "prompt": "hello", "top_p": 1.1})
    assert (status, doc) == (422, {"detail": [{"type": "less_than_equal", "loc": ["body", "top_p"],
                                               "msg": "Input should be less than or equal to 1", "input": 1.1,
                                               "ctx": {"le": 1.0}}]})
    # Triton's test_openai_client.py reads it through the client (openai 1.x writes the body in the error's text).
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(model=MODEL, messages=USER, logprobs=True, top_logprobs=25, max_tokens=5)
    assert refused.value.body == {"detail": [{"type": "less_than_equal", "loc": ["body", "top_logprobs"],
                                              "msg": "Input should be less than or equal to 20", "input": 25,
                                              "ctx": {"le": 20}}]}


def test_tritons_own_refusals_are_its_detail(group: tuple[Server, int], client: openai.OpenAI) -> None:
    status, doc = _request(group[1], "POST", "/v1/completions", {"model": MODEL, "prompt": ""})
    assert (status, doc) == (400, {"detail": "prompt must be non-empty"})
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="hello", stream=False, stream_options={"include_usage": True})
    assert refused.value.body == {"detail": "`stream_options` can only be used when `stream` is True"}


def test_an_unknown_model_is_400_and_its_card_404(group: tuple[Server, int]) -> None:
    for path, body in [("/v1/completions", {"model": "nope", "prompt": "hello"}),
                       ("/v1/chat/completions", {"model": "nope", "messages": USER})]:
        assert _request(group[1], "POST", path, body) == (400, {"detail": "Unknown model: nope"})
    assert _request(group[1], "GET", "/v1/models/nope") == (404, {"detail": "Unknown model: nope"})
    assert _request(group[1], "GET", "/v1/nothing") == (404, {"detail": "Not Found"})


def test_what_the_schema_takes_is_served(client: openai.OpenAI) -> None:
    answer = client.completions.create(model=MODEL, prompt="hello world", max_tokens=2, temperature=2.0)
    assert answer.choices[0].text == "world hello"
    chat = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=1)
    assert chat.choices[0].message.content
