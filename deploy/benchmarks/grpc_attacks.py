"""The gRPC port under attack: one misbehaving connection beside a well-behaved client.

    python -m conveyor.deploy.benchmarks.grpc_attacks [--seconds 8] [--attacks continuation rapid_reset ...] \\
        [--variant new 'old:{"PYTHONPATH": "/tmp/old"}'] [--rss-cap-mib 4096]

For each attack and variant a fresh ``conveyor serve`` (example repository, its
defaults, free loopback ports; a variant's JSON is extra environment, as in
``grpc_ingress_cpu.py``) is started. A tritonclient gRPC client calls ``simple``
every 20 ms on its own connection while another connection misbehaves for
``--seconds``; when the server cuts that one off, the attacker opens a new one at
once, for the whole time (the attacks are ``tests/support/h2_attacks.py``'s, bounded
in time and count, loopback only). Reported per run: the other client's calls per second
during the attack (50 at most) and its failures, the gRPC ingress process's peak
RSS and CPU seconds, how long it took to be idle again afterwards (CPU under a
tenth of a core), and what the attacker saw (GOAWAY code, streams refused).

The ingress is killed (SIGKILL, by pid) when its RSS passes ``--rss-cap-mib``, to
keep the machine alive under an attack that is not bounded; the run says so.
A benchmark, not a test: the figures go into docs/SECURITY.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from conveyor.deploy.benchmarks.perf import wait_ready
from conveyor.deploy.example_repo import build
from conveyor.deploy.ports import free_port
from conveyor.deploy.runtime.procs import actor_role, children
from conveyor.shm.naming import sweep_orphans
from tests.support import h2_attacks as h2a
from tests.support import h2_watch as h2w

ATTACKS: dict[str, Callable[[int, float], h2a.Outcome]] = {
    "continuation": h2a.continuation_flood,
    "rapid_reset": h2a.rapid_reset,
    "open_streams": h2a.open_streams,
    "declared_length": h2a.declared_length,
    "ping_noread": lambda port, s: h2a.control_flood(port, s, "ping"),
    "settings_noread": lambda port, s: h2a.control_flood(port, s, "settings"),
    "window_overrun": h2a.window_overrun,
    "oversized_headers": h2a.oversized_headers,
    "unfinished_messages": h2a.unfinished_messages,
}


class Group:
    def __init__(self, repo: str, env: dict[str, str]) -> None:
        self.http, self.grpc, metrics = free_port(), free_port(), free_port()
        self.name = f"atk{os.getpid()}x{self.http}"
        self.proc = subprocess.Popen([
            sys.executable, "-m", "conveyor.deploy.cli", "serve", "--group", self.name,
            "--model-repository", repo, "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--http-port", str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", str(metrics),
            "--allow-metrics", "false", "--exit-timeout-secs", "5",
        ], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env}, start_new_session=True)

    def ingress(self) -> int:
        wait_ready(f"127.0.0.1:{self.http}")
        pids = [p for p, argv in children(self.proc.pid).items() if actor_role(argv) == "ingress-grpc"]
        assert len(pids) == 1, pids
        return pids[0]

    def stop(self) -> None:
        """SIGTERM; an ingress an attack left deaf to it is killed after 15 s (the whole session)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
            sweep_orphans(self.name)  # the supervisor, killed too, swept nothing


def run(repo: str, env: dict[str, str], attack: str, seconds: float, rss_cap: int) -> dict[str, Any]:
    group = Group(repo, env)
    try:
        pid = group.ingress()
        killed: list[bool] = []

        def kill() -> None:
            killed.append(True)
            os.kill(pid, signal.SIGKILL)

        # The other client runs in a process of its own (the attacks' Python would take its GIL), for
        # ``seconds`` from when its connection is up.
        victim = subprocess.Popen([sys.executable, "-m", "tests.support.h2_watch", "victim",
                                   f"127.0.0.1:{group.grpc}", str(seconds)], stdout=subprocess.PIPE, text=True)
        assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
        # The watch goes on after the attack: an unbounded one keeps growing, and the cap must catch it.
        with h2w.IngressWatch(pid, cap=rss_cap, over_cap=kill) as watch:
            # One connection at a time; one the server cuts off is opened again at once, for all
            # of ``seconds``.
            outcomes: list[h2a.Outcome] = []
            until = time.monotonic() + seconds
            while (left := until - time.monotonic()) > 0.05 and not killed:
                outcomes.append(ATTACKS[attack](group.grpc, left))
            cpu_during = watch.cpu_used()
            served = json.loads(victim.communicate(timeout=seconds + 30)[0].strip().splitlines()[-1])
            idle = None if killed else watch.wait_idle(timeout=30.0)
            rss_during = watch.rss_peak
        return {
            "attack": attack, "connections": len(outcomes), "sent": sum(o.sent for o in outcomes),
            "attack_s": round(sum(o.seconds for o in outcomes), 2),
            "victim_calls_per_s": served["calls_per_s"], "victim_ok": served["ok"],
            "victim_failed": served["failed"], "victim_errors": served["errors"][:2],
            "ingress_rss_start_mib": round(watch.rss_start / 2**20), "ingress_rss_peak_mib": round(rss_during / 2**20),
            "ingress_cpu_s": round(cpu_during, 2), "idle_after_s": None if idle is None else round(idle, 1),
            "killed_at_rss_cap": bool(killed), "server_closed": sum(o.closed for o in outcomes),
            "server_stalled": sum(o.stalled for o in outcomes),
            "goaway": sorted({o.goaway for o in outcomes if o.goaway is not None}),
            "refused_streams": sum(o.refused for o in outcomes),
            "statuses": sorted({s for o in outcomes for s in o.statuses})[:5],
        }
    finally:
        group.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--attacks", nargs="+", default=list(ATTACKS), choices=list(ATTACKS))
    ap.add_argument("--variant", nargs="+", default=["default"], help="NAME or NAME:JSON-environment")
    ap.add_argument("--rss-cap-mib", type=int, default=4096)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as repo:
        build(repo)
        for attack in args.attacks:
            for spec in args.variant:
                name, _, env_json = spec.partition(":")
                row = run(repo, json.loads(env_json or "{}"), attack, args.seconds, args.rss_cap_mib << 20)
                print(json.dumps({"variant": name, **row}), flush=True)
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
