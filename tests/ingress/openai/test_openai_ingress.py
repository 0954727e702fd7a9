"""The OpenAI-compatible ingress with the official ``openai`` client, against a running
group serving a stand-in model of Triton's vLLM contract (tests/support/openai_models.py): the
protocol's shapes, streaming, ``n``, ``stop``, usage, adapters through the model name,
errors, and a client that goes away; and, in the same group, Python models of the plain
``text_input`` / ``text_output`` contract, decoupled or not (tests/support/text_models.py), with
vLLM's ``/tokenize``, ``/detokenize``, ``/version`` and ``X-Request-Id``. The real engine:
tests/ingress/openai/test_openai_vllm_e2e.py."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from conveyor.deploy.example_repo import identity
from conveyor.deploy.ports import free_port
from tests.support import openai_models, text_models
from tests.support.group import Server, _listening, start_server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

MODEL = "fake_llm"
LIMITED = "fake_llm_limited"  # MAX_WAITING_REQUESTS 1
SEP = "_lora_"
OTHER = "identity_fp32"  # a model that is not generative (ONNX)
LIMIT_BYTES = 1 << 20  # the group's --http-max-input-size


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, int]]:
    repo = str(tmp_path_factory.mktemp("openai_models"))
    openai_models.build(repo)
    openai_models.build(repo, LIMITED)
    text_models.build(repo)
    identity(repo, OTHER)
    with open(os.path.join(repo, LIMITED, "config.pbtxt"), "a") as f:
        f.write('parameters { key: "MAX_WAITING_REQUESTS" value: { string_value: "1" } }\n')
    port = free_port()
    # Explicit mode (every model loaded at start): Triton's frontend's load and unload are allowed.
    srv = start_server(repo, f"oa{os.getpid()}", "--workers", "1", "--openai-port", str(port),
                       "--openai-address", "127.0.0.1", "--lora-separator", SEP, "--model-control-mode", "explicit",
                       "--load-model", "*", "--http-max-input-size", str(LIMIT_BYTES), grpc=False)
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    yield srv, port
    assert srv.stop() == 0
    assert srv.shm_segments() == []


@pytest.fixture(scope="module")
def client(group: tuple[Server, int]) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group[1]}/v1", api_key="none", max_retries=0, timeout=30)


def test_models_lists_the_model_and_its_adapters(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    # Every ready model, as Triton's frontend lists them: one that is not generative too.
    assert ids == [text_models.PLAIN, text_models.STREAMING, MODEL, f"{MODEL}{SEP}sql", f"{MODEL}{SEP}poet",
                   LIMITED, f"{LIMITED}{SEP}sql", f"{LIMITED}{SEP}poet", OTHER]
    assert client.models.retrieve(f"{MODEL}{SEP}sql").id == f"{MODEL}{SEP}sql"
    card = client.models.retrieve(OTHER).to_dict()
    assert (card["id"], card["owned_by"], card["root"], card["parent"]) == (OTHER, "Triton Inference Server", OTHER,
                                                                            None)
    with pytest.raises(openai.BadRequestError, match=f"`{OTHER}` is not a text generation model"):
        client.completions.create(model=OTHER, prompt="a")


def test_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="a b c", max_tokens=4)
    assert out.object == "text_completion" and out.model == MODEL and out.id.startswith("cmpl-")
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [(0, " a b c a", "length")]
    assert out.usage is not None
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 4, 7)


def test_completion_n_stop_and_echo(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="a b c", max_tokens=5, n=2, stop=["c"], echo=True)
    assert [(c.index, c.text, c.finish_reason) for c in out.choices] == [
        (0, "a b c a b", "stop"), (1, "a b c b", "stop")]
    assert out.usage is not None and out.usage.completion_tokens == 3


def test_completion_streams(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=MODEL, prompt="x y", max_tokens=3, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    texts = ["", ""]
    finish: list[str | None] = [None, None]
    for chunk in chunks[:-1]:
        assert chunk.usage is None
        for c in chunk.choices:
            texts[c.index] += c.text
            finish[c.index] = finish[c.index] or c.finish_reason
    assert texts == [" x y x", " y x y"] and finish == ["length", "length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (2, 6)


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client: openai.OpenAI) -> None:
    # vLLM's extension, which aiperf's --per-chunk-usage asks for: without it aiperf cannot tell
    # how many tokens a stream's first chunk held. Only with include_usage, as in vLLM.
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(client.completions.create(model=MODEL, prompt="x y", max_tokens=3, stream=True,
                                            extra_body={"stream_options": options}))
    assert [(c.choices[0].text, c.usage and (c.usage.prompt_tokens, c.usage.completion_tokens, c.usage.total_tokens))
            for c in chunks[:-1]] == [(" x", (2, 1, 3)), (" y", (2, 2, 4)), (" x", (2, 3, 5))]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=2, stream=True, extra_body={"stream_options": options}))
    assert [c.usage.completion_tokens if c.usage else None for c in chat] == [1, 2, 2]
    plain = list(client.completions.create(model=MODEL, prompt="x y", max_tokens=2, stream=True,
                                           extra_body={"stream_options": {"continuous_usage_stats": True}}))
    assert all(c.usage is None for c in plain)


def test_chat_applies_the_models_template(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    choice = out.choices[0]
    # The prompt the model saw is the template's: "<|user|> hi <|assistant|>".
    assert choice.message.role == "assistant" and choice.message.content == " <|user|> hi <|assistant|>"
    assert choice.finish_reason == "length"
    assert out.usage is not None and out.usage.prompt_tokens == 3


def test_chat_streams_role_first(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=2, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " <|user|> hi"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# The stand-in answers with the prompt's words: this one's are the user's turn, then a hermes tool call
# spread over several "tokens" (one per word), then the assistant's tag, where the answer stops.
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, 2]}}</tool_call>'


def test_auto_tool_choice_reads_calls_with_the_models_parser(client: openai.OpenAI) -> None:
    """The model's TOOL_CALL_PARSER (hermes) finds the call in its text, whole or streamed."""
    messages: Any = [{"role": "user", "content": CALL}]
    tools: Any = [TOOL]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=20,
                                         stop=["<|assistant|>"])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == " <|user|> "
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": [1, 2]}
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=tools, max_tokens=20,
                                                 stop=["<|assistant|>"], stream=True))
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) > 2  # the call's arguments came in pieces
    assert deltas[0].id is not None and deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 and d.id is None and d.function is not None and d.function.name is None
               for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"city": "Oslo", "days": [1, 2]}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == " <|user|> "
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_answers_in_text(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": CALL}]
    tools: Any = [TOOL]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice="none",
                                         max_tokens=2)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "length"
    assert out.choices[0].message.content == ' <|user|> <tool_call>{"name":'


def test_a_forced_tool_call_needs_the_models_parser(client: openai.OpenAI) -> None:
    """As vLLM without --tool-call-parser: ``required`` and a named function are refused, in its words, by a
    model that names no TOOL_CALL_PARSER (the streaming text model)."""
    messages: Any = [{"role": "user", "content": "a"}]
    tools: Any = [TOOL]
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    with pytest.raises(openai.BadRequestError, match='tool_choice=function "get_weather" requires --tool-call-parser'):
        client.chat.completions.create(model=text_models.STREAMING, messages=messages, tools=tools, tool_choice=named)
    with pytest.raises(openai.BadRequestError, match='tool_choice="required" requires --tool-call-parser'):
        client.chat.completions.create(model=text_models.STREAMING, messages=messages, tools=tools,
                                       tool_choice="required")


def test_adapter_through_the_model_name(client: openai.OpenAI) -> None:
    out = client.completions.create(model=f"{MODEL}{SEP}sql", prompt="q", max_tokens=2)
    assert out.choices[0].text == " sql:q sql:q" and out.model == f"{MODEL}{SEP}sql"


def test_unknown_model_and_adapter_are_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="a")
    assert err.value.code == "model_not_found" and "`nope` does not exist" in err.value.message
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model=f"{MODEL}{SEP}nope", messages=[{"role": "user", "content": "a"}])
    assert "no LoRA adapter 'nope'" in err.value.message and "sql, poet" in err.value.message


def test_bad_requests_are_400(group: tuple[Server, int], client: openai.OpenAI) -> None:
    # serve's default --openai-error-form: OpenAI's and vLLM's 400, not Triton's frontend's 422 (its test:
    # test_openai_error_forms_e2e.py).
    conn = http.client.HTTPConnection("127.0.0.1", group[1], timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a"}))
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (400, {"error": {
        "message": "invalid request: Object missing required field `model`", "type": "invalid_request_error",
        "param": None, "code": 400}})
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="a", max_tokens="many")  # type: ignore[call-overload]
    assert "max_tokens" in err.value.message
    with pytest.raises(openai.BadRequestError, match="suffix"):
        client.completions.create(model=MODEL, prompt="a", suffix="b")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="a", stream_options={"include_usage": True})


def test_model_error_before_the_stream_is_a_status(group: tuple[Server, int]) -> None:
    """The model refuses the request at once: the client gets a status, not a broken stream."""
    conn = http.client.HTTPConnection("127.0.0.1", group[1], timeout=30)
    # The catalog knows "sql" and "poet"; a model that refuses what the catalog lets through still answers.
    conn.request("POST", "/v1/completions", body=json.dumps({"model": MODEL, "prompt": "a", "n": 0}))
    r = conn.getresponse()
    assert r.status == 400 and json.loads(r.read())["error"]["type"] == "invalid_request_error"


def test_a_client_that_goes_away_cancels_its_request(group: tuple[Server, int]) -> None:
    srv, port = group
    marker = os.path.join(srv.repo, MODEL, "1", "cancelled")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions",
                 body=json.dumps({"model": MODEL, "prompt": "slow", "max_tokens": 200, "stream": True}))
    r = conn.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    conn.close()  # 200 tokens would take 10 s
    deadline = time.monotonic() + 5
    while not os.path.exists(marker):
        assert time.monotonic() < deadline, "the model's request was not cancelled"
        time.sleep(0.05)


def test_overload_is_a_503_in_openais_form_with_retry_after(group: tuple[Server, int]) -> None:
    """One request streams (it runs: its place is free), one waits for the instance (the limit),
    the next is refused at once."""
    srv, port = group

    def send(body: dict[str, object]) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"model": LIMITED, **body}))
        return conn

    running = send({"prompt": "slow", "max_tokens": 200, "stream": True})
    r = running.getresponse()
    assert r.status == 200 and r.readline().startswith(b"data: ")
    waiting = send({"prompt": "slow", "max_tokens": 2})
    pattern = re.compile(rf'^conveyor_waiting_requests{{model="{LIMITED}",version="1"}} 1$', re.M)
    deadline = time.monotonic() + 10
    while not pattern.search(metrics_text(srv)):
        assert time.monotonic() < deadline, "the second request never waited"
        time.sleep(0.05)
    refused = send({"prompt": "a"}).getresponse()
    error = json.loads(refused.read())["error"]
    assert refused.status == 503 and refused.getheader("Retry-After") == "1"
    assert error["type"] == "service_unavailable"
    assert "Exceeds maximum waiting requests" in error["message"] and "MAX_WAITING_REQUESTS 1" in error["message"]
    running.close()  # cancelled: the instance takes the waiting request
    assert waiting.getresponse().status == 200


def test_scales_like_the_other_ingress_kinds(group: tuple[Server, int], client: openai.OpenAI) -> None:
    import subprocess
    import sys

    def scale(n: int) -> str:
        out = subprocess.run([sys.executable, "-m", "conveyor.deploy.cli", "scale", "--group", group[0].group,
                              "openai-ingress", str(n)], capture_output=True, text=True, timeout=30, check=True)
        return out.stdout

    assert "openai-ingress=2" in scale(2)
    for _ in range(4):  # whichever process the kernel hands the connection to answers
        assert client.completions.create(model=MODEL, prompt="a", max_tokens=1).choices[0].text == " a"
    assert "openai-ingress=1" in scale(1)


# Python models of the plain text contract (tests/support/text_models.py): they answer the prompt's words
# reversed, so the answer shows the prompt they received.
STREAMING, PLAIN = text_models.STREAMING, text_models.PLAIN
HELLO: Any = [{"role": "user", "content": "hello world"}]  # its template: "<|user|> hello world <|assistant|>"


def test_a_python_model_chats_through_its_tokenizers_template(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model=STREAMING, messages=HELLO, max_tokens=3,
                                                           extra_headers={"X-Request-Id": "trace-42"})
    out = raw.parse()
    assert raw.headers["x-request-id"] == "trace-42" and out.id == "chatcmpl-trace-42"  # vLLM's ids
    assert out.choices[0].message.content == "<|assistant|> world hello"  # max_tokens reached the model
    assert out.choices[0].finish_reason == "stop"  # the model gives none
    # No counts from the model: its tokenizer's (the template writes special tokens itself: none added).
    assert out.usage is not None and (out.usage.prompt_tokens, out.usage.completion_tokens) == (4, 3)
    streamed = client.chat.completions.with_raw_response.create(
        model=STREAMING, messages=HELLO, max_tokens=3, stream=True, stream_options={"include_usage": True},
        extra_headers={"X-Request-Id": "trace-43"})
    assert streamed.headers["x-request-id"] == "trace-43"
    chunks = list(streamed.parse())
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].id == "chatcmpl-trace-43"
    assert [c.choices[0].delta.content for c in chunks[:-1]] == ["<|assistant|>", " world", " hello", ""]
    assert chunks[-2].choices[0].finish_reason == "stop"
    last = chunks[-1].usage
    assert last is not None and (last.prompt_tokens, last.completion_tokens, last.total_tokens) == (4, 3, 7)
    assert len({c.id for c in chunks}) == 1


def test_a_python_model_completes_with_its_per_field_inputs(client: openai.OpenAI) -> None:
    out = client.completions.create(model=STREAMING, prompt="hello big world", max_tokens=2, temperature=0.3,
                                    extra_body={"request_id": "body-7"})  # vLLM's field: the id without a header
    assert out.choices[0].text == "world big" and out.id == "cmpl-body-7"
    assert out.usage is not None and out.usage.prompt_tokens == 4  # "<s> hello big world": BOS added
    stop = client.completions.create(model=STREAMING, prompt="hello big world", stop=["big"])
    assert stop.choices[0].text == "world"  # stop reached the model as stop_words
    chunks = list(client.completions.create(model=STREAMING, prompt="a b c", max_tokens=5, stream=True, echo=True))
    assert "".join(c.choices[0].text for c in chunks) == "a b cc b a"


def test_a_model_that_is_not_decoupled_answers_and_streams_its_answer_as_one_chunk(client: openai.OpenAI) -> None:
    out = client.completions.create(model=PLAIN, prompt="a b c")
    assert out.choices[0].text == "c b a" and out.usage is None  # no tokenizer: no usage
    # No template: a plain transcript, one "role: content" line per message.
    chat = client.chat.completions.create(model=PLAIN, messages=[{"role": "user", "content": "hi there"}])
    assert chat.choices[0].message.content == "assistant: there hi user:"
    chunks = list(client.chat.completions.create(model=PLAIN, messages=[{"role": "user", "content": "hi there"}],
                                                 stream=True))
    assert len(chunks) == 1 and chunks[0].choices[0].finish_reason == "stop"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == "assistant: there hi user:"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=PLAIN, prompt="a", n=2)
    assert "n must be 1" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=PLAIN, messages=HELLO, response_format={"type": "json_object"})
    assert "guided decoding" in err.value.message


def _call(port: int, method: str, path: str, body: object = None,
          headers: dict[str, str] | None = None) -> tuple[int, http.client.HTTPResponse, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    return r.status, r, json.loads(data) if data else None


def _named(header: str) -> dict[str, float]:
    kind, _, report = header.partition(" ")
    if kind == "JSON":
        return dict(json.loads(report)["named_metrics"])
    assert kind == "TEXT", header
    return {k.removeprefix("named_metrics."): float(v) for k, v in (p.split("=") for p in report.split(", "))}


def test_a_gateway_that_asks_gets_the_models_load_in_orcas_header(group: tuple[Server, int]) -> None:
    """endpoint-load-metrics-format: TEXT or JSON, as vLLM's server answers it: the model's load as the
    answer starts (a stream sees itself running); nothing when not asked."""
    _, port = group
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 3}
    status, r, _ = _call(port, "POST", "/v1/completions", body, {"endpoint-load-metrics-format": "TEXT"})
    assert status == 200
    load = _named(r.getheader("endpoint-load-metrics") or "")
    assert set(load) == {"kv_cache_usage_perc", "num_requests_waiting", "num_requests_running"}
    assert load["kv_cache_usage_perc"] == 0.0  # no engine reports one
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", headers={"endpoint-load-metrics-format": "json"},
                 body=json.dumps({"model": LIMITED, "prompt": "slow", "max_tokens": 200, "stream": True}))
    streamed = conn.getresponse()
    report = streamed.getheader("endpoint-load-metrics") or ""
    assert streamed.status == 200 and report.startswith("JSON ")
    assert _named(report)["num_requests_running"] == 1.0
    conn.close()  # cancelled
    status, r, _ = _call(port, "POST", "/v1/completions", body)
    assert status == 200 and r.getheader("endpoint-load-metrics") is None
    status, r, _ = _call(port, "POST", "/v1/completions", body, {"endpoint-load-metrics-format": "BINARY"})
    assert status == 200 and r.getheader("endpoint-load-metrics") is None  # a format not served: none, as vLLM


def test_tokenize_detokenize_version_and_health_answer_as_vllms(group: tuple[Server, int]) -> None:
    port = group[1]
    status, r, doc = _call(port, "POST", "/tokenize", {"model": STREAMING, "prompt": "hello world"})
    assert status == 200 and doc == {"count": 3, "max_model_len": None, "tokens": [1, 5, 6], "token_strs": None}
    assert len(r.getheader("X-Request-Id") or "") == 32  # none sent: a fresh one
    _, _, doc = _call(port, "POST", "/tokenize", {"model": STREAMING, "prompt": "hello world",
                                                  "add_special_tokens": False, "return_token_strs": True})
    assert doc["tokens"] == [5, 6] and doc["token_strs"] == ["hello", "world"]
    _, _, doc = _call(port, "POST", "/tokenize", {"model": STREAMING, "messages": [{"role": "user", "content": "hi"}]})
    assert doc["tokens"] == [2, 7, 3]  # "<|user|> hi <|assistant|>", as chat writes it
    status, r, doc = _call(port, "POST", "/detokenize", {"model": STREAMING, "tokens": [1, 5, 6]},
                           {"X-Request-Id": "d-1"})
    assert (status, doc, r.getheader("X-Request-Id")) == (200, {"prompt": "<s> hello world"}, "d-1")
    status, _, doc = _call(port, "POST", "/tokenize", {"model": PLAIN, "prompt": "a"})
    assert status == 400 and "has no tokenizer" in doc["error"]["message"]
    status, _, doc = _call(port, "POST", "/tokenize", {"prompt": "a"})  # several models: which one?
    assert status == 400 and "`model` is required" in doc["error"]["message"]
    status, _, doc = _call(port, "POST", "/detokenize", {"model": STREAMING, "tokens": [99]})
    assert status == 400 and "out of the vocabulary" in doc["error"]["message"]
    status, _, doc = _call(port, "GET", "/version")
    assert status == 200 and re.fullmatch(r"\d+\.\d+\.\d+.*", doc["version"])
    status, r, _ = _call(port, "GET", "/health", headers={"X-Request-Id": "h"})
    assert status == 200 and r.getheader("X-Request-Id") == "h"


def _post(port: int, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", path)
        r = conn.getresponse()
        data = r.read()
        return r.status, json.loads(data) if r.getheader("Content-Type") == "application/json" else data
    finally:
        conn.close()


def test_tritons_frontend_loads_and_unloads_models(group: tuple[Server, int], client: openai.OpenAI) -> None:
    """``POST /v1/models/{name}/load|unload``: Triton's frontend's statuses and words (its FastAPI ``detail``)."""
    port = group[1]
    assert _post(port, f"/v1/models/{LIMITED}/load") == (400, {"detail": f"Model '{LIMITED}' is already loaded"})
    assert _post(port, f"/v1/models/{LIMITED}/unload") == (200, {"status": "success", "model": LIMITED})
    assert LIMITED not in [m.id for m in client.models.list()]
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=LIMITED, prompt="a", max_tokens=1)  # at once: not from before the unload
    assert _post(port, f"/v1/models/{LIMITED}/unload") == (400, {"detail": f"Unknown model: {LIMITED}"})
    status, card = _post(port, f"/v1/models/{LIMITED}/load")
    assert status == 200 and (card["id"], card["object"], card["owned_by"]) == (LIMITED, "model",
                                                                                 "Triton Inference Server")
    assert card["created"] > 0
    assert client.completions.create(model=LIMITED, prompt="a b", max_tokens=2).choices[0].text == " a b"
    # A model that is not generative loads and unloads the same; of concurrent loads one loads, as Triton's lock.
    assert _post(port, f"/v1/models/{OTHER}/unload")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        codes = sorted(s for s, _ in pool.map(lambda _: _post(port, f"/v1/models/{OTHER}/load"), range(4)))
    assert codes == [200, 400, 400, 400] and OTHER in [m.id for m in client.models.list()]
    status, doc = _post(port, "/v1/models/nowhere/load")
    assert (status, doc) == (500, {"detail": "Failed to load model 'nowhere': failed to load 'nowhere', failed to "
                                             "poll from model repository"})
    assert _post(port, "/v1/models/nowhere/unload") == (400, {"detail": "Unknown model: nowhere"})
    # Triton's test_load_unload_invalid_model_name: path traversal and blank names are its 400, other paths 404.
    for name, expected in (("..", 400), ("%20%20", 400), ("%0A%09", 400), ("", 404), ("model/", 404),
                           ("../../etc", 404), ("model/subdir", 404)):
        for call in ("load", "unload"):
            assert _post(port, f"/v1/models/{name}/{call}")[0] == expected, (name, call)


def _too_large(port: int, path: str, head: bytes, body: bytes) -> tuple[int, Any]:
    """Send the whole request, as an HTTP client does, then read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: t\r\n%s\r\n" % (path.encode(), head) + body)
        reply = b""
        while chunk := sock.recv(1 << 16):
            reply += chunk
    status_line, _, rest = reply.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_body_over_the_limit_is_tritons_413_and_the_client_reads_it(group: tuple[Server, int]) -> None:
    """Triton's frontend's 413 ``content_too_large`` on every POST route, for a Content-Length over the limit
    (refused before a byte is read) and a chunked body crossing it; the client, still sending when refused,
    gets to read it: 32 MiB is past what the sockets' buffers hold, and a connection closed with them
    unread is reset."""
    port, over = group[1], 32 << 20
    message = (f"Request size of {{}} bytes exceeds the maximum allowed input size of {LIMIT_BYTES} bytes. Use "
               "--http-max-input-size to increase the limit.")
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/embeddings", f"/v1/models/{OTHER}/load"):
        status, doc = _too_large(port, path, b"Content-Length: %d\r\n" % over, b"x" * over)
        assert (status, doc) == (413, {"error": {"message": message.format(over), "type": "invalid_request_error",
                                                 "code": "content_too_large"}}), path
        chunks = b"%x\r\n%s\r\n1\r\nx\r\n0\r\n\r\n" % (LIMIT_BYTES, b"x" * LIMIT_BYTES)
        status, doc = _too_large(port, path, b"Transfer-Encoding: chunked\r\n", chunks)
        assert (status, doc["error"]["code"]) == (413, "content_too_large"), path
        assert doc["error"]["message"] == message.format(LIMIT_BYTES + 1), path
