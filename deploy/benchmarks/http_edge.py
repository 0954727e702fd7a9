"""Misbehaving HTTP clients against a real group: does a well-behaved client stay served,
does the ingress's memory stay bounded, and does the ingress let go of the attack?

    python -m conveyor.deploy.benchmarks.http_edge [--seconds 8] [--attack idle ...] [-- <serve flags>]

Starts ``conveyor serve`` (one worker, one HTTP ingress) on loopback with the models
``simple`` and ``ident`` (FP32 identity), then for each attack (``tests/support/http_attacks.py``):
``simple`` requests from one keep-alive client for ``--seconds`` alone, then as long again
with the attack on; the HTTP ingress's peak RSS meanwhile; how many attack connections the
server closed by ``--wait`` seconds after the attack began (a server that never closes them
is one they can exhaust); and the ingress's CPU once the attackers went away. Prints one
Markdown row per attack (docs/SECURITY.md quotes them). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

from conveyor.deploy.example_repo import add_sub, identity
from conveyor.deploy.runtime.procs import cpu_seconds
from tests.support.group import pids_of, start_server
from tests.support.http_attacks import (
    Attack,
    GoodClient,
    HugeHead,
    IdleConnections,
    NoRead,
    RssPeak,
    ShortBody,
    Slowloris,
    binary_identity_request,
    rss_bytes,
    tcp_connections,
)

HOST = "127.0.0.1"
MIB = 1 << 20

ATTACKS: dict[str, Callable[[int], Attack]] = {
    "idle": lambda port: IdleConnections(HOST, port, 3000),
    "slowloris": lambda port: Slowloris(HOST, port, 1000),
    "huge-header": lambda port: HugeHead(HOST, port, 2, limit=64 * MIB),
    "many-headers": lambda port: HugeHead(HOST, port, 1, limit=8 * MIB, many=True),
    "short-body": lambda port: ShortBody(HOST, port, 50, declared=1 << 29, sent=MIB),
    "no-read": lambda port: NoRead(HOST, port, 2, binary_identity_request("ident", 1 << 18), count=100),
}


def _good_rate(port: int, seconds: float) -> tuple[float, int, float]:
    client = GoodClient(HOST, port)
    client.start()
    time.sleep(seconds)
    client.stop()
    return client.ok / seconds, client.failed, client.slowest


def run(attacks: list[str], seconds: float, wait: float, extra: list[str]) -> None:
    repo = tempfile.mkdtemp(prefix="conveyor-http-edge-")
    add_sub(repo, "simple", 8)
    identity(repo, "ident")
    print("| attack | other client alone (req/s) | during the attack (req/s, failed, slowest) "
          "| ingress RSS before -> peak | attack connections closed by the server "
          f"within {wait:.0f} s | what the attacker read | ingress CPU after (s/s) |")
    print("|---|---|---|---|---|---|---|")
    for name in attacks:
        # A group per attack: the ingress keeps its freed heap (deploy/runtime/heap.py), so one attack's
        # peak would hide the next one's.
        server = start_server(repo, f"edge{os.getpid()}", "--workers", "1", "--allow-grpc", "false",
                              "--arena-size", str(256 << 20), *extra, grpc=False)
        try:
            (ingress,) = pids_of(server, "ingress-http")
            alone, _, _ = _good_rate(server.http_port, seconds)
            sockets_before = tcp_connections(ingress)
            before = rss_bytes(ingress)
            attack = ATTACKS[name](server.http_port)
            began = time.monotonic()
            with RssPeak(ingress) as peak:
                attack.start()
                during, failed, slowest = _good_rate(server.http_port, seconds)
                while attack.open > 0 and time.monotonic() - began < wait:
                    time.sleep(0.2)
            closed, opened = attack.closed, attack.opened
            attack.stop()
            time.sleep(1.0)
            cpu = cpu_seconds(ingress)
            time.sleep(2.0)
            cpu_rate = (cpu_seconds(ingress) - cpu) / 2.0
            answers = sorted({a.decode() for a in attack.answers})
            print(f"| {name} | {alone:.0f} | {during:.0f}, {failed}, {slowest:.2f} s "
                  f"| {before / MIB:.0f} -> {peak.peak / MIB:.0f} MiB | {closed} of {opened} "
                  f"| {', '.join(answers) or '-'} | {cpu_rate:.2f} |", flush=True)
            left = tcp_connections(ingress) - sockets_before
            if left > 0:
                print(f"  ({left} more sockets in the ingress than before the attack)")
            if isinstance(attack, NoRead):
                print(f"  ({attack.requests_sent} requests of {len(attack.request) / MIB:.1f} MiB sent)")
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attack", action="append", choices=list(ATTACKS), default=[])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--wait", type=float, default=40.0, help="how long to wait for the server to close them")
    parser.add_argument("serve_flags", nargs="*", help="after --: extra 'conveyor serve' flags")
    args = parser.parse_args()
    run(args.attack or list(ATTACKS), args.seconds, args.wait, args.serve_flags)


if __name__ == "__main__":
    main()
