"""Two engines of the tiny Llama (one per worker, vLLM's CPU build), each with a KV cache of 32 blocks,
placed by prefix with the engines' KV-cache events on (the default). A system prompt runs on one engine;
a flood of other prompts evicts it there; the engine's events reach the router, which counts the
eviction on /metrics and forgets that the engine held it; so the prompt, sent again while that engine
is busy with a stream, goes to the idle engine, where the router's own record alone would have sent it
back to the busy one that no longer has it."""

from __future__ import annotations

import http.client
import json
import os
import re
import threading
import time
from collections.abc import Iterator

import pytest

from conveyor.deploy.runtime.procs import mapped_shm, named_by_pid
from conveyor.proto.prefix_keys import block_keys
from conveyor.workers.backends.vllm.priority import descendants
from tests.support import tiny_llama
from tests.support.group import Server, router_control, start_server, wait_all_instances_ready
from tests.support.metrics import scrape

LEVEL = "e2e"

tiny_llama.require_vllm()

pytestmark = pytest.mark.timeout(420)

MODEL = "evicting"
LOAD_TIMEOUT_S = 300.0  # two engines on a busy 2-core host
BLOCK_TOKENS = 32  # vLLM's CPU attention takes multiples of 32
CACHE_BLOCKS = 32  # per engine: a few prompts fill it
PROMPT_TOKENS = 2 * BLOCK_TOKENS  # each prompt's whole blocks (3 blocks with its answer's): ~11 on one engine
MAX_FLOOD = 60  # prompts sent to evict the first at most (about 22 do, half to each engine)
STREAMS = 3  # streams at once on one engine, each of STREAM_TOKENS: it is busy while the first prompt is sent again
STREAM_TOKENS = 180  # with its prompt, within the tiny Llama's 256 positions
WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")
    repo = tmp_path_factory.mktemp("kv_events_repo")
    model_dir = tiny_llama.write_repository(
        repo, tiny, MODEL, enable_lora=False, block_size=BLOCK_TOKENS, enable_prefix_caching=True, max_num_seqs=4,
        num_gpu_blocks_override=CACHE_BLOCKS, kv_cache_memory_bytes=16 << 20,
    )
    (model_dir / "config.pbtxt").write_text('backend: "vllm"\n' + tiny_llama.REPORT_METRICS)  # an engine a worker
    group = f"kv{os.getpid()}"
    srv = start_server(str(repo), group, "--workers", "2", "--model-control-mode", "explicit",
                       "--load-model", "*", ready_timeout=LOAD_TIMEOUT_S)
    engines: set[int] = set()
    left: set[str] = set()
    try:
        wait_all_instances_ready(group, MODEL, 2, LOAD_TIMEOUT_S)
        engines = {pid for row in router_control(group, "instances") for pid in descendants(row["worker_pid"])}
        left = mapped_shm(engines, "psm_")  # vLLM's queues (160 MiB each), which vLLM itself leaves behind
        assert left
        yield srv
    finally:
        assert srv.stop(60) == 0
    # The engines stopped, nothing of them is left in /dev/shm: their queues, nor the semaphores their
    # processes named (scikit-learn's joblib, in vLLM's engine core), which a killed process leaves.
    assert not [name for name in left if os.path.exists(f"/dev/shm/{name}")]
    assert not named_by_pid(engines)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Iterator[str]]:
    """Distinct prompts of PROMPT_TOKENS tokens each (BOS included), as the engines tokenize them."""
    one = tiny_llama.prompts(tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama"), PROMPT_TOKENS, 1)
    yield iter(one, None)


def _computed(srv: Server) -> dict[str, float]:
    """Prompt tokens each engine was asked for so far (its prefix-cache queries)."""
    per: dict[str, float] = {}
    for key, value in scrape(srv).items():
        found = re.match(r'vllm:prefix_cache_queries_total\{(.*)\}$', key)
        if found and f'model="{MODEL}"' in found[1]:
            engine = re.search(r'engine="([^"]+)"', found[1])
            assert engine is not None, key
            per[engine[1]] = value
    return per


def _evicted(srv: Server) -> dict[str, float]:
    """Keys the router forgot per engine because its events said it evicted them."""
    per: dict[str, float] = {}
    for key, value in scrape(srv).items():
        found = re.match(r'conveyor_engine_prefix_evictions_total\{engine="([^"]+)",model="' + MODEL, key)
        if found:
            per[found[1]] = value
    return per


def _generate(srv: Server, prompt: str) -> str:
    """One request; the engine that computed its prompt."""
    before = _computed(srv)
    _post(srv, prompt)
    return _grown(srv, before)


def _post(srv: Server, prompt: str) -> None:
    """One request, greedy, one token."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate", body=json.dumps(
            {"text_input": prompt, "parameters": {"max_tokens": 1, "temperature": 0}}))
        r = conn.getresponse()
        assert r.status == 200, r.read()
        r.read()
    finally:
        conn.close()


def _grown(srv: Server, before: dict[str, float]) -> str:
    """The engine whose prompt tokens grew since ``before`` (its statistics reach /metrics a moment
    after the answer)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        after = _computed(srv)
        grown = [e for e in after if after[e] > before.get(e, 0.0)]
        if grown or time.monotonic() > deadline:
            assert len(grown) == 1, (before, after)
            return grown[0]
        time.sleep(0.02)


def _stream(srv: Server, prompt: str, started: threading.Event, finished: threading.Event) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=120)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate_stream", body=json.dumps(
            {"text_input": prompt, "stream": True, "exclude_input_in_output": True,
             "parameters": {"max_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True}}))
        r = conn.getresponse()
        assert r.status == 200, r.read()
        for line in r:
            if line.startswith(b"data: "):
                started.set()
    finally:
        finished.set()
        conn.close()


def test_a_prompt_its_engine_evicted_goes_to_the_idle_engine(server: Server, prompts: Iterator[str]) -> None:
    rows = [r for r in router_control(server.group, "instances") if r["model"] == MODEL]
    assert len(rows) == 2 and all(r["reports_evictions"] for r in rows), rows  # the record is trusted longer
    system = next(prompts)
    keys = block_keys(system.encode(), "")
    home = _generate(server, system)
    ran: list[tuple[str, str]] = []  # (engine, prompt) of each prompt of the flood
    deadline = time.monotonic() + WAIT_S
    while _evicted(server).get(home, 0) < len(keys):  # the oldest first: the system prompt's blocks go first
        assert len(ran) < MAX_FLOOD and time.monotonic() < deadline, (ran, _evicted(server))
        prompt = next(prompts)
        ran.append((_generate(server, prompt), prompt))
    assert len({engine for engine, _ in ran}) == 2  # the flood went to both engines
    # Streams that go to the same engine (the head of the last prompt it ran, which it still holds).
    last_home = next(prompt for engine, prompt in reversed(ran) if engine == home)
    started = [threading.Event() for _ in range(STREAMS)]
    finished = [threading.Event() for _ in range(STREAMS)]
    streaming = [threading.Thread(target=_stream, args=(server, f"{last_home} and {i}", started[i], finished[i]))
                 for i in range(STREAMS)]
    before = _computed(server)
    for thread in streaming:
        thread.start()
    try:
        assert all(event.wait(WAIT_S) for event in started)
        _post(server, system)  # at once: the streams run on
        assert not all(event.is_set() for event in finished)  # some still ran when the system prompt was placed
    finally:
        for thread in streaming:
            thread.join(WAIT_S)
    (away,) = set(before) - {home}
    deadline = time.monotonic() + WAIT_S
    while (_computed(server)[home] - before[home] < STREAMS * PROMPT_TOKENS
           or _computed(server)[away] == before[away]) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = _computed(server)
    assert after[home] - before[home] >= STREAMS * PROMPT_TOKENS  # the streams ran on the engine that evicted it
    assert after[away] > before[away], (before, after)  # the system prompt went to the other engine
    assert after[home] - before[home] < (STREAMS + 1) * PROMPT_TOKENS  # not to the busy one
