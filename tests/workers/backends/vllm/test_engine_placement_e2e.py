"""Two engines of one vLLM model (``instance_group { count: 2 }``), the tiny Llama on vLLM's CPU
build, placed by prefix and then round-robin (changed at run time, in place). A workload of a few
long system prompts, each followed by several short user turns, sent through Triton's generate
endpoint: the prompt tokens the engines have to compute (their own prefix-cache counters, per
engine on /metrics) are far fewer when each system prompt goes back to the engine that has it,
and both engines serve."""

from __future__ import annotations

import http.client
import json
import os
import random
import re
from collections.abc import Iterator

import pytest

from tests.support import tiny_llama
from tests.support.group import Server, start_server, wait_all_instances_ready

tiny_llama.require_vllm()

pytestmark = pytest.mark.timeout(420)

MODEL = "pair"
LOAD_TIMEOUT_S = 300.0  # two engines (each importing vLLM in its engine-core process), on a busy 2-core host
SYSTEM_PROMPTS = 7  # odd: under round-robin a prompt's turns alternate between the engines
TURNS = 3
BLOCK_TOKENS = 32  # the engines' block size (vLLM's CPU attention takes multiples of 32)
SYSTEM_TOKENS = 6 * BLOCK_TOKENS  # most of a 256-token context, so the shared head dominates the work
CONFIG = """backend: "vllm"
instance_group [ { count: 2 kind: KIND_MODEL } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tiny = tiny_llama.build(tmp_path_factory.getbasetemp() / "tiny_llama")
    repo = tmp_path_factory.mktemp("placement_repo")
    model_dir = tiny_llama.write_repository(
        repo, tiny, MODEL, enable_lora=False, block_size=BLOCK_TOKENS, enable_prefix_caching=True, max_num_seqs=8,
        kv_cache_memory_bytes=16 << 20,
    )
    (model_dir / "config.pbtxt").write_text(CONFIG)
    group = f"pl{os.getpid()}"
    srv = start_server(str(repo), group, "--workers", "1", "--model-control-mode", "explicit",
                       "--load-model", "*", ready_timeout=LOAD_TIMEOUT_S)
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
    """Load the model's config with another ENGINE_PLACEMENT: applied in place, the engines stay."""
    status, body = _request(srv, "GET", f"/v2/models/{MODEL}/config")
    assert status == 200, body
    config = json.loads(body)
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
