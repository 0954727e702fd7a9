"""``ENGINE_PLACEMENT`` prefix against round_robin: two engines of one vLLM model, the same workload,
the placements alternated in one run (changed in place between rounds, the engines kept).

    python -m conveyor.deploy.benchmarks.engine_placement --rounds 3 --clients 4

The model is the tiny Llama of tests/support/tiny_llama.py, two engines (``instance_group
{ count: 2 }``, one worker, 32-token blocks). Each round of each placement sends fresh system
prompts (``--systems`` of ``--system-tokens`` tokens: nothing of them is cached yet), each followed
by ``--turns`` short user turns, turn by turn, from ``--clients`` concurrent clients over Triton's
``generate_stream`` (``--tokens`` greedy tokens each). Per round: time to first token (p50, p90,
from the request's start to its first streamed chunk) and the prompt tokens the engines computed
(their prefix-cache queries minus hits, from /metrics). The summary gives round_robin ÷ prefix
of each, medians over the rounds: above 1, prefix placement is ahead.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import group_processes

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.support import tiny_llama  # noqa: E402

MODEL = "pair"
BLOCK_TOKENS = 32  # vLLM's CPU attention takes multiples of 32
PLACEMENTS = ("prefix", "round_robin")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _post(port: int, path: str, body: object) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", path, body=json.dumps(body))
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


class Group:
    def __init__(self, repo: Path) -> None:
        self.http, self.metrics = free_port(), free_port()
        self.proc = subprocess.Popen([
            sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", str(repo),
            "--group", f"placement{os.getpid()}", "--workers", "1", "--http-port", str(self.http),
            "--grpc-port", str(free_port()), "--metrics-port", str(self.metrics), "--http-address", "127.0.0.1",
            "--grpc-address", "127.0.0.1", "--model-control-mode", "explicit", "--load-model", "*",
        ], start_new_session=True)
        deadline = time.monotonic() + 600
        while self._engines() < 2:  # both engines: the model is ready as soon as one serves
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the group did not serve two engines in time")
            time.sleep(1)

    def _engines(self) -> int:
        try:
            return len(self.computed())
        except OSError:
            return 0

    def computed(self) -> dict[str, float]:
        """Each engine's prompt tokens computed so far: prefix-cache queries minus hits."""
        per: dict[str, float] = {}
        _, body = _get(self.metrics, "/metrics")
        for line in body.decode().splitlines():
            found = re.match(r'vllm:prefix_cache_(queries|hits)_total\{(.*)\} (\S+)$', line)
            engine = re.search(r'engine="([^"]+)"', found[2]) if found else None
            if found and engine:
                per[engine[1]] = per.get(engine[1], 0.0) + (1 if found[1] == "queries" else -1) * float(found[3])
        return per

    def place(self, placement: str) -> None:
        _, body = _get(self.http, f"/v2/models/{MODEL}/config")
        config = json.loads(body)
        config.setdefault("parameters", {})["ENGINE_PLACEMENT"] = {"string_value": placement}
        status, body = _post(self.http, f"/v2/repository/models/{MODEL}/load",
                             {"parameters": {"config": json.dumps(config)}})
        if status != 200:
            raise RuntimeError(f"placement {placement}: {status} {body!r}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            for pid in group_processes(self.proc.pid):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            self.proc.wait()


def _first_token_s(port: int, prompt: str, tokens: int) -> float:
    """Seconds from the request's start to its first streamed chunk (the rest is read to the end)."""
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate_stream", body=json.dumps({
            "text_input": prompt, "parameters": {"max_tokens": tokens, "temperature": 0, "ignore_eos": True},
        }))
        r = conn.getresponse()
        first = 0.0
        while line := r.readline():
            if line.startswith(b"data:") and not first:
                first = time.perf_counter() - start
        if r.status != 200 or not first:
            raise RuntimeError(f"generate_stream answered {r.status}")
        return first
    finally:
        conn.close()


def _wider(tiny: tiny_llama.TinyLlama, path: Path, hidden: int, layers: int, context: int) -> Path:
    """A Llama of ``hidden`` x ``layers`` with random weights and the tiny one's tokenizer: a model
    whose prefill takes long enough that computing a prompt's head again shows in the time to first
    token (the tiny one's 256-token prefill is a small part of an engine step)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tiny.model_dir))
    tokenizer.save_pretrained(str(path))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=context, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False, torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(str(path), safe_serialization=True)
    return path


def _systems(tokenizer: object, rng: random.Random, count: int, tokens: int) -> list[str]:
    """``count`` system prompts of exactly ``tokens`` tokens (BOS included): whole blocks."""
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    out: list[str] = []
    while len(out) < count:
        text = rng.choice(words)
        while len(tokenizer(text)["input_ids"]) < tokens:  # type: ignore[operator]
            text += " " + rng.choice(words)
        if len(tokenizer(text)["input_ids"]) == tokens:  # type: ignore[operator]
            out.append(text)
    return out


def run_round(group: Group, systems: list[str], args: argparse.Namespace, rng: random.Random) -> dict[str, float]:
    words = " ".join(tiny_llama.LINES).replace(",", "").split()
    prompts = [f"{system}\nuser {turn}: {' '.join(rng.choice(words) for _ in range(4))}"
               for turn in range(args.turns) for system in systems]
    ttft: list[float] = []
    lock = threading.Lock()
    todo = iter(prompts)

    def client() -> None:
        while True:
            with lock:
                prompt = next(todo, None)
            if prompt is None:
                return
            took = _first_token_s(group.http, prompt, args.tokens)
            with lock:
                ttft.append(took)

    before = group.computed()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = group.computed()
    q = statistics.quantiles(ttft, n=10)
    per = {e: after[e] - before.get(e, 0.0) for e in after}
    return {"ttft_p50_ms": statistics.median(ttft) * 1e3, "ttft_p90_ms": q[-1] * 1e3,
            "computed": sum(per.values()), "min_engine_share": min(per.values()) / max(sum(per.values()), 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--systems", type=int, default=7)
    ap.add_argument("--system-tokens", type=int, default=6 * BLOCK_TOKENS)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=0,
                    help="a wider model instead of the tiny Llama (random weights, its tokenizer): hidden size")
    ap.add_argument("--layers", type=int, default=4, help="with --hidden: layers")
    ap.add_argument("--context", type=int, default=2048, help="with --hidden: max_model_len")
    ap.add_argument("--kv-mib", type=int, default=256, help="with --hidden: each engine's KV cache")
    ap.add_argument("--kv-events", choices=("on", "off"), default="on",
                    help="off: KV_CACHE_EVENTS false (the engines publish no KV-cache events)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results" / "engine_placement.md")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix="placement-"))
    tiny = tiny_llama.build(work / "tiny")
    engine: dict[str, object] = {"enable_lora": False, "block_size": BLOCK_TOKENS, "enable_prefix_caching": True,
                                 "kv_cache_memory_bytes": 16 << 20}
    if args.hidden:
        tiny = tiny_llama.TinyLlama(_wider(tiny, work / "wider", args.hidden, args.layers, args.context), {})
        engine.update(max_model_len=args.context, kv_cache_memory_bytes=args.kv_mib << 20)
    model_dir = tiny_llama.write_repository(work / "repo", tiny, MODEL, **engine)
    events = '' if args.kv_events == "on" else 'parameters { key: "KV_CACHE_EVENTS" value { string_value: "false" } }\n'
    (model_dir / "config.pbtxt").write_text(
        'backend: "vllm"\ninstance_group [ { count: 2 kind: KIND_MODEL } ]\n' + events + tiny_llama.REPORT_METRICS)
    tokenizer = AutoTokenizer.from_pretrained(str(tiny.model_dir))
    rng = random.Random(0)
    group = Group(work / "repo")
    results: dict[str, list[dict[str, float]]] = {p: [] for p in PLACEMENTS}
    try:
        current = "prefix"  # the default
        for rnd in range(args.rounds):
            for placement in PLACEMENTS if rnd % 2 == 0 else PLACEMENTS[::-1]:
                if placement != current:  # the same config again would load the model anew
                    group.place(placement)
                    current = placement
                systems = _systems(tokenizer, rng, args.systems, args.system_tokens)
                results[placement].append(run_round(group, systems, args, rng))
                print(placement, rnd, results[placement][-1], flush=True)
    finally:
        group.stop()
    model = f"a {args.hidden}x{args.layers} Llama" if args.hidden else "the tiny Llama"
    lines = [f"{model}, {args.systems} system prompts of {args.system_tokens} tokens x {args.turns} turns, "
             f"{args.clients} clients, {args.tokens} tokens each, {args.rounds} rounds alternated, "
             f"KV-cache events {args.kv_events}", "",
             "| placement | TTFT p50 ms | TTFT p90 ms | prompt tokens computed | smaller engine's share |",
             "|---|---|---|---|---|"]
    for placement, runs in results.items():
        cells = [" / ".join(f"{r[k]:.0f}" if k != "min_engine_share" else f"{r[k]:.2f}" for r in runs)
                 for k in ("ttft_p50_ms", "ttft_p90_ms", "computed", "min_engine_share")]
        lines.append(f"| {placement} | {' | '.join(cells)} |")

    def ratio(key: str) -> float:
        return statistics.median(r[key] for r in results["round_robin"]) / statistics.median(
            r[key] for r in results["prefix"])

    lines += ["", f"round_robin / prefix (medians): TTFT p50 {ratio('ttft_p50_ms'):.2f}x, "
              f"TTFT p90 {ratio('ttft_p90_ms'):.2f}x, prompt tokens computed {ratio('computed'):.2f}x"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
