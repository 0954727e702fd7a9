"""Two engines of one vLLM model (one per worker, two workers), the tiny Llama on vLLM's CPU
build, placed by prefix and then round-robin (changed at run time, in place). A workload of a few
long system prompts, each followed by several short user turns, sent through Triton's generate
endpoint: the prompt tokens the engines have to compute (their own prefix-cache counters, per
engine on /metrics) are far fewer when each system prompt goes back to the engine that has it,
and both engines serve. Sessions (``x-session-id`` on the OpenAI and generate routes, OpenAI's
``prompt_cache_key``) keep each session's turns on one engine though their prompts share nothing.
Then (each kills a worker) a request survives the death of its engine's worker (``kill -9``;
ingress/migration.py, ingress/openai/migration.py, ingress/tensor_migration.py), on every path
it moves by at once: OpenAI completions and chat, streamed and not, Triton's generate and generate_stream
(sampling parameters as the input and as the request's parameters), gRPC's ModelStreamInfer; killed
mid-stream; and before the first token (its engine stopped while it holds them), then again mid-stream on the
engine they moved to (MAX_MIGRATIONS 2, killed before the first is back: the requests wait for it). Each answer is the
uninterrupted run's, token for token, with the same counts; a stream with stop strings, which cannot go on
exactly, ends with the worker's error and why."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import mapped_shm
from conveyor.workers.backends.vllm.priority import descendants
from tests.support import tiny_llama
from tests.support.group import Server, _listening, router_control, start_server, wait_all_instances_ready
from tests.support.metrics import scrape
from tests.support.waiting import eventually, running

LEVEL = "e2e"

tiny_llama.require_vllm()

pytestmark = pytest.mark.timeout(420)

MODEL = "pair"
LOAD_TIMEOUT_S = 300.0  # two engines (each importing vLLM in its engine-core process), on a busy 2-core host
SYSTEM_PROMPTS = 7  # odd: under round-robin a prompt's turns alternate between the engines
TURNS = 3
BLOCK_TOKENS = 32  # the engines' block size (vLLM's CPU attention takes multiples of 32)
SYSTEM_TOKENS = 6 * BLOCK_TOKENS  # most of a 256-token context, so the shared head dominates the work
# No instance_group: an engine on each of the two workers (a group's instances may all land on the first
# worker to join), so killing one worker leaves the other engine serving.
CONFIG = 'backend: "vllm"\n' + tiny_llama.REPORT_METRICS  # the prefix-cache counters are read off /metrics
STREAM_TIMEOUT_S = 180.0  # a run of the streams, the move included, on a busy 2-core host


@pytest.fixture(scope="module")
def openai_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, openai_port: int) -> Iterator[Server]:
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")
    repo = tmp_path_factory.mktemp("placement_repo")
    model_dir = tiny_llama.write_repository(
        repo, tiny, MODEL, enable_lora=False, block_size=BLOCK_TOKENS, enable_prefix_caching=True, max_num_seqs=16,
        kv_cache_memory_bytes=16 << 20,
    )
    (model_dir / "config.pbtxt").write_text(CONFIG)
    group = f"pl{os.getpid()}"
    srv = start_server(str(repo), group, "--workers", "2", "--model-control-mode", "explicit",
                       "--load-model", "*", "--openai-port", str(openai_port), "--openai-address", "127.0.0.1",
                       ready_timeout=LOAD_TIMEOUT_S)
    try:
        wait_all_instances_ready(group, MODEL, 2, LOAD_TIMEOUT_S)  # ready as soon as one engine serves
        yield srv
    finally:
        assert srv.stop(60) == 0


@pytest.fixture(scope="module")
def systems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[list[str]]]:
    """Two sets of system prompts of whole blocks each (BOS included), as the engines tokenize them:
    a turn then computes only its own few tokens where its system prompt is cached."""
    system = tiny_llama.prompts(tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama"), SYSTEM_TOKENS, 0)
    yield [[system() for _ in range(SYSTEM_PROMPTS)] for _ in range(2)]


def _request(srv: Server, method: str, path: str, body: object = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _computed(srv: Server) -> dict[str, float]:
    """Each engine's prompt tokens computed so far: prefix-cache queries minus hits."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.metrics_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    per: dict[str, float] = {}
    for line in text.splitlines():
        found = re.match(r'vllm:prefix_cache_(queries|hits)_total\{(.*)\} (\S+)$', line)
        if found and f'model="{MODEL}"' in found[2]:
            engine = re.search(r'engine="([^"]+)"', found[2])
            assert engine is not None, line  # several engines: each says which it is
            sign = 1.0 if found[1] == "queries" else -1.0
            per[engine[1]] = per.get(engine[1], 0.0) + sign * float(found[3])
    return per


def _workload(srv: Server, systems: list[str]) -> dict[str, float]:
    """Every system prompt, then each turn of it, one at a time, turn by turn; the tokens each engine computed."""
    rng = random.Random(len(systems))
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    before = _computed(srv)
    for turn in range(TURNS):
        for system in systems:
            user = " ".join(rng.choice(words) for _ in range(4))
            status, body = _request(srv, "POST", f"/v2/models/{MODEL}/generate", {
                "text_input": f"{system}\nuser {turn}: {user}", "parameters": {"max_tokens": 1, "temperature": 0},
            })
            assert status == 200, body
    after = _computed(srv)
    return {engine: after[engine] - before.get(engine, 0.0) for engine in after}


def _place(srv: Server, placement: str) -> None:
    """Load the model's config with another ENGINE_PLACEMENT: applied in place, the engines stay. (The same
    config again would reload the model: nothing is loaded when it is the placement already.)"""
    status, body = _request(srv, "GET", f"/v2/models/{MODEL}/config")
    assert status == 200, body
    config = json.loads(body)
    if config.get("parameters", {}).get("ENGINE_PLACEMENT", {}).get("string_value") == placement:
        return
    config.setdefault("parameters", {})["ENGINE_PLACEMENT"] = {"string_value": placement}
    status, body = _request(srv, "POST", f"/v2/repository/models/{MODEL}/load",
                            {"parameters": {"config": json.dumps(config)}})
    assert status == 200, body


def test_prefix_placement_computes_far_fewer_prompt_tokens_than_round_robin(
        server: Server, systems: list[list[str]]) -> None:
    by_prefix = _workload(server, systems[0])
    assert len(by_prefix) == 2 and all(tokens > 0 for tokens in by_prefix.values()), by_prefix  # both serve
    _place(server, "round_robin")
    by_turns = _workload(server, systems[1])  # other system prompts: nothing of them cached yet
    assert len(by_turns) == 2 and all(tokens >= 0 for tokens in by_turns.values()), by_turns  # same engines
    print(f"prompt tokens computed: by prefix {by_prefix}, round-robin {by_turns}")  # shown with -s
    assert sum(by_turns.values()) >= 1.5 * sum(by_prefix.values()), (by_prefix, by_turns)

# --- Sessions kept together (x-session-id, prompt_cache_key) ----------------------------------------------------
#
# An agent's turns name their session; each turn's prompt here shares no head with any other (its first block is
# its own), so prefix placement alone would take the engines in turn and split every session's turns (an odd
# number of sessions, sent turn by turn). The session key keeps each session's turns on one engine.

SESSIONS = 5  # odd: the engines in turn would put a session's consecutive turns on alternate engines
SESSION_TURNS = 3
SESSION_PLACEMENTS = "conveyor_engine_session_placements_total"


def _session_counts(srv: Server) -> dict[tuple[str, str], float]:
    """The model's session placements on /metrics: (engine, outcome) -> count."""
    pattern = re.compile(SESSION_PLACEMENTS + r'\{engine="([^"]+)",model="' + MODEL
                         + r'",outcome="(\w+)",version="1"\}')
    return {(found[1], found[2]): value for key, value in scrape(srv).items() if (found := pattern.fullmatch(key))}


def _session_turn(srv: Server, port: int, session: int, turn: int) -> int:
    """Session ``session``'s turn ``turn`` (sessions 0 and 1: completions with ``x-session-id``; 2: chat with
    ``prompt_cache_key``; 3 and 4: Triton's generate with ``x-session-id``); the prompt tokens it had."""
    text = f"{turn}.{session} {tiny_llama.LINES[(session + turn) % len(tiny_llama.LINES)]} {tiny_llama.LINES[turn]}"
    key = f"agent-{session}"
    if session < 3:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
        args: dict[str, Any] = {"model": MODEL, "max_tokens": 1, "temperature": 0}
        made: Any = (client.completions.create(prompt=text, extra_headers={"x-session-id": key}, **args) if session < 2
                     else client.chat.completions.create(messages=[{"role": "user", "content": text}],
                                                         extra_body={"prompt_cache_key": key}, **args))
        return int(made.usage.prompt_tokens)
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=60)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate", headers={"x-session-id": key}, body=json.dumps(
            {"text_input": text, "return_num_input_tokens": True, "parameters": {"max_tokens": 1, "temperature": 0}}))
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body
        return int(json.loads(body)["num_input_tokens"])
    finally:
        conn.close()


def test_a_sessions_turns_land_on_one_engine(server: Server, openai_port: int) -> None:
    """Each session's turns on one engine (the router's record, on /metrics, per request), the sessions on both
    engines; the engines' own prefix-cache counters agree: each computed the prompts of the turns sent to it."""
    _place(server, "prefix")
    deadline = time.monotonic() + 30
    while not _listening(openai_port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    queried = _settled(server)
    before = _session_counts(server)
    homes: dict[int, set[str]] = {}
    prompt_tokens: dict[str, int] = {}
    for turn in range(SESSION_TURNS):
        for session in range(SESSIONS):
            counts = _session_counts(server)
            tokens = _session_turn(server, openai_port, session, turn)
            grew = [engine for (engine, outcome), n in _session_counts(server).items()
                    if n > counts.get((engine, outcome), 0.0)]
            assert len(grew) == 1, (session, turn, grew)  # counted as the router sent it, before its answer
            homes.setdefault(session, set()).add(grew[0])
            prompt_tokens[grew[0]] = prompt_tokens.get(grew[0], 0) + tokens
    assert all(len(engines) == 1 for engines in homes.values()), homes
    assert len(set.union(*homes.values())) == 2, homes  # new sessions spread over the engines
    after = _session_counts(server)
    outcomes = dict.fromkeys(("hit", "miss", "new"), 0.0)
    for (engine, outcome), n in after.items():
        outcomes[outcome] += n - before.get((engine, outcome), 0.0)
    assert outcomes == {"hit": SESSIONS * (SESSION_TURNS - 1), "miss": 0, "new": SESSIONS}, outcomes
    computed = {engine: n - queried.get(engine, 0.0) for engine, n in _settled(server).items()}
    assert computed == prompt_tokens, (computed, prompt_tokens)


# --- A request that survives its engine's worker (ingress/migration.py) ---------------------------------------
#
# Every path a request moves by, at once, on one engine: the prompts share a head of whole 64-byte blocks (the
# prefix keys of text prompts), so prefix placement sends all of a round to the engine that took the round's
# first one. Each round kills that engine's worker (SIGKILL) and compares every answer with the undisturbed
# run's, token for token (greedy).

HEAD = " ".join(tiny_llama.LINES[:3])  # after "<|user|> ", as the chat template renders a user's turn
TOKENS = 40  # each answer: long enough to be mid-stream at a kill, short enough for CI
STARTED = 2  # a mid-stream kill comes once a stream has shown this many chunks
AGAIN = 4  # ... and a second kill once a stream has shown this many more after the first
SAMPLING = {"max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
BLOCKED = {**SAMPLING, "stop": ["@@@"]}  # never met: the text is the greedy run's, but the engine holds state
PATHS = ("completions-stream", "completions", "chat-stream", "chat", "generate", "generate_stream",
         "generate_stream-parameters", "ModelStreamInfer")
MIGRATIONS = f'conveyor_request_migrations_total{{model="{MODEL}",version="1"}}'


def _content(i: int) -> str:
    """The user's turn of path ``i``: the shared head, then the start of a line of its own (the tiny model
    goes on with the line's words)."""
    return f"{HEAD} {' '.join(tiny_llama.LINES[3 + i % 5].split()[:2 + i // 5])}"


def _prompt(i: int) -> str:
    """Path ``i``'s text prompt: its turn as the chat template begins it (the head's bytes are its chat's)."""
    return f"<|user|> {_content(i)}"


class _Progress:
    """The chunks each stream of a round has shown, for a kill to wait on."""

    def __init__(self, streams: int) -> None:
        self.shown = [0] * streams
        self.changed = threading.Condition()

    def add(self, stream: int) -> None:
        with self.changed:
            self.shown[stream] += 1
            self.changed.notify_all()

    def wait(self, more: int, since: list[int] | None = None) -> list[int]:
        """Until a stream has shown ``more`` chunks (after ``since``); the counts then."""
        base = since or [0] * len(self.shown)
        with self.changed:
            assert self.changed.wait_for(lambda: any(s - b >= more for s, b in zip(self.shown, base, strict=True)),
                                         STREAM_TIMEOUT_S), "no stream went on"
            return list(self.shown)


@dataclass
class _Answer:
    text: str = ""
    finish: str | None = None
    usage: tuple[int, int] | None = None
    error: str | None = None  # the client's exception, or an in-stream error's message
    tokens: list[str] = field(default_factory=list)  # an OpenAI answer's: each token's, also those shown as ""


def _openai_job(port: int, i: int, chat: bool, stream: bool, out: _Answer, shown: Callable[[], None],
                session: str = "") -> None:
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                           timeout=STREAM_TIMEOUT_S)
    args: dict[str, Any] = {"model": MODEL, "max_tokens": TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True},
                            "extra_headers": {"X-Request-Id": f"path{i}", **_session_header(session)},
                            "logprobs": True if chat else 0}
    if stream:
        args.update(stream=True, stream_options={"include_usage": True})
    made: Any = (client.chat.completions.create(messages=[{"role": "user", "content": _content(i)}], **args) if chat
                 else client.completions.create(prompt=_prompt(i), **args))
    for chunk in made if stream else [made]:
        if chunk.usage is not None:
            out.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for choice in chunk.choices:
            text = (choice.delta.content if stream else choice.message.content) if chat else choice.text
            out.text += text or ""
            out.finish = choice.finish_reason or out.finish
            if choice.logprobs is not None:  # each token's, those shown as "" too (streamed: a chunk of its own)
                out.tokens += ([t.token for t in choice.logprobs.content or []] if chat
                               else list(choice.logprobs.tokens or []))
            if stream and text:
                shown()


def _generate_job(srv: Server, i: int, stream: bool, sampling: dict[str, Any], as_parameters: bool, out: _Answer,
                  shown: Callable[[], None], session: str = "") -> None:
    body: dict[str, Any] = {"id": f"path{i}", "text_input": _prompt(i), "stream": stream,
                            "exclude_input_in_output": True, "return_finish_reason": True,
                            "return_num_input_tokens": True, "return_num_output_tokens": True}
    if as_parameters:
        body["parameters"] = sampling
    else:
        body["sampling_parameters"] = json.dumps(sampling)
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=STREAM_TIMEOUT_S)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/{'generate_stream' if stream else 'generate'}", body=json.dumps(body),
                     headers=_session_header(session))
        r = conn.getresponse()
        events = (line[len(b"data: "):] for line in r if line.startswith(b"data: ")) if stream else [r.read()]
        output_tokens = 0
        for raw in events:
            doc = json.loads(raw)
            if "error" in doc:
                out.error = doc["error"]
                return
            output_tokens += doc["num_output_tokens"]
            out.usage = (doc["num_input_tokens"], output_tokens)
            out.finish = doc["finish_reason"] if doc["finish_reason"] != "None" else out.finish
            out.text += doc["text_output"]
            if stream:
                shown()
    finally:
        conn.close()


def _grpc_job(srv: Server, i: int, out: _Answer, shown: Callable[[], None]) -> None:
    def tensor(name: str, dtype: str, value: Any) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
        return t

    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(MODEL, [tensor("text_input", "BYTES", _prompt(i).encode()),
                                          tensor("sampling_parameters", "BYTES", json.dumps(SAMPLING).encode()),
                                          tensor("stream", "BOOL", True), tensor("return_finish_reason", "BOOL", True)],
                                  request_id=f"path{i}", enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=STREAM_TIMEOUT_S)
            if error is not None:
                out.error = error.message()
                return
            text, reason = result.as_numpy("text_output"), result.as_numpy("finish_reason")
            if reason is not None and reason.reshape(-1)[0] != b"None":
                out.finish = reason.reshape(-1)[0].decode()
            if text is not None:
                out.text += b"".join(text.reshape(-1)).decode()
                shown()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream()
        client.close()


def _round(srv: Server, port: int, blocked: bool = False,
           session: str = "") -> tuple[list[_Answer], _Progress, list[threading.Thread]]:
    """Every path's request at once (and, ``blocked``, a generate_stream with stop strings), in threads; those
    of the OpenAI and generate routes of this session (``x-session-id``), if one."""
    paths: list[Callable[[_Answer, Callable[[], None]], None]] = [
        lambda out, shown: _openai_job(port, 0, False, True, out, shown, session),
        lambda out, shown: _openai_job(port, 1, False, False, out, shown, session),
        lambda out, shown: _openai_job(port, 2, True, True, out, shown, session),
        lambda out, shown: _openai_job(port, 3, True, False, out, shown, session),
        lambda out, shown: _generate_job(srv, 4, False, SAMPLING, True, out, shown, session),
        lambda out, shown: _generate_job(srv, 5, True, SAMPLING, False, out, shown, session),
        lambda out, shown: _generate_job(srv, 6, True, SAMPLING, True, out, shown, session),
        lambda out, shown: _grpc_job(srv, 7, out, shown),
    ]
    if blocked:
        paths.append(lambda out, shown: _generate_job(srv, 8, True, BLOCKED, False, out, shown, session))
    answers = [_Answer() for _ in paths]
    progress = _Progress(len(paths))

    def run(i: int) -> None:
        try:
            paths[i](answers[i], lambda: progress.add(i))
        except Exception as exc:  # shown by the test's assertion
            answers[i].error = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(paths))]
    for t in threads:
        t.start()
    return answers, progress, threads


def _session_header(session: str) -> dict[str, str]:
    return {"x-session-id": session} if session else {}


def _joined(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(STREAM_TIMEOUT_S + 60)
    assert not any(t.is_alive() for t in threads), "a request did not end in time"


def _configure(srv: Server, max_migrations: int) -> None:
    """The model's config with prefix placement and this MAX_MIGRATIONS, applied in place (the engines stay)."""
    status, body = _request(srv, "GET", f"/v2/models/{MODEL}/config")
    assert status == 200, body
    config = json.loads(body)
    parameters = config.setdefault("parameters", {})
    wanted = {"ENGINE_PLACEMENT": "prefix", "MAX_MIGRATIONS": str(max_migrations)}
    if all(parameters.get(k, {}).get("string_value") == v for k, v in wanted.items()):
        return
    parameters.update({k: {"string_value": v} for k, v in wanted.items()})
    status, body = _request(srv, "POST", f"/v2/repository/models/{MODEL}/load",
                            {"parameters": {"config": json.dumps(config)}})
    assert status == 200, body


def _queries(srv: Server) -> dict[str, float]:
    """Each engine's prefix-cache queries so far (prompt tokens it was asked for), by instance name."""
    per: dict[str, float] = {}
    for key, value in scrape(srv).items():
        found = re.match(r'vllm:prefix_cache_queries_total\{.*engine="([^"]+)"', key)
        if found and f'model="{MODEL}"' in key:
            per[found[1]] = per.get(found[1], 0.0) + value
    return per


SETTLED_SCRAPES = 6  # the engines' counters reach /metrics every --metrics-interval-ms (2 s): unchanged this long


def _settled(srv: Server) -> dict[str, float]:
    """``_queries`` once the earlier requests' counts have all arrived (the same over several scrapes)."""
    seen: list[dict[str, float]] = []

    def still() -> bool:
        seen.append(_queries(srv))
        return len(seen) >= SETTLED_SCRAPES and all(q == seen[-1] for q in seen[-SETTLED_SCRAPES:])

    eventually(still, 60, what="the engines' counters settled", interval=0.5)
    return seen[-1]


def _engine_of_the_head(srv: Server, port: int) -> int:
    """The worker of the engine that the head's prompts go to, found by sending one through each ingress (each
    reads the model's config afresh then: MAX_MIGRATIONS)."""
    wait_all_instances_ready(srv.group, MODEL, 2, LOAD_TIMEOUT_S)
    before = _settled(srv)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60)
    client.completions.create(model=MODEL, prompt=_prompt(8), max_tokens=1)
    status, body = _request(srv, "POST", f"/v2/models/{MODEL}/generate",
                            {"text_input": _prompt(8), "parameters": {"max_tokens": 1}})
    assert status == 200, body
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([_prompt(8).encode()], dtype=object))
        grpc.start_stream(callback=lambda result, error: None)
        grpc.async_stream_infer(MODEL, [text], parameters={"max_tokens": 1})
        grpc.stop_stream()  # waits for the stream's end
    finally:
        grpc.close()
    grew: dict[str, float] = {}

    def one_grew() -> bool:
        grew.clear()
        grew.update({k: v - before.get(k, 0.0) for k, v in _queries(srv).items() if v > before.get(k, 0.0)})
        assert len(grew) == 1, (grew, before)  # reported if it stays so
        return True

    eventually(one_grew, 30, what="the head's requests on one engine")
    rows = [r for r in router_control(srv.group, "instances") if r["model"] == MODEL]
    assert len({r["worker_pid"] for r in rows}) == 2, rows  # an engine in each worker
    return next(r["worker_pid"] for r in rows if r["name"] in grew)


def _other(srv: Server, pid: int) -> int:
    rows = [r for r in router_control(srv.group, "instances") if r["model"] == MODEL and r["state"] == "READY"]
    return next(r["worker_pid"] for r in rows if r["worker_pid"] != pid)


@pytest.fixture(scope="module")
def undisturbed(server: Server, openai_port: int) -> list[_Answer]:
    """Every path's answer with no worker killed."""
    deadline = time.monotonic() + 30
    while not _listening(openai_port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    _configure(server, 1)
    _engine_of_the_head(server, openai_port)
    answers, _, threads = _round(server, openai_port, blocked=True)  # stop strings never met: the greedy text
    _joined(threads)
    for path, answer in zip((*PATHS, "blocked"), answers, strict=True):
        assert answer.error is None and answer.finish == "length", (path, answer)
        # The OpenAI answers' logprobs: one a token, streamed or not (a token shown as "" has its chunk)
        assert (len(answer.tokens) == TOKENS) == path.startswith(("chat", "completions")), (path, answer)
    # Text to compare: the tiny model ends some lines at once (then only tokens shown as "" follow)
    assert sum(bool(a.text.strip()) for a in answers) > len(answers) // 2, answers
    return answers


# Two rounds (each kill costs an engine's restart, the suite's time): one kill mid-stream; then one before the
# first token and a second one mid-stream on the engine the requests moved to.
@pytest.mark.parametrize(("when", "max_migrations"),
                         [("mid-stream", 1), ("before the first token, then mid-stream", 2)])
def test_every_path_survives_the_death_of_its_engines_worker(
        server: Server, openai_port: int, undisturbed: list[_Answer], when: str, max_migrations: int) -> None:
    """The round's requests, one of each path, on one engine of two; its worker killed once a stream has shown
    text (or, ``before the first token``, while its engine is stopped and holds them all); ``then mid-stream``:
    the engine that took them killed too once a stream shows text, before the first is back, so they wait for
    it. Every answer is the undisturbed run's, token for token, its counts the same; the model's migration
    counter counts each move. The round's requests are one session's (``x-session-id``, but for gRPC's): moved,
    they stay that session's, off its killed engine, and its next turn goes where they went."""
    _configure(server, max_migrations)
    victim = _engine_of_the_head(server, openai_port)
    rows = [r for r in router_control(server.group, "instances") if r["model"] == MODEL]
    survivor = next(r["name"] for r in rows if r["worker_pid"] != victim)  # the engine not killed first
    session = f"kill-{max_migrations}"
    sessions_before = _session_counts(server)
    engine = descendants(victim)  # its engine core and the engine's model worker
    segments = mapped_shm(engine, "psm_")  # vLLM's queues between them, which vLLM leaves behind
    before = scrape(server).get(MIGRATIONS, 0.0)
    frozen = when.startswith("before the first token")
    twice = when.endswith("then mid-stream")
    counts: list[int] = []
    # Its engine stopped until every request is on it: a path whose ingress is slow on a busy host would
    # otherwise reach the router after the kill, and go to the other engine without a move.
    stopped = list(engine)
    for pid in engine:
        os.kill(pid, signal.SIGSTOP)  # the worker takes the requests; its engine answers none
    answers, progress, threads = _round(server, openai_port, blocked=when == "mid-stream", session=session)
    try:
        eventually(lambda: router_control(server.group, "model_load", model=MODEL)["num_requests_running"]
                   == len(threads), 60, what="every request placed")
        assert progress.shown == [0] * len(threads)
        if not frozen:
            for pid in engine:
                os.kill(pid, signal.SIGCONT)
            stopped = []
            counts = progress.wait(STARTED)
        os.kill(victim, signal.SIGKILL)
        if twice:
            second = _other(server, victim)
            progress.wait(AGAIN, counts)
            os.kill(second, signal.SIGKILL)  # its requests wait for an engine to be back
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # for the supervisor's stop of them
        _joined(threads)
    for path, ref, got in zip(PATHS, undisturbed, answers, strict=False):
        assert got.error is None, (path, got.error)
        assert (got.text, got.tokens, got.finish, got.usage) == (ref.text, ref.tokens, ref.finish, ref.usage), \
            (path, ref, got)
    moves = scrape(server).get(MIGRATIONS, 0.0) - before
    if when == "mid-stream":  # the stream with stop strings cannot go on once it has shown text: it ends with why
        ref, got = undisturbed[-1], answers[-1]
        if got.error is None:  # it had shown nothing yet: sent again as it was
            assert got.text == ref.text, (ref.text, got.text)
            moves -= 1
        else:
            assert re.fullmatch(r"the worker running this request exited \(.*\); not resumed on another engine: "
                                r"it has stop strings, .*", got.error), got.error
            assert ref.text.startswith(got.text), (ref.text, got.text)  # what it showed, no more
        # What the dead worker had started is killed by the supervisor, and its shared memory unlinked.
        eventually(lambda: not [pid for pid in engine if running(pid)], 30, what="its engine processes killed")
        assert not [name for name in segments if os.path.exists(f"/dev/shm/{name}")]
    # Each path's request once per kill: all of them were on the killed engine.
    assert moves == len(PATHS) * (2 if twice else 1), moves
    wait_all_instances_ready(server.group, MODEL, 2, LOAD_TIMEOUT_S)  # the killed worker back, for what follows
    # Each move placed as the session's, off the engine it was on (a miss); the killed engine is back, and the
    # session's next turn (a prompt sharing nothing with the round's) goes where its requests went.
    moved = _session_counts(server)
    missed = {e for (e, o), n in moved.items() if o == "miss" and n > sessions_before.get((e, o), 0.0)}
    assert missed and (twice or missed == {survivor}), (missed, moved)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{openai_port}/v1", api_key="none", max_retries=0, timeout=60)
    client.completions.create(model=MODEL, prompt=f"{session}: {tiny_llama.LINES[1]}", max_tokens=1,
                              extra_headers=_session_header(session))
    grew = [(e, o) for (e, o), n in _session_counts(server).items() if n > moved.get((e, o), 0.0)]
    assert len(grew) == 1 and grew[0][1] == "hit" and (twice or grew[0][0] == survivor), (grew, missed)
