"""Two engines of one vLLM model (one per worker, two workers), the tiny Llama on vLLM's CPU
build, placed by prefix and then round-robin (changed at run time, in place). A workload of a few
long system prompts, each followed by several short user turns, sent through Triton's generate
endpoint: the prompt tokens the engines have to compute (their own prefix-cache counters, per
engine on /metrics) are far fewer when each system prompt goes back to the engine that has it,
and both engines serve. Last, as the group's last test (it kills a worker): greedy streams through the
OpenAI endpoint survive the death of one engine's worker (``kill -9``), each moved to the other engine
and completed with the text of an uninterrupted run, token for token, as are requests that do not stream
(ingress/openai/migration.py)."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from conveyor.deploy.ports import free_port
from tests.support import tiny_llama
from tests.support.group import Server, _listening, router_control, start_server, wait_all_instances_ready
from tests.support.metrics import scrape

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
CONFIG = """backend: "vllm"
"""
STREAMS = 8  # as many as one engine runs at once (max_num_seqs): the survivor takes the moved ones beside its own
STREAM_TOKENS = 128  # long enough to be mid-stream when the worker dies; the prompt and these fit the context
STARTED_CHUNKS = 3  # each stream has shown this much text when the worker is killed
WHOLE = 2  # requests not streamed beside the streams: one that dies with its worker is sent again as it was
STREAM_TIMEOUT_S = 180.0  # a run of the streams, the move included, on a busy 2-core host


@pytest.fixture(scope="module")
def openai_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, openai_port: int) -> Iterator[Server]:
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")
    repo = tmp_path_factory.mktemp("placement_repo")
    model_dir = tiny_llama.write_repository(
        repo, tiny, MODEL, enable_lora=False, block_size=BLOCK_TOKENS, enable_prefix_caching=True, max_num_seqs=8,
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
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")
                                                  .model_dir))
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    rng = random.Random(0)

    def system() -> str:
        text = rng.choice(words)
        while len(tokenizer(text)["input_ids"]) < SYSTEM_TOKENS:
            text += " " + rng.choice(words)
        return text if len(tokenizer(text)["input_ids"]) == SYSTEM_TOKENS else system()

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


@dataclass
class _Stream:
    text: str = ""
    chunks: int = 0
    finish: str | None = None
    usage: tuple[int, int] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def _streams(port: int, prompts: list[str], on_started: threading.Barrier | None = None) -> list[_Stream]:
    """Every prompt at once through /v1/completions, greedy and to ``STREAM_TOKENS`` tokens: streamed, and
    the first ``WHOLE`` of them once more not streamed (last in the list). With ``on_started``, each stream
    waits there once it has shown ``STARTED_CHUNKS`` chunks (reading on after)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                           timeout=STREAM_TIMEOUT_S)
    asked = [(p, True) for p in prompts] + [(p, False) for p in prompts[:WHOLE]]
    found = [_Stream() for _ in asked]
    args: dict[str, Any] = {"model": MODEL, "max_tokens": STREAM_TOKENS, "temperature": 0,
                            "extra_body": {"ignore_eos": True}}

    def run(prompt: str, stream: bool, out: _Stream) -> None:
        try:
            if not stream:
                whole = client.completions.create(prompt=prompt, **args)
                assert whole.usage is not None
                out.text, out.finish = whole.choices[0].text, whole.choices[0].finish_reason
                out.usage = (whole.usage.prompt_tokens, whole.usage.completion_tokens)
                return
            for chunk in client.completions.create(prompt=prompt, stream=True,
                                                   stream_options={"include_usage": True}, **args):
                if chunk.usage is not None:
                    out.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
                for choice in chunk.choices:
                    out.text += choice.text
                    out.finish = choice.finish_reason or out.finish
                    out.chunks += 1
                    if on_started is not None and out.chunks == STARTED_CHUNKS:
                        on_started.wait(STREAM_TIMEOUT_S)
        except BaseException as exc:  # shown by the test's assertion
            out.error = exc
        finally:
            out.done.set()

    threads = [threading.Thread(target=run, args=(p, stream, out), daemon=True)
               for (p, stream), out in zip(asked, found, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(STREAM_TIMEOUT_S)
    assert all(out.done.is_set() for out in found), "a request did not end in time"
    return found


def test_streams_survive_the_death_of_their_engines_worker(server: Server, openai_port: int) -> None:
    """The last test of the module: it kills a worker. Round-robin spreads the streams over both engines;
    the worker of one is killed once every stream has shown some text; its streams move to the other engine
    and go on; every stream's text is the uninterrupted run's, token for token, and its usage the same."""
    deadline = time.monotonic() + 30
    while not _listening(openai_port):
        assert time.monotonic() < deadline, "the OpenAI ingress did not listen"
        time.sleep(0.1)
    _place(server, "round_robin")
    wait_all_instances_ready(server.group, MODEL, 2, LOAD_TIMEOUT_S)
    rows = [r for r in router_control(server.group, "instances") if r["model"] == MODEL]
    pids = {r["worker_pid"] for r in rows}
    assert len(rows) == 2 and len(pids) == 2 and 0 not in pids, rows  # an engine in each worker
    prompts = [" ".join(line.split()[:3]) for line in tiny_llama.LINES[:STREAMS]]
    reference = _streams(openai_port, prompts)
    assert all(r.error is None and r.finish == "length" for r in reference), [(r.error, r.finish) for r in reference]
    assert [r.text for r in reference[STREAMS:]] == [r.text for r in reference[:WHOLE]]  # streamed or not, the same

    before = scrape(server).get(f'conveyor_request_migrations_total{{model="{MODEL}",version="1"}}', 0.0)
    victim = rows[0]["worker_pid"]
    started = threading.Barrier(STREAMS + 1)
    killer_done = threading.Event()

    def kill_when_started() -> None:
        try:
            started.wait(STREAM_TIMEOUT_S)
            os.kill(victim, signal.SIGKILL)  # released at once after: the streams read on while the worker dies
        finally:
            killer_done.set()

    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    moved = _streams(openai_port, prompts, started)
    killer.join(10)
    assert killer_done.is_set()
    for prompt, ref, got in zip(prompts + prompts[:WHOLE], reference, moved, strict=True):
        assert got.error is None, (prompt, got.error)
        assert got.text == ref.text, (prompt, ref.text, got.text)
        assert (got.finish, got.usage) == (ref.finish, ref.usage), prompt
    migrations = scrape(server).get(f'conveyor_request_migrations_total{{model="{MODEL}",version="1"}}', 0.0)
    print(f"requests moved to the other engine: {migrations - before:.0f} of {STREAMS + WHOLE}")  # shown with -s
    assert 1 <= migrations - before <= STREAMS + WHOLE  # the killed engine's requests, once each
