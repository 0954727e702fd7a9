"""CPU seconds per request of the ingress processes, HTTP against gRPC.

    python -m conveyor.deploy.benchmarks.grpc_ingress_cpu [--concurrency 1 16] [--rounds 2] \
        [--model identity_fp32 --shape INPUT0:262144] \
        [--variant new 'old:{"PYTHONPATH": "/tmp/old"}' 'two:{"GRPC_INGRESS": 2}']

Starts ``conveyor serve`` on free loopback ports with the example repository,
drives model ``simple`` (INT32[16] add/sub) with perf_analyzer over each
protocol and concurrency, and prints the CPU (utime + stime from
``/proc/<pid>/stat``) the ingress processes of that protocol used, divided by
the requests the router counted as done in the same window (the model's
``success`` count). CPU per request barely moves when the machine is busy,
unlike infer/s, so it is the figure to compare serving modes with.

Each ``--variant NAME:JSON`` is a group of its own started with that extra
environment, and the variants are measured in interleaved rounds so that they
see the same load. ``PYTHONPATH`` there runs another version of Conveyor (a
folder that holds a ``conveyor/`` of links to an older tree's top-level folders,
like the one at the root of this repository); ``GRPC_INGRESS`` is that group's number of gRPC
ingress processes; ``CONVEYOR_GRPC_SERVER`` (``grpcio`` or ``h2``) its gRPC
server (``--grpc-server``). A benchmark, not a test: the figures go into
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from conveyor.deploy.benchmarks.perf import cpu_seconds, wait_ready
from conveyor.deploy.example_repo import build
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import actor_role, children

PERF_ANALYZER = Path(os.environ.get("PERF_ANALYZER", "/work/cache/pa/perf_analyzer"))



def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def done_requests(http: str, model: str) -> int:
    stats = get_json(f"http://{http}/v2/models/{model}/stats")
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats["model_stats"])


def drive(url: str, protocol: str, model: str, concurrency: int, seconds: float, shapes: list[str],
          streaming: bool = False) -> None:
    """Load the server with perf_analyzer for about ``2 * seconds``. Its own figures
    are not used: on a busy machine it often gives up for want of a stable
    measurement, which does not matter here (the requests are counted by the
    server), so its exit status is ignored unless it never reached the server."""
    cmd = [
        str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol,
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "2",
        *(x for shape in shapes for x in ("--shape", shape)),
        *(["--streaming"] if streaming and protocol == "grpc" else []),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 and "stable measurement" not in done.stdout + done.stderr:
        raise SystemExit(f"perf_analyzer failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


class Group:
    """One ``conveyor serve`` on free loopback ports, with extra environment."""

    def __init__(self, repo: str, workers: int, grpc_ingress: int, env: dict[str, str]) -> None:
        self.http, self.grpc, metrics = free_port(), free_port(), free_port()
        self.proc = subprocess.Popen([
            sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", f"cpu{os.getpid()}x{self.http}",
            "--model-repository", repo,
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--http-port", str(self.http),
            "--grpc-port", str(self.grpc), "--metrics-port", str(metrics), "--allow-metrics", "false",
            "--workers", str(workers), "--http-ingress", "1", "--grpc-ingress", str(grpc_ingress),
        ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env})
        self.roles: dict[int, str] = {}

    def ready(self) -> None:
        wait_ready(f"127.0.0.1:{self.http}")
        self.roles = {pid: actor_role(argv) for pid, argv in children(self.proc.pid).items()}

    def measure(self, protocol: str, model: str, concurrency: int, seconds: float,
                shapes: list[str], streaming: bool = False) -> tuple[float, float]:
        """(ingress CPU µs per request, infer/s) of one perf_analyzer run (infer/s
        counts its start-up too, so it reads a little low)."""
        pids = [p for p, role in self.roles.items() if role == f"ingress-{protocol}"]
        stats = f"127.0.0.1:{self.http}"
        before = sum(cpu_seconds(p) for p in pids)
        n0 = done_requests(stats, model)
        t0 = time.monotonic()
        url = f"127.0.0.1:{self.http if protocol == 'http' else self.grpc}"
        drive(url, protocol, model, concurrency, seconds, shapes, streaming)
        wall = time.monotonic() - t0
        n1 = done_requests(stats, model)
        after = sum(cpu_seconds(p) for p in pids)
        rate = (n1 - n0) / wall
        # The two stats calls go through the HTTP ingress: noise next to thousands of requests.
        return (after - before) / max(1, n1 - n0) * 1e6, rate

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="simple")
    ap.add_argument("--shape", nargs="*", default=[],
                    help="perf_analyzer --shape NAME:DIMS for variable inputs (identity_fp32: INPUT0:262144, 1 MiB)")
    ap.add_argument("--streaming", action="store_true",
                    help="gRPC through ModelStreamInfer (perf_analyzer --streaming)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--protocols", nargs="+", default=["http", "grpc"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--grpc-ingress", type=int, default=1)
    ap.add_argument("--variant", nargs="+", default=["default"],
                    help="NAME or NAME:JSON-environment; every variant is its own group, measured in "
                         "interleaved rounds so that they see the same load (HTTP only on the first)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as repo:
        build(repo)
        groups: dict[str, Group] = {}
        try:
            for spec in args.variant:
                name, _, env_json = spec.partition(":")
                env = json.loads(env_json or "{}")
                # "GRPC_INGRESS" in a variant's environment is its number of gRPC ingress processes.
                processes = int(env.pop("GRPC_INGRESS", args.grpc_ingress))
                groups[name] = Group(repo, args.workers, processes, env)
            for group in groups.values():
                group.ready()
            figures: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
            order = list(groups.items())
            for round_ in range(args.rounds):
                # Each round starts with another variant, so none is always measured first.
                shift = round_ % len(order)
                for name, group in order[shift:] + order[:shift]:
                    for protocol in args.protocols:
                        if protocol == "http" and name != order[0][0]:
                            continue
                        for c in args.concurrency:
                            figures.setdefault((name, protocol, c), []).append(
                                group.measure(protocol, args.model, c, args.seconds, args.shape,
                                                            args.streaming))
            for (name, protocol, c), runs in figures.items():
                us = [u for u, _ in runs]
                print(json.dumps({"variant": name, "protocol": protocol, "concurrency": c,
                                  "ingress_cpu_us_per_request": [round(u) for u in us],
                                  "median_us": round(statistics.median(us)),
                                  "infer_per_s": [round(r) for _, r in runs]}), flush=True)
        finally:
            for group in groups.values():
                group.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
