"""What one hop between two processes costs on this machine: a ZeroMQ
DEALER/ROUTER round trip over ``ipc://`` (the transport between ingress, router
and worker) against a plain UNIX socket pair, both between two processes.

    python -m conveyor.deploy.benchmarks.transport [--round-trips 5000] [--burst 16]

A request crosses three such hops (ingress -> router -> worker -> ingress, the
chain rows below), so this bounds from below what the pipeline adds to a
model's own time. Each
ZeroMQ message wakes three threads (the sender's I/O thread, the receiver's
I/O thread, the receiving application thread); a socket pair wakes one. Where
waking a thread is dear (a virtual machine whose idle vCPUs sleep), that is the
difference. The burst rows put ``--burst`` descriptors in flight at once, sent
one ZeroMQ message each or all in one message (how the links coalesce them,
``proto/framing.py``), and give the cost per descriptor.

The chain rows are a request's own path with no work in it, one request in flight (concurrency
1): this process as the ingress (a DEALER to the router, a PULL for replies), a forked router
(ROUTER in, DEALER on to the worker) and a forked worker (it answers the ingress on a PUSH and
sends the router its result), the two pinned to the dispatch core as a group pins them
(``deploy/runtime/dispatch_cpu.py``); and the same with the router off the way (the ingress's DEALER
straight to the worker; the router still takes the results); and the first over UNIX socket pairs,
what the hops would cost without libzmq's I/O threads. Their CPU columns are per request, every
process summed. Writes bench-results/transport.{json,md}; the figures go into
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from conveyor.deploy.benchmarks.perf import ROOT
from conveyor.deploy.runtime.dispatch_cpu import dispatch_cpu

PAYLOAD = b"x" * 96  # about an InferRequest descriptor


def cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def measure(serve: Callable[[], None], ping: Callable[[], None], round_trips: int) -> dict[str, float]:
    """Fork ``serve`` (it answers ``round_trips`` + 1 pings); time ``ping`` here."""
    child_before = cpu_s(resource.RUSAGE_CHILDREN)
    pid = os.fork()
    if pid == 0:
        try:
            serve()
        finally:
            os._exit(0)
    ping()  # the first round trip connects and warms up
    t0, c0 = time.perf_counter(), cpu_s(resource.RUSAGE_SELF)
    for _ in range(round_trips):
        ping()
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    os.waitpid(pid, 0)
    child = cpu_s(resource.RUSAGE_CHILDREN) - child_before
    return {"round_trip_us": wall / round_trips * 1e6, "client_cpu_us": cpu / round_trips * 1e6,
            "server_cpu_us": child / round_trips * 1e6}


def zmq_ipc(round_trips: int) -> dict[str, float]:
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='conveyor-transport-')}/hop.sock"

    def serve() -> None:
        sock = zmq.Context().socket(zmq.ROUTER)
        sock.bind(endpoint)
        for _ in range(round_trips + 1):
            sock.send_multipart(sock.recv_multipart())

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)

    def ping() -> None:
        sock.send(PAYLOAD)
        sock.recv()

    try:
        return measure(serve, ping, round_trips)
    finally:
        sock.close(0)


def zmq_ipc_burst(round_trips: int, burst: int, coalesced: bool) -> dict[str, float]:
    """``burst`` descriptors in flight per round trip: sent as ``burst`` ZeroMQ messages, or
    (``coalesced``) as one message of ``burst`` frames, as the links send them (proto/framing.py).
    The figures are per descriptor."""
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='conveyor-transport-')}/hop.sock"

    def serve() -> None:
        sock = zmq.Context().socket(zmq.ROUTER)
        sock.bind(endpoint)
        for _ in range(round_trips + 1):
            if coalesced:
                sock.send_multipart(sock.recv_multipart())
            else:
                for _ in range(burst):
                    sock.send_multipart(sock.recv_multipart())

    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(endpoint)
    frames = [PAYLOAD] * burst

    def ping() -> None:
        if coalesced:
            sock.send_multipart(frames)
            sock.recv_multipart()
        else:
            for frame in frames:
                sock.send(frame)
            for _ in frames:
                sock.recv()

    try:
        result = measure(serve, ping, round_trips)
    finally:
        sock.close(0)
    return {key: value / burst for key, value in result.items()}


def socket_pair(round_trips: int) -> dict[str, float]:
    near, far = socket.socketpair()

    def serve() -> None:
        near.close()
        for _ in range(round_trips + 1):
            far.send(far.recv(4096))

    def ping() -> None:
        near.send(PAYLOAD)
        near.recv(4096)

    try:
        return measure(serve, ping, round_trips)
    finally:
        near.close()
        far.close()


def pin(core: int | None) -> None:
    """What ``pin_dispatch`` does to an actor, without its numpy import (which would count)."""
    if core is not None:
        os.sched_setaffinity(0, {core})


def router_beside(router: Callable[[], None], worker: Callable[[], None]) -> Callable[[], None]:
    """A ``serve`` for ``measure`` that runs ``router`` in a process of its own and ``worker`` in
    its own process, and waits for the router."""

    def serve() -> None:
        if os.fork() == 0:
            try:
                router()
            finally:
                os._exit(0)
        worker()
        os.wait()

    return serve


def zmq_chain(round_trips: int, via_router: bool) -> dict[str, float]:
    """One request at a time along ingress -> router -> worker -> ingress (``via_router``) or
    ingress -> worker -> ingress, the worker also sending the router its result; no work anywhere."""
    folder = tempfile.mkdtemp(prefix="conveyor-chain-")
    router_in, router_back, worker_in, ingress_in = (f"ipc://{folder}/{n}.sock" for n in ("r", "rb", "w", "i"))
    core = dispatch_cpu()

    def worker() -> None:
        pin(core)
        ctx = zmq.Context()
        inbox, reply, result = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUSH), ctx.socket(zmq.DEALER)
        inbox.bind(worker_in)
        reply.connect(ingress_in)
        result.connect(router_back)
        for _ in range(round_trips + 1):
            reply.send(inbox.recv_multipart()[-1])
            result.send(PAYLOAD)

    def router() -> None:
        pin(core)
        ctx = zmq.Context()
        front, back, results = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER), ctx.socket(zmq.ROUTER)
        front.bind(router_in)
        results.bind(router_back)
        back.connect(worker_in)
        poller = zmq.Poller()
        poller.register(front, zmq.POLLIN)
        poller.register(results, zmq.POLLIN)
        seen = 0
        while seen < round_trips + 1:
            for sock, _ in poller.poll():
                frames = sock.recv_multipart()
                if sock is front:
                    back.send(frames[-1])
                else:
                    seen += 1

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    replies: zmq.Socket[bytes] = ctx.socket(zmq.PULL)
    replies.bind(ingress_in)
    out: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
    out.connect(router_in if via_router else worker_in)

    def ping() -> None:
        out.send(PAYLOAD)
        replies.recv()

    try:  # the router also when it is off the way: it still takes the results
        result = measure(router_beside(router, worker), ping, round_trips)
    finally:
        out.close(0)
        replies.close(0)
    return result


def socket_chain(round_trips: int) -> dict[str, float]:
    """``zmq_chain`` through the router over UNIX socket pairs: what the hops would cost without
    libzmq's I/O threads (one thread woken per message instead of three)."""
    to_router, router_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    to_worker, worker_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    to_ingress, ingress_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    to_results, results_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    core = dispatch_cpu()

    def router() -> None:
        pin(core)
        selector = selectors.DefaultSelector()
        selector.register(router_in, selectors.EVENT_READ)
        selector.register(results_in, selectors.EVENT_READ)
        seen = 0
        while seen < round_trips + 1:
            for key, _ in selector.select():
                data = key.fileobj.recv(4096)  # type: ignore[union-attr]
                if key.fileobj is router_in:
                    to_worker.send(data)
                else:
                    seen += 1

    def worker() -> None:
        pin(core)
        for _ in range(round_trips + 1):
            to_ingress.send(worker_in.recv(4096))
            to_results.send(PAYLOAD)

    def ping() -> None:
        to_router.send(PAYLOAD)
        ingress_in.recv(4096)

    try:
        return measure(router_beside(router, worker), ping, round_trips)
    finally:
        for sock in (to_router, router_in, to_worker, worker_in, to_ingress, ingress_in, to_results, results_in):
            sock.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--round-trips", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--burst", type=int, default=16, help="descriptors in flight for the burst rows")
    ap.add_argument("--out", default=str(ROOT / "bench-results"))
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    benches: list[tuple[str, Callable[[int], dict[str, float]]]] = [
        ("zeromq ipc DEALER/ROUTER", zmq_ipc),
        ("UNIX socket pair", socket_pair),
        (f"zeromq, {args.burst} in flight, a message each (per descriptor)",
         lambda n: zmq_ipc_burst(n // args.burst or 1, args.burst, coalesced=False)),
        (f"zeromq, {args.burst} in flight, one message (per descriptor)",
         lambda n: zmq_ipc_burst(n // args.burst or 1, args.burst, coalesced=True)),
        ("chain: ingress -> router -> worker -> ingress (per request)", lambda n: zmq_chain(n, via_router=True)),
        ("chain: ingress -> worker -> ingress (per request)", lambda n: zmq_chain(n, via_router=False)),
        ("chain through the router over UNIX socket pairs (per request)", socket_chain),
    ]
    for run in range(args.repeat):
        for name, bench in benches:
            results.append({"transport": name, "run": run + 1, **bench(args.round_trips)})
            print(json.dumps(results[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "transport.json").write_text(json.dumps(results, indent=2))
    lines = ["| transport | run | round trip µs | CPU µs (client + server) |", "|---|---|---|---|"]
    lines += [f"| {r['transport']} | {r['run']} | {r['round_trip_us']:.0f} | "
              f"{r['client_cpu_us'] + r['server_cpu_us']:.0f} ({r['client_cpu_us']:.0f} + "
              f"{r['server_cpu_us']:.0f}) |" for r in results]
    Path(args.out, "transport.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
