"""Dynamic batching on the GPU, measured (run by deploy/gpu/measure.sh on the GPU machine).

A TorchScript MLP heavy enough that the GPU's time per batch matters (``--layers`` linear layers of
``--width`` in FP16, 2 GiB of weights by default: each batch reads them all, about 0.5 ms on an H200,
so a batch of 64 costs little more than a batch of 1) served by a real ``conveyor serve`` group on ``KIND_GPU`` with
dynamic batching; perf_analyzer drives it over gRPC at each concurrency, while NVML samples the GPU's
utilisation. The table gives throughput, p50 and p99, the mean batch the router formed (from the
statistics extension) and the mean GPU utilisation.

    python deploy/gpu/batching.py --perf-analyzer PA --out DIR [--concurrency 1 4 16 64] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from conveyor.deploy.benchmarks.perf import PerfAnalyzerFailed, run_one
from conveyor.deploy.benchmarks.vs_triton import conveyor_server

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """
name: "mlp"
platform: "pytorch_libtorch"
max_batch_size: 64
input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }}]
output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {width} ] }}]
instance_group [{{ {group} }}]
dynamic_batching {{ max_queue_delay_microseconds: 200 }}
"""


def build(repo: Path, width: int, layers: int, gpu: bool) -> None:
    import torch

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dtype = torch.float16 if gpu else torch.float32  # FP16 matrix products are a CPU's slowest path
            self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width, dtype=dtype) for _ in range(layers)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x.to(self.layers[0].weight.dtype)
            for layer in self.layers:
                h = torch.relu(layer(h)) * 0.01 + h  # bounded: stays finite in FP16 through every layer
            return h.float()

    torch.manual_seed(0)
    model = Mlp().eval()
    (repo / "mlp" / "1").mkdir(parents=True)
    torch.jit.save(torch.jit.script(model), str(repo / "mlp" / "1" / "model.pt"))
    group = "kind: KIND_GPU count: 1 gpus: [0]" if gpu else "kind: KIND_CPU count: 1"
    (repo / "mlp" / "config.pbtxt").write_text(CONFIG.format(width=width, group=group))


class GpuSampler:
    """Mean NVML utilisation of GPU 0 between start() and stop(), sampled every 50 ms (None without one)."""

    def __init__(self, gpu: bool) -> None:
        self.nvml: Any = None
        if gpu:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.nvml is not None and not self._stop.wait(0.05):
            self.samples.append(int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))

    def stop(self) -> float | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return sum(self.samples) / len(self.samples) if self.samples else None


def stats(http: int) -> tuple[int, int]:
    """(inferences, executions) of mlp so far: their ratio is the mean batch."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/mlp/stats", timeout=5) as r:
        s = json.load(r)["model_stats"][0]
    return int(s["inference_count"]), int(s["execution_count"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--perf-analyzer", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--dry", action="store_true", help="no GPU: KIND_CPU, FP32, no NVML (to prove the script)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(prefix="conveyor-batching-"))
    t0 = time.monotonic()
    build(repo, args.width, args.layers, not args.dry)
    print(f"built mlp ({args.layers} x {args.width}) in {time.monotonic() - t0:.1f} s", flush=True)
    server = conveyor_server("conveyor", ROOT, repo, 2, args.out)
    sampler = GpuSampler(not args.dry)
    rows: list[dict[str, Any]] = []
    server.start()
    try:
        server.ready(["mlp"], 180)
        run_one(args.perf_analyzer, f"127.0.0.1:{server.grpc}", "grpc", "mlp", 1, 1, timeout=60)  # warm-up
        for c in args.concurrency:
            n0 = stats(server.http)
            sampler.start()
            try:
                fig: dict[str, Any] = dict(run_one(args.perf_analyzer, f"127.0.0.1:{server.grpc}", "grpc", "mlp", c,
                                                   args.seconds, timeout=args.seconds * 12 + 60))
            except PerfAnalyzerFailed as e:
                fig = {"error": str(e)[-2000:]}
            fig["gpu_util"] = sampler.stop()
            n1 = stats(server.http)
            fig["mean_batch"] = (n1[0] - n0[0]) / (n1[1] - n0[1]) if n1[1] > n0[1] else None
            fig["concurrency"] = c
            rows.append(fig)
            print(json.dumps(fig), flush=True)
    finally:
        problems = server.stop()
    where = "in FP32 on the CPU (dry run)" if args.dry else "in FP16 on cuda:0"
    lines = [f"TorchScript MLP, {args.layers} x Linear({args.width}) {where}, dynamic batching "
             f"(max_batch_size 64, 200 µs queue delay), gRPC, perf_analyzer {args.seconds} s windows.", "",
             "| c | infer/s | p50 ms | p99 ms | mean batch | GPU util % |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['concurrency']} | failed: {r['error'][-120:]!r} | | | | |")
            continue
        batch = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "?"
        util = f"{r['gpu_util']:.0f}" if r["gpu_util"] is not None else "?"
        lines.append(f"| {r['concurrency']} | {r['infer_per_sec']:.0f} | {r['p50_us'] / 1000:.2f} | "
                     f"{r['p99_us'] / 1000:.2f} | {batch} | {util} |")
    if problems:
        lines += ["", "Stop: " + "; ".join(problems)]
    (args.out / "batching.md").write_text("\n".join(lines) + "\n")
    (args.out / "batching.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    return 0 if rows and all("error" not in r for r in rows) and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
