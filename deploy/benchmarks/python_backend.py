"""The same Triton ``model.py`` under Conveyor and under real Triton 2.51, measured
with perf_analyzer, with each server's own statistics beside the client's figures.

    python -m conveyor.deploy.benchmarks.python_backend [--concurrency 1 4] [--protocol http grpc] [--no-triton]

End-to-end figures (infer/s, p50, p99) say what a client sees. The statistics
extension's per-request ``compute_input`` + ``compute_infer`` + ``compute_output``
say what the *backend* costs: in Triton that includes its stub round trip (the
request and response cross into a separate stub process through shared memory
and a message queue); in Conveyor ``model.py`` runs inside the worker, so it is
the call itself plus the views on the batch. ``queue`` is the time between the
request reaching the scheduler and an instance taking it.

Real Triton runs through ``../shared/tools/real-triton`` (python backend only) in
``.cache/triton``. Writes bench-results/python_backend.{json,md}; the figures go
into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

from conveyor.deploy.benchmarks.perf import ROOT, perf_analyzer, run_one, wait_ready

REAL_TRITON = ROOT.parent / "shared" / "tools" / "real-triton"
MODEL = "py_identity"
MODEL_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            r, "INPUT0").as_numpy())]) for r in requests]
'''
CONFIG = f'''
name: "{MODEL}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''
HTTP, GRPC = 18200, 18201


def write_repo() -> str:
    repo = tempfile.mkdtemp(prefix="conveyor-pybench-")
    os.makedirs(os.path.join(repo, MODEL, "1"))
    Path(repo, MODEL, "1", "model.py").write_text(textwrap.dedent(MODEL_PY).lstrip())
    Path(repo, MODEL, "config.pbtxt").write_text(textwrap.dedent(CONFIG).lstrip())
    return repo


def stats(url: str) -> dict[str, int]:
    """Cumulative request count and ns per phase from the statistics extension."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{MODEL}/stats", timeout=5) as r:
        s = json.load(r)["model_stats"][0]
    inf = s["inference_stats"]
    out = {"requests": int(inf["success"]["count"]), "executions": int(s["execution_count"])}
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        out[phase] = int(inf[phase]["ns"])
    return out


def per_request_us(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    n = max(after["requests"] - before["requests"], 1)
    figures = {f"{phase}_us": (after[phase] - before[phase]) / n / 1000
               for phase in ("queue", "compute_input", "compute_infer", "compute_output")}
    figures["backend_us"] = figures["compute_input_us"] + figures["compute_infer_us"] + figures["compute_output_us"]
    figures["requests_per_execution"] = n / max(after["executions"] - before["executions"], 1)
    return figures


def start(server: str, repo: str) -> subprocess.Popen[bytes]:
    if server == "conveyor":
        cmd = [sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", f"pyb{os.getpid()}",
               "--model-repository", repo, "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
               "--http-port", str(HTTP), "--grpc-port", str(GRPC), "--metrics-port", str(GRPC + 1)]
    else:
        cmd = ["bash", str(REAL_TRITON), str(ROOT / ".cache" / "triton"), f"--model-repository={repo}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", f"--http-port={HTTP}",
               f"--grpc-port={GRPC}", "--allow-metrics=false"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--protocol", nargs="+", default=["http", "grpc"])
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--no-triton", action="store_true", help="Conveyor only")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args()

    pa = perf_analyzer(ROOT / ".cache")
    repo = write_repo()
    servers = ["conveyor"] + ([] if args.no_triton or not REAL_TRITON.exists() else ["triton"])
    results: list[dict[str, Any]] = []
    for server in servers:
        proc = start(server, repo)
        try:
            wait_ready(f"127.0.0.1:{HTTP}", timeout=180)
            for protocol in args.protocol:
                url = f"127.0.0.1:{HTTP if protocol == 'http' else GRPC}"
                for c in args.concurrency:
                    before = stats(f"127.0.0.1:{HTTP}")
                    figures = run_one(pa, url, protocol, MODEL, c, args.seconds)
                    row = {"server": server, "protocol": protocol, "concurrency": c, **figures,
                           **per_request_us(before, stats(f"127.0.0.1:{HTTP}"))}
                    results.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "python_backend.json").write_text(json.dumps(results, indent=2))
    lines = ["| server | protocol | c | infer/s | p50 ms | p99 ms | queue µs | backend µs (input+infer+output) "
             "| requests/execution |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['server']} | {r['protocol']} | {r['concurrency']} | {r['infer_per_sec']:.0f} | "
              f"{r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | {r['queue_us']:.0f} | "
              f"{r['backend_us']:.0f} ({r['compute_input_us']:.0f}+{r['compute_infer_us']:.0f}+"
              f"{r['compute_output_us']:.0f}) | {r['requests_per_execution']:.2f} |" for r in results]
    Path(args.out, "python_backend.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
