"""Adaptive batching against static dynamic_batching settings, measured with perf_analyzer.

    python -m conveyor.deploy.benchmarks.adaptive [--concurrency 1 16] [--repeat 2] [--target-us 8000]

Serves ``matmul_stack`` (benchmarks/models.py: batching pays) under several
names that differ only in their batching settings, each with two CPU instances
on two workers, and runs perf_analyzer over HTTP on each in ``--repeat`` rounds
(every variant at every concurrency, then the next round: the machine is
shared, so compare medians over rounds, not single figures). Writes
bench-results/adaptive.{json,md}, per run and medians; the figures go into
docs/SCHEDULING.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from statistics import median

from conveyor.deploy.benchmarks.models import matmul_stack
from conveyor.deploy.benchmarks.perf import ROOT, perf_analyzer, run_one, wait_ready

INSTANCES = "instance_group [ { count: 2 kind: KIND_CPU } ]"


def variants(target_us: int) -> dict[str, str]:
    """Model name -> its batching config (each also gets INSTANCES)."""
    return {
        "no_batching": "",
        "static_0": "dynamic_batching { }",
        "static_2ms": "dynamic_batching { max_queue_delay_microseconds: 2000 }",
        "static_4ms": "dynamic_batching { max_queue_delay_microseconds: 4000 }",
        "static_6ms": "dynamic_batching { max_queue_delay_microseconds: 6000 }",
        f"adaptive_{target_us // 1000}ms": "dynamic_batching { }\nparameters { key: \"conveyor.latency_target_us\" "
                                          f"value {{ string_value: \"{target_us}\" }} }}",
    }


def counts(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of the model's statistics."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=5) as r:
        stats = json.load(r)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--target-us", type=int, default=8000)
    ap.add_argument("--models", nargs="*", help="only these variants (default: all)")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args()

    pa = perf_analyzer(ROOT / ".cache")
    repo = tempfile.mkdtemp(prefix="conveyor-adaptive-")
    models = variants(args.target_us)
    if args.models:
        models = {name: config for name, config in models.items() if name in args.models}
    for name, batching in models.items():
        matmul_stack(repo, name, 16, f"{INSTANCES}\n{batching}")
    server = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", f"adapt{os.getpid()}",
        "--model-repository", repo, "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
        "--http-port", "18100", "--grpc-port", "18101", "--metrics-port", "18102", "--workers", "2",
    ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        wait_ready("127.0.0.1:18100")
        # Rounds of every variant in turn: the machine's speed drifts (other tenants), so
        # variants measured minutes apart are not comparable; medians over rounds are.
        for run in range(args.repeat):
            for c in args.concurrency:
                for name in models:
                    before = counts("127.0.0.1:18100", name)
                    figures = run_one(pa, "127.0.0.1:18100", "http", name, c, args.seconds)
                    after = counts("127.0.0.1:18100", name)
                    rows = (after[0] - before[0]) / max(after[1] - before[1], 1)
                    results.append({"model": name, "concurrency": c, "run": run + 1, **figures,
                                    "rows_per_execution": rows})
                    print(json.dumps(results[-1]), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "adaptive.json").write_text(json.dumps(results, indent=2))
    lines = ["| model | concurrency | run | infer/s | p50 ms | p99 ms | rows/execution |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['concurrency']} | {r['run']} | {r['infer_per_sec']:.0f} | "
              f"{r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | {r['rows_per_execution']:.1f} |"
              for r in results]
    lines += ["", "| model | concurrency | median infer/s | median p50 ms | median p99 ms | rows/execution |",
              "|---|---|---|---|---|---|"]
    for c in args.concurrency:
        for name in models:
            runs = [r for r in results if r["model"] == name and r["concurrency"] == c]
            lines.append(f"| {name} | {c} | {median(r['infer_per_sec'] for r in runs):.0f} | "
                         f"{median(r['p50_us'] for r in runs) / 1000:.2f} | "
                         f"{median(r['p99_us'] for r in runs) / 1000:.2f} | "
                         f"{median(r['rows_per_execution'] for r in runs):.1f} |")
    Path(args.out, "adaptive.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
