"""CPU per streamed token of each frontend process, on a fixed workload: Conveyor's worker, OpenAI
ingress and router (and, with ``--vllm``, vLLM's own API server), the engine's processes apart.

    python -m conveyor.deploy.benchmarks.llm_frontend_cpu --clients 1 32
    python -m conveyor.deploy.benchmarks.llm_frontend_cpu --checkout ../conveyor-old --checkout . --rounds 3
    python -m conveyor.deploy.benchmarks.llm_frontend_cpu --vllm --clients 32

``llm_openai.py`` measures throughput against vLLM's server with aiperf, whose own CPU shares the
host; tokens per second swing with the host's noise there, CPU seconds per token much less. This
script sends the same kind of request (streaming chat, ``--tokens`` tokens, greedy, ``ignore_eos``,
usage on every chunk as aiperf's ``--per-chunk-usage`` asks) from a plain asyncio client of little
CPU, ``--requests`` requests per client, and reads each process's CPU time from /proc before and
after: µs per output token by role, and by thread name in Conveyor's worker (its engine loop thread,
``vllm-<model>``, hands out the tokens). ``--checkout DIR`` (repeatable) serves Conveyor from another
checkout's ``build/src``: groups of two commits up at once, run in turn, the order swapped every
round, on the same workload. A benchmark, not a test; writes bench-results/llm_frontend_cpu.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conveyor.deploy.benchmarks import llm_openai
from conveyor.deploy.benchmarks.perf import cpu_seconds
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import group_processes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import tiny_llama  # noqa: E402

_USAGE = re.compile(rb'"completion_tokens":(\d+)')
_END = b"0\r\n\r\n"  # the last chunk of a chunked body
READ_BYTES = 1 << 16


@dataclass
class Result:
    server: str  # "conveyor <checkout>" or "vllm"
    clients: int
    round: int
    tokens: int
    chunks: int
    seconds: float
    ttft_ms_p50: float
    us_per_token: dict[str, float] = field(default_factory=dict)  # by role
    worker_threads: dict[str, float] = field(default_factory=dict)  # Conveyor's worker, by thread name
    texts: list[str] = field(default_factory=list)  # one request's text per prompt, to compare servers


def _body(model: str, prompt: str, tokens: int) -> bytes:
    return json.dumps({
        "model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
        "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True, "temperature": 0,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }).encode()


async def _client(port: int, model: str, prompts: list[str], requests: int, tokens: int,
                  out: list[tuple[int, int, float, str]]) -> None:
    """``requests`` streamed chats one after another on one connection; (tokens, chunks, time to the
    first chunk, text) each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(requests):
            body = _body(model, prompts[i % len(prompts)], tokens)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            start = time.perf_counter()
            first = 0.0
            data = bytearray()
            while not data.endswith(_END):
                got = await reader.read(READ_BYTES)
                if not got:
                    raise ConnectionError("the server closed the connection")
                if not first and b"data: " in got:
                    first = time.perf_counter() - start
                data += got
            counts = _USAGE.findall(data)
            chunks = data.count(b"data: ") - 2  # less the usage chunk and [DONE]
            out.append((int(counts[-1]) if counts else 0, chunks, first, _text(bytes(data))))
    finally:
        writer.close()


def _text(data: bytes) -> str:
    """The streamed content, chunks joined (the chunked framing's size lines skipped)."""
    text = []
    for line in data.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice.get("delta", {}).get("content") or "")
    return "".join(text)


def _cpu(pgid: int) -> tuple[dict[int, tuple[str, float]], dict[str, float]]:
    """pid -> (role, CPU s) for the group; and CPU s by thread name in Conveyor's worker(s)."""
    procs = group_processes(pgid)
    by_pid = {pid: (llm_openai._role(argv), cpu_seconds(pid)) for pid, argv in procs.items()}
    threads: dict[str, float] = {}
    for pid, (role, _) in by_pid.items():
        if role != "worker":
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    raw = f.read()
            except OSError:
                continue
            name = raw[raw.index("(") + 1:raw.rindex(")")]
            name = re.sub(r"\d+$", "#", name)  # ZMQbg/IO/0, asyncio_3 ...: one row per kind
            fields = raw.rsplit(")", 1)[1].split()
            threads[name] = threads.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return by_pid, threads


async def _workload(port: int, model: str, clients: int, requests: int, tokens: int,
                    ) -> list[tuple[int, int, float, str]]:
    out: list[tuple[int, int, float, str]] = []
    await asyncio.gather(*(_client(port, model, llm_openai.PROMPTS[c % len(llm_openai.PROMPTS):]
                                   + llm_openai.PROMPTS[:c % len(llm_openai.PROMPTS)], requests, tokens, out)
                           for c in range(clients)))
    return out


def measure(server: llm_openai.Server, label: str, clients: int, requests: int, tokens: int, rnd: int) -> Result:
    asyncio.run(_workload(server.port, server.models[0], clients, 1, tokens))  # warm: each client once
    before, threads_before = _cpu(server.proc.pid)
    start = time.perf_counter()
    found = asyncio.run(_workload(server.port, server.models[0], clients, requests, tokens))
    seconds = time.perf_counter() - start
    after, threads_after = _cpu(server.proc.pid)
    total = sum(t for t, _, _, _ in found)
    per_role: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        per_role[role] = per_role.get(role, 0.0) + cpu - before.get(pid, (role, 0.0))[1]
    us = {role: round(1e6 * cpu / total, 1) for role, cpu in sorted(per_role.items()) if cpu > 0}
    threads = {name: round(1e6 * (cpu - threads_before.get(name, 0.0)) / total, 1)
               for name, cpu in sorted(threads_after.items()) if cpu - threads_before.get(name, 0.0) > 0}
    texts: dict[str, str] = {}
    for _, _, _, text in found:
        texts.setdefault(text[:12], text)
    result = Result(label, clients, rnd, total, sum(c for _, c, _, _ in found), round(seconds, 2),
                    round(1e3 * statistics.median(f for _, _, f, _ in found), 1), us, threads, sorted(texts.values()))
    frontend = sum(v for role, v in us.items() if not role.startswith("VLLM::") and role != "other")
    print(f"{label:28} c={clients:<3} round {rnd}  {total / seconds:7.0f} tok/s  {total} tokens in "
          f"{result.chunks} chunks  ttft p50 {result.ttft_ms_p50} ms  frontend {frontend:.0f} µs/token: "
          + ", ".join(f"{r} {v:.0f}" for r, v in us.items())
          + ("  worker threads: " + ", ".join(f"{n} {v:.0f}" for n, v in threads.items()) if threads else ""),
          flush=True)
    return result


def start_conveyor(repo: Path, checkout: Path, group: str) -> llm_openai.Server:
    port = free_port()
    cmd = [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", str(repo), "--group", group,
           "--workers", "1", "--http-port", str(free_port()), "--grpc-port", str(free_port()),
           "--metrics-port", str(free_port()), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--openai-port", str(port), "--openai-address", "127.0.0.1"]
    env = {**os.environ, "PYTHONPATH": str(checkout.resolve() / "build" / "src")}
    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
    llm_openai._wait(f"http://127.0.0.1:{port}/v1/models", proc)
    return llm_openai.Server(f"conveyor {checkout}", port, proc, ["vllm_model"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--requests", type=int, default=0, help="per client (default: 48 at 1 client, 6 at 32 and more)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--checkout", type=Path, action="append", default=[],
                    help="serve Conveyor from this checkout's build/src (repeatable; default: this one)")
    ap.add_argument("--vllm", action="store_true", help="vLLM's own API server too")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="llm-cpu-"))
    tiny = tiny_llama.build(root / "tiny")
    repo = root / "models"
    tiny_llama.write_repository(repo, tiny)
    servers: list[llm_openai.Server] = []
    results: list[Result] = []
    try:
        for i, checkout in enumerate(args.checkout or [ROOT]):
            servers.append(start_conveyor(repo, checkout, f"llmcpu{os.getpid()}x{i}"))
        if args.vllm:
            servers.append(llm_openai.start_vllm(tiny))
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for clients in args.clients:
                requests = args.requests or max(6, 48 // clients)
                for server in order:
                    results.append(measure(server, server.name, clients, requests, args.tokens, rnd))
    finally:
        for server in servers:
            llm_openai.stop(server)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "llm_frontend_cpu.json"), "w") as f:
        json.dump([asdict(r) for r in results], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
