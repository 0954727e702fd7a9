"""Two engines of one vLLM model (one per worker, two workers), the tiny Llama on vLLM's CPU
build, placed by prefix and then round-robin (changed at run time, in place). A workload of a few
long system prompts, each followed by several short user turns, sent through Triton's generate
endpoint: the prompt tokens the engines have to compute (their own prefix-cache counters, per
engine on /metrics) are far fewer when each system prompt goes back to the engine that has it,
and both engines serve. Last, as the group's last test (it kills a worker): greedy streams through the
OpenAI endpoint, Triton's generate_stream and gRPC's ModelStreamInfer survive the death of one engine's
worker (``kill -9``), each moved to the other engine and completed with the text of an uninterrupted run,
token for token, as are requests that do not stream (ingress/migration.py, ingress/openai/migration.py,
ingress/tensor_migration.py); a stream with stop strings, which cannot go on exactly, ends with the
worker's error and why."""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
# Requests at once over the three ingresses: as many as both engines run at once (max_num_seqs each); the
# survivor takes the moved ones beside its own.
STREAMS = 7  # OpenAI streams (16 requests in all)
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


@dataclass
class _Stream:
    text: str = ""
    chunks: int = 0
    finish: str | None = None
    usage: tuple[int, int] | None = None
    error: BaseException | str | None = None  # raised by the client, or an in-stream error's message
    started: threading.Event = field(default_factory=threading.Event)  # text shown (or the answer came)
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Job:
    """One request to run in a thread: ``run(out, on_started)``; ``streamed``: it shows text as it goes."""

    run: Callable[[_Stream, threading.Barrier | None], None]
    streamed: bool
    prompt: str


def _shown(out: _Stream, text: str, on_started: threading.Barrier | None) -> None:
    """One more chunk of a stream; with ``on_started``, the stream waits there once it has shown
    ``STARTED_CHUNKS`` chunks (reading on after)."""
    out.text += text
    out.chunks += 1
    out.started.set()
    if on_started is not None and out.chunks == STARTED_CHUNKS:
        on_started.wait(STREAM_TIMEOUT_S)


def _openai(port: int, prompt: str, stream: bool) -> _Job:
    """Through /v1/completions, greedy and to ``STREAM_TOKENS`` tokens."""
    args: dict[str, Any] = {"model": MODEL, "max_tokens": STREAM_TOKENS, "temperature": 0,
                            "extra_body": {"ignore_eos": True}}

    def run(out: _Stream, on_started: threading.Barrier | None) -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                               timeout=STREAM_TIMEOUT_S)
        if not stream:
            whole = client.completions.create(prompt=prompt, **args)
            assert whole.usage is not None
            out.text, out.finish = whole.choices[0].text, whole.choices[0].finish_reason
            out.usage = (whole.usage.prompt_tokens, whole.usage.completion_tokens)
            return
        for chunk in client.completions.create(prompt=prompt, stream=True, stream_options={"include_usage": True},
                                               **args):
            if chunk.usage is not None:
                out.usage = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
            for choice in chunk.choices:
                out.finish = choice.finish_reason or out.finish
                _shown(out, choice.text, on_started)

    return _Job(run, stream, prompt)


GREEDY = {"max_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True}
BLOCKED = {**GREEDY, "stop": ["@@@"]}  # never met: the text is the greedy run's, but the engine holds state


def _generate(srv: Server, prompt: str, stream: bool, sampling: dict[str, Any], as_parameters: bool = False) -> _Job:
    """Through Triton's ``generate_stream`` (or ``generate``), the sampling parameters as the
    ``sampling_parameters`` input or (``as_parameters``) the request's parameters."""
    body: dict[str, Any] = {"text_input": prompt, "stream": stream, "exclude_input_in_output": True,
                            "return_finish_reason": True, "return_num_input_tokens": True,
                            "return_num_output_tokens": True}
    if as_parameters:
        body["parameters"] = sampling
    else:
        body["sampling_parameters"] = json.dumps(sampling)

    def run(out: _Stream, on_started: threading.Barrier | None) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=STREAM_TIMEOUT_S)
        try:
            conn.request("POST", f"/v2/models/{MODEL}/{'generate_stream' if stream else 'generate'}",
                         body=json.dumps(body))
            r = conn.getresponse()
            assert r.status == 200, r.read()
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
                if stream:
                    _shown(out, doc["text_output"], on_started)
                else:
                    out.text = doc["text_output"]
        finally:
            conn.close()

    return _Job(run, stream, prompt)


def _grpc(srv: Server, prompt: str) -> _Job:
    """Through gRPC's ModelStreamInfer, greedy."""
    def run(out: _Stream, on_started: threading.Barrier | None) -> None:
        def tensor(name: str, dtype: str, value: Any) -> grpcclient.InferInput:
            t = grpcclient.InferInput(name, [1], dtype)
            t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else bool))
            return t

        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        try:
            client.async_stream_infer(MODEL, [tensor("text_input", "BYTES", prompt.encode()),
                                              tensor("sampling_parameters", "BYTES", json.dumps(GREEDY).encode()),
                                              tensor("stream", "BOOL", True),
                                              tensor("return_finish_reason", "BOOL", True)],
                                      request_id="g", enable_empty_final_response=True)
            while True:
                result, error = got.get(timeout=STREAM_TIMEOUT_S)
                if error is not None:
                    out.error = error.message()
                    return
                text = result.as_numpy("text_output")
                reason = result.as_numpy("finish_reason")
                if reason is not None and reason.reshape(-1)[0] != b"None":
                    out.finish = reason.reshape(-1)[0].decode()
                if text is not None:
                    _shown(out, b"".join(text.reshape(-1)).decode(), on_started)
                if result.get_response().parameters["triton_final_response"].bool_param:
                    return
        finally:
            client.stop_stream()
            client.close()

    return _Job(run, True, prompt)


def _run(jobs: list[_Job], on_started: threading.Barrier | None = None, last: Sequence[_Job] = ()) -> list[_Stream]:
    """Every job at once; then, once each streamed one has shown text, each of ``last`` in turn, the next
    once the one before has shown text (two in turn go to both engines under round-robin). The outcomes,
    ``last``'s at the end."""
    found = [_Stream() for _ in (*jobs, *last)]

    def run(job: _Job, out: _Stream) -> None:
        try:
            job.run(out, on_started)
        except BaseException as exc:  # shown by the test's assertion
            out.error = exc
        finally:
            out.started.set()
            out.done.set()

    threads = []
    for job, out in zip(jobs, found, strict=False):
        threads.append(threading.Thread(target=run, args=(job, out), daemon=True))
        threads[-1].start()
    for job, out in zip(jobs, found, strict=False):
        assert not job.streamed or out.started.wait(STREAM_TIMEOUT_S), "a stream did not start"
    for job, out in zip(last, found[len(jobs):], strict=True):
        threads.append(threading.Thread(target=run, args=(job, out), daemon=True))
        threads[-1].start()
        assert out.started.wait(STREAM_TIMEOUT_S), "a stream did not start"
    for t in threads:
        t.join(STREAM_TIMEOUT_S)
    assert all(out.done.is_set() for out in found), "a request did not end in time"
    return found


def test_streams_survive_the_death_of_their_engines_worker(server: Server, openai_port: int) -> None:
    """The last test of the module: it kills a worker. Round-robin spreads the requests over both engines:
    greedy streams and requests that do not stream through the OpenAI endpoint, Triton's generate_stream and
    generate, and gRPC's ModelStreamInfer. The worker of one engine is killed once every stream has shown
    some text; its requests move to the other engine and go on: every one's text is the uninterrupted run's,
    token for token, and its counts the same. Pairs started in turn go one to each engine, so the killed
    one has a generate_stream and a ModelStreamInfer stream (a pair each) and one of two generate_streams
    with stop strings, which cannot go on exactly: that one ends with the worker's error and why, in-stream."""
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
    jobs = ([_openai(openai_port, p, True) for p in prompts] + [_openai(openai_port, p, False) for p in prompts[:WHOLE]]
            + [_generate(server, prompts[0], False, GREEDY, True)])
    pairs = [_generate(server, prompts[1], True, GREEDY), _generate(server, prompts[2], True, GREEDY, True),
             _grpc(server, prompts[3]), _grpc(server, prompts[4])]
    blocked = [_generate(server, p, True, BLOCKED) for p in prompts[5:7]]
    # The uninterrupted run; the stop strings' streams by the greedy ones of their prompts (never met).
    reference = _run(jobs + pairs + [_generate(server, p, True, GREEDY) for p in prompts[5:7]])
    assert all(r.error is None and r.finish == "length" for r in reference), [(r.error, r.finish) for r in reference]
    assert [r.text for r in reference[STREAMS:STREAMS + WHOLE]] == [r.text for r in reference[:WHOLE]]
    assert reference[STREAMS + WHOLE].text == reference[0].text  # generate as the OpenAI endpoint

    metric = f'conveyor_request_migrations_total{{model="{MODEL}",version="1"}}'
    before = scrape(server).get(metric, 0.0)
    victim = rows[0]["worker_pid"]
    below = descendants(victim)  # its engine core and the engine's model worker
    segments = mapped_shm(below, "psm_")  # vLLM's queues between them (160 MiB each), which vLLM leaves behind
    assert segments, below
    started = threading.Barrier(sum(job.streamed for job in jobs + pairs + blocked) + 1)
    killer_done = threading.Event()

    def kill_when_started() -> None:
        try:
            started.wait(STREAM_TIMEOUT_S)
            os.kill(victim, signal.SIGKILL)  # released at once after: the streams read on while the worker dies
        finally:
            killer_done.set()

    killer = threading.Thread(target=kill_when_started, daemon=True)
    killer.start()
    moved = _run(jobs, started, pairs + blocked)
    killer.join(10)
    assert killer_done.is_set()
    for job, ref, got in zip(jobs + pairs, reference, moved, strict=False):
        assert got.error is None, (job.prompt, got.error)
        assert got.text == ref.text, (job.prompt, ref.text, got.text)
        assert (got.finish, got.usage) == (ref.finish, ref.usage), job.prompt
    ended = 0
    for job, ref, got in zip(blocked, reference[-len(blocked):], moved[-len(blocked):], strict=True):
        if got.error is None:  # on the engine that lived
            assert got.text == ref.text, (job.prompt, ref.text, got.text)
            continue
        ended += 1
        assert isinstance(got.error, str), got.error
        assert re.fullmatch(r"the worker running this request exited \(.*\); not resumed on another engine: "
                            r"it has stop strings, .*", got.error), got.error
        assert ref.text.startswith(got.text), (ref.text, got.text)  # what it showed before, no more
    assert ended == 1, "the stop strings' streams did not go one to each engine"
    migrations = scrape(server).get(metric, 0.0) - before
    print(f"requests moved to the other engine: {migrations:.0f} of {len(jobs + pairs)}")  # shown with -s
    # The killed engine's requests, once each (a generate_stream and a ModelStreamInfer stream among them);
    # the stop strings' stays.
    assert 2 <= migrations <= len(jobs) + len(pairs) // 2
    # What the dead worker had started is killed by the supervisor, and its shared memory unlinked.
    eventually(lambda: not [pid for pid in below if running(pid)], 30, what="its engine processes killed")
    assert not [name for name in segments if os.path.exists(f"/dev/shm/{name}")]
