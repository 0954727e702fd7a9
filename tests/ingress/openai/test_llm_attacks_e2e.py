"""One LLM request cannot take the group down: the attacks that did, against the real engine (the tiny Llama
on the session's vLLM group, tests/support/vllm_group.py), each refused at once with a 400 in the OpenAI error
form (vLLM's words where vLLM has a limit of its own), on every LLM route: the OpenAI ingress, Triton's
``generate`` and ``generate_stream``, and KServe infer (the vLLM backend's own check). ``n`` of 2^31 grew the
OpenAI ingress to ~20 GiB in seconds: here its memory stays flat. After each attack another client's request
is served. vLLM's fields that were ignored reach the engine and change the answer. The limits themselves:
tests/proto/test_llm_limits.py; the ingress's checks without a group: test_openai_limits.py."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from typing import Any

import openai
import pytest

from conveyor.proto import llm_limits as lim
from tests.support import tiny_llama
from tests.support.group import pids_of
from tests.support.h2_watch import IngressWatch
from tests.support.vllm_group import MODEL, VllmGroup, spend
from tests.support.vllm_reference import CHAT, MAX_TOKENS, PROMPT

LEVEL = "e2e"

tiny_llama.require_vllm()

# The group's fixture may start the session's vLLM group (~100 s here, more on a loaded host).
pytestmark = pytest.mark.timeout(600)

RSS_GROWTH = 64 << 20  # what one refused request may add to the OpenAI ingress's resident memory
# Past this the fix is broken: the ingress is killed before it takes the host's memory (and the group spent).
RSS_CAP = 1 << 30
WORDS = " ".join(["the quick brown fox jumps over the lazy dog"] * 13)  # some 120 words


@pytest.fixture(scope="module")
def group(served_llm: VllmGroup) -> VllmGroup:
    """The session's vLLM group, which test_openai_vllm_e2e.py and test_vllm_e2e.py share."""
    return served_llm


@pytest.fixture(scope="module")
def client(group: VllmGroup) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{group.openai_port}/v1", api_key="none", max_retries=0, timeout=60)


def _post(url: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _openai(group: VllmGroup, path: str, doc: Any) -> tuple[int, Any]:
    return _post(f"http://127.0.0.1:{group.openai_port}/v1/{path}", json.dumps(doc).encode())


def _triton(group: VllmGroup, path: str, doc: Any) -> tuple[int, Any]:
    return _post(f"http://127.0.0.1:{group.server.http_port}/v2/models/{MODEL}/{path}", json.dumps(doc).encode())


def _refused_openai(group: VllmGroup, path: str, doc: Any, words: str) -> None:
    status, body = _openai(group, path, doc)
    assert status == 400, (status, body)
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == 400 and words in error["message"], error


def _victim_served(group: VllmGroup, client: openai.OpenAI) -> None:
    """Another client's greedy completion, right after: vLLM's own answer."""
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert out.choices[0].text == group.ref.completion[None][0]


def test_the_limits_are_the_installed_vllms() -> None:
    """A limit that drifted from the engine's would refuse what vLLM takes, or take what it refuses."""
    import vllm.envs
    from vllm import sampling_params

    assert (lim.MAX_N, lim.MAX_PROMPTS) == (vllm.envs.VLLM_MAX_N_SEQUENCES, vllm.envs.VLLM_MAX_COMPLETION_PROMPTS)
    assert (lim.MAX_STOP_STRINGS, lim.MAX_BAD_WORDS) == (vllm.envs.VLLM_MAX_STOP_STRINGS,
                                                         vllm.envs.VLLM_MAX_NUM_BAD_WORDS)
    assert lim.MAX_JSON_DEPTH == sampling_params.MAX_STRUCTURED_OUTPUT_JSON_NESTING
    assert lim.STRUCTURAL_TAG_DEPTH == lim.MAX_JSON_DEPTH + sampling_params.STRUCTURAL_TAG_WRAPPER_NESTING


def test_n_of_two_to_the_31_is_refused_and_the_ingress_stays_small(group: VllmGroup, client: openai.OpenAI) -> None:
    """It grew the ingress to ~20 GiB (a text per choice, allocated before the engine refused n)."""
    (pid,) = pids_of(group.server, "ingress-openai")

    def kill() -> None:  # the fix is broken: spare the host, and give the next test a new group
        spend(group)
        os.kill(pid, signal.SIGKILL)

    words = "n must be at most 16384, got 2147483648. To increase this limit, set the VLLM_MAX_N_SEQUENCES"
    with IngressWatch(pid, cap=RSS_CAP, over_cap=kill) as watch:
        for stream in (False, True):
            _refused_openai(group, "completions", {"model": MODEL, "prompt": PROMPT, "n": 2**31, "temperature": 1,
                                                   "stream": stream}, words)
            _refused_openai(group, "chat/completions", {"model": MODEL, "messages": CHAT, "n": 2**31,
                                                        "temperature": 1, "stream": stream}, words)
    assert not watch.capped and watch.rss_growth < RSS_GROWTH, watch.rss_growth
    _victim_served(group, client)


def _props(count: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def _one_of(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"oneOf": [{"type": "object", "properties": {"x": schema}}, {"type": "array", "items": schema}]}
    return schema


def _deep(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, **function}}


def _json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


COMPLETION = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
CHAT_REQUEST = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
# (route, body, the refusal's words): each of these was served, or kept the engine busy for minutes.
OPENAI_ATTACKS: list[tuple[str, str, dict[str, Any], str]] = [
    ("100,000 stop strings", "completions", {**COMPLETION, "stop": ["x"] * 100_000},
     "stop: List should have at most 4 items after validation, not 100000"),
    ("a stop string of a megabyte", "completions", {**COMPLETION, "stop": "x" * (1 << 20)}, "at most 1024 characters"),
    ("2,048 prompts of 120 words", "completions", {**COMPLETION, "prompt": [WORDS] * 2048},
     "prompt list length 2048 exceeds the maximum allowed count of 1024"),
    ("n times the prompts", "completions", {**COMPLETION, "prompt": ["a"] * 1024, "n": 64, "temperature": 1},
     "one request may have at most 16384"),
    ("100,000 messages", "chat/completions", {**CHAT_REQUEST, "messages": CHAT * 100_000},
     "at most 2048 are taken"),
    ("a tool definition of a megabyte", "chat/completions",
     {**CHAT_REQUEST, "tools": [_tool(description="x" * (1 << 20))], "tool_choice": "none"}, "characters of strings"),
    ("200 tools", "chat/completions", {**CHAT_REQUEST, "tools": [_tool(name=f"f{i}") for i in range(200)]},
     "at most 128 are taken"),
    ("a tool schema 200 deep", "chat/completions",
     {**CHAT_REQUEST, "tools": [_tool(parameters={"type": "object", "properties": _deep(200)})]},
     "`tools` is nested too deeply"),
    ("12,000 optional properties", "chat/completions",
     {**CHAT_REQUEST, "response_format": _json_schema(_props(12_000))}, "an object of 12000 properties"),
    ("a strict tool of 12,000 properties", "chat/completions",
     {**CHAT_REQUEST, "tools": [_tool(parameters=_props(12_000), strict=True)], "tool_choice": "required"},
     "an object of 12000 properties"),
    ("oneOf 14 deep", "completions", {**COMPLETION, "structured_outputs": {"json": _one_of(14)}},
     "more than 8192 JSON values"),
    ("an ambiguous regex", "completions", {**COMPLETION, "structured_outputs": {"regex": "(a|b|ab)*" * 1000}},
     "structured_outputs.regex has 9000 characters"),
    ("logprobs 2^31", "completions", {**COMPLETION, "logprobs": 2**31},
     "Requested sample logprobs of 2147483648, which is greater than max allowed: 20"),
    ("max_tokens 2^64", "completions", {**COMPLETION, "max_tokens": 2**64},
     "max_tokens: Input should be less than or equal to 9223372036854775807"),
    ("seed 2^64", "chat/completions", {**CHAT_REQUEST, "seed": 2**64},
     "seed: Input should be less than or equal to 9223372036854775807"),
    ("a schema 300 deep", "chat/completions", {**CHAT_REQUEST, "response_format": _json_schema(_deep(300))},
     "The JSON schema is nested too deeply: objects and arrays may nest at most 64 levels"),
    ("use_beam_search", "completions", {**COMPLETION, "use_beam_search": True}, "use_beam_search is not supported"),
]


@pytest.mark.parametrize(("route", "doc", "words"), [a[1:] for a in OPENAI_ATTACKS], ids=[a[0] for a in OPENAI_ATTACKS])
def test_openai_attacks_are_refused_at_once(group: VllmGroup, client: openai.OpenAI, route: str, doc: dict[str, Any],
                                            words: str) -> None:
    _refused_openai(group, route, doc, words)
    _victim_served(group, client)


def test_bodies_nested_past_any_decoder_are_400s(group: VllmGroup, client: openai.OpenAI) -> None:
    """They were 500s (a recursion error) on the OpenAI routes."""
    body = b'{"model": "%s", "prompt": "a", "zz": ' % MODEL.encode() + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, doc = _post(f"http://127.0.0.1:{group.openai_port}/v1/completions", body)
    assert status == 400 and doc["error"]["message"] == "the request body is nested too deeply to decode", doc
    _victim_served(group, client)


def _sampling(values: Any) -> str:
    return json.dumps(values)


# Triton's routes: the ingress checks a generate request to an LLM; KServe infer reaches the backend's own check.
TRITON_ATTACKS: list[tuple[str, dict[str, Any], str]] = [
    ("n 2^31 in parameters", {"text_input": "hi", "parameters": {"n": 2**31, "temperature": 1}},
     "n must be at most 16384, got 2147483648"),
    ("100,000 stop strings", {"text_input": "hi", "sampling_parameters": _sampling({"stop": ["x"] * 100_000})},
     "stop: List should have at most 256 items"),
    ("seed 2^64 in parameters", {"text_input": "hi", "parameters": {"seed": 2**64}},  # a 500 from the engine
     "seed: Input should be less than or equal to 9223372036854775807"),
    ("12,000 optional properties", {"text_input": "hi", "sampling_parameters": _sampling(
        {"structured_outputs": {"json": _props(12_000)}})}, "an object of 12000 properties"),
    ("sampling_parameters 5,000 deep", {"text_input": "hi", "sampling_parameters": "[" * 5000 + "]" * 5000},
     "'sampling_parameters' is nested too deeply to decode"),
]


@pytest.mark.parametrize(("doc", "words"), [a[1:] for a in TRITON_ATTACKS], ids=[a[0] for a in TRITON_ATTACKS])
def test_triton_generate_attacks_are_refused(group: VllmGroup, client: openai.OpenAI, doc: dict[str, Any],
                                             words: str) -> None:
    for route in ("generate", "generate_stream"):
        status, body = _triton(group, route, doc)
        assert status == 400 and words in body["error"], (route, status, body)
    _victim_served(group, client)


def test_kserve_infer_reaches_the_backends_own_check(group: VllmGroup, client: openai.OpenAI) -> None:
    """No ingress reads the sampling parameters of a KServe (or gRPC) request: the vLLM backend refuses them."""
    for values, words in (({"stop": ["x"] * 100_000}, "stop: List should have at most 256 items"),
                          ({"seed": 2**63}, "seed: Input should be less than or equal to 9223372036854775807")):
        status, body = _triton(group, "infer", {"inputs": [
            {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            {"name": "sampling_parameters", "datatype": "BYTES", "shape": [1], "data": [_sampling(values)]}]})
        assert status == 400 and words in body["error"], (status, body)
    _victim_served(group, client)


def _token(group: VllmGroup, text: str) -> int:
    status, doc = _post(f"http://127.0.0.1:{group.openai_port}/tokenize",
                        json.dumps({"model": MODEL, "prompt": text, "add_special_tokens": False}).encode())
    assert status == 200, doc
    return int(doc["tokens"][0])


def test_vllms_sampling_fields_reach_the_engine(group: VllmGroup, client: openai.OpenAI) -> None:
    """``stop_token_ids``, ``allowed_token_ids`` and ``bad_words`` change the greedy answer as vLLM's engine
    does; ``priority`` is taken (the engine schedules first come, first served unless its policy is
    "priority")."""
    greedy = group.ref.completion[None][0]
    first = _token(group, greedy)
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                        extra_body={"stop_token_ids": [first]})
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("", "stop")
    other = _token(group, " the")  # not the greedy answer's first token: only this one may come, every time
    assert other != first
    status, piece = _post(f"http://127.0.0.1:{group.openai_port}/detokenize",
                          json.dumps({"model": MODEL, "tokens": [other]}).encode())
    assert status == 200 and piece["prompt"]
    allowed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0,
                                        extra_body={"allowed_token_ids": [other]})
    assert allowed.choices[0].text == piece["prompt"] * 3
    word = greedy.split()[0]
    banned = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                       extra_body={"bad_words": [word]})
    assert word not in banned.choices[0].text.split()[:1] and banned.choices[0].text != greedy
    prioritized = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
                                            extra_body={"priority": 5})
    assert prioritized.choices[0].text == greedy
