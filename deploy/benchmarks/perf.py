"""Benchmark: perf_analyzer against a running Conveyor group, HTTP and gRPC.

    python -m conveyor.deploy.benchmarks.perf [--model simple] [--concurrency 1 4 16] [--out bench-results]
    python -m conveyor.deploy.benchmarks.perf --model identity_fp32 --shape INPUT0:262144 --shared-memory none system

``--shared-memory system`` has perf_analyzer place inputs and outputs in its own
POSIX regions (the server is started with --allow-client-shm=true).

Starts ``conveyor serve`` on the example repository (unless --url is given),
installs NVIDIA's perf_analyzer with ../shared/tools/install-perf-analyzer,
runs it per protocol and concurrency, and writes infer/s and p50/p99 latency
(plus the CPU seconds each actor used during the run) as JSON and Markdown.
This is a benchmark, not a test: figures go into docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from conveyor.deploy.runtime import procs
from conveyor.deploy.runtime.procs import actor_role, children

ROOT = Path(__file__).resolve().parents[2]  # the checkout (this file is deploy/benchmarks/perf.py)
INSTALLER = ROOT.parent / "shared" / "tools" / "install-perf-analyzer"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def perf_analyzer(cache: Path) -> Path:
    binary = cache / "perf_analyzer" / "perf_analyzer"
    if not binary.exists():
        subprocess.run(["bash", str(INSTALLER), str(binary.parent)], check=True)
    return binary


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_ready(url: str, timeout: float = 90, ports: tuple[int, ...] = ()) -> None:
    """Ready over HTTP at ``url``, and each of ``ports`` (another ingress, such as gRPC's, which may
    start listening after HTTP reports ready) accepting connections."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{url}/v2/health/ready", timeout=2) as r:
                if r.status == 200 and all(_accepts(p) for p in ports):
                    return
        except Exception:
            pass
        time.sleep(0.3)
    raise SystemExit("server not ready")


def actor_pids(root_pid: int) -> dict[int, str]:
    """Children of the supervisor, by role."""
    return {pid: actor_role(argv) for pid, argv in children(root_pid).items()}


def cpu_seconds(pid: int) -> float:
    """``runtime.procs.cpu_seconds``, 0 for a process that is gone (a benchmark reads on)."""
    try:
        return procs.cpu_seconds(pid)
    except OSError:
        return 0.0


class PerfAnalyzerFailed(SystemExit):
    """perf_analyzer exited non-zero or overran its time limit. A SystemExit, so a one-shot benchmark
    stops with the message; a long run catches it and records the failure instead."""


def run_one(pa: Path, url: str, protocol: str, model: str, concurrency: int, seconds: int,
            shape: tuple[str, ...] = (), shared_memory: str = "none", output_bytes: int = 0,
            timeout: float | None = None) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".csv") as report:
        cmd = [
            str(pa), "-m", model, "-u", url, "-i", protocol,
            "--concurrency-range", f"{concurrency}:{concurrency}",
            "--measurement-interval", str(seconds * 1000), "--stability-percentage", "100",
            "--percentile", "99", "-f", report.name, "--shared-memory", shared_memory,
        ]
        cmd += [x for s in shape for x in ("--shape", s)]
        if shared_memory != "none":
            cmd += ["--output-shared-memory-size", str(output_bytes)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
            raise PerfAnalyzerFailed(f"perf_analyzer ran past {timeout:.0f} s:\n{out[-2000:]}") from None
        if done.returncode != 0:
            raise PerfAnalyzerFailed(
                f"perf_analyzer failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        rows = list(csv.DictReader(open(report.name)))
    row = rows[-1]
    return {
        "infer_per_sec": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="simple")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--http-ingress", type=int, default=1)
    ap.add_argument("--grpc-ingress", type=int, default=1)
    ap.add_argument("--shape", nargs="*", default=[], help="perf_analyzer --shape values, e.g. INPUT0:262144")
    ap.add_argument("--shared-memory", nargs="+", default=["none"], choices=["none", "system", "cuda"])
    ap.add_argument("--output-shared-memory-size", type=int, default=64 << 20)
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    ap.add_argument("--tag", default="perf", help="name of the result files")
    args = ap.parse_args()

    pa = perf_analyzer(ROOT / ".cache")
    group = f"bench{os.getpid()}"
    server = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", group,
        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", "18000",
        "--grpc-port", "18001", "--metrics-port", "18002", "--workers", str(args.workers),
        "--http-ingress", str(args.http_ingress),
        "--grpc-ingress", str(args.grpc_ingress), "--allow-client-shm", "true",
    ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        wait_ready("127.0.0.1:18000")
        pids = actor_pids(server.pid)
        runs = [(p, shm, c) for shm in args.shared_memory for p in args.protocols for c in args.concurrency]
        for protocol, shm, c in runs:
            url = "127.0.0.1:18000" if protocol == "http" else "127.0.0.1:18001"
            before = {p: cpu_seconds(p) for p in pids}
            t0 = time.monotonic()
            figures = run_one(pa, url, protocol, args.model, c, args.seconds, tuple(args.shape), shm,
                              args.output_shared_memory_size)
            wall = time.monotonic() - t0
            cpu: dict[str, float] = {}
            for p, role in pids.items():
                cpu[role] = cpu.get(role, 0.0) + (cpu_seconds(p) - before[p]) / wall
            results.append({"protocol": protocol, "shared_memory": shm, "concurrency": c, **figures,
                            "cpu_cores_by_actor": {k: round(v, 3) for k, v in sorted(cpu.items())}})
            print(json.dumps(results[-1]), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    os.makedirs(args.out, exist_ok=True)
    meta = {"model": args.model, "shape": args.shape, "workers": args.workers, "http_ingress": args.http_ingress,
            "grpc_ingress": args.grpc_ingress, "cores": os.cpu_count(), "results": results}
    Path(args.out, f"{args.tag}.json").write_text(json.dumps(meta, indent=2))
    lines = ["| protocol | shm | concurrency | infer/s | p50 ms | p99 ms | CPU cores by actor |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        split = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores_by_actor"].items())
        lines.append(f"| {r['protocol']} | {r['shared_memory']} | {r['concurrency']} | {r['infer_per_sec']:.0f} | "
                     f"{r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | {split} |")
    Path(args.out, f"{args.tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
