"""CPU per call of the gRPC servers themselves, with nothing behind them.

    python -m conveyor.deploy.benchmarks.grpc_servers [--calls 4000] [--concurrency 16] [--rounds 3] \
        [--servers h2,ngh2,grpcio-aio,grpcio-sync] [--old-tree DIR]

Each server runs in a process of its own and answers ``ModelInfer`` with a fixed 150-byte
message (no data plane, no router); a ``grpc.aio`` client in another process makes
``--calls`` calls, ``--concurrency`` at a time on one channel; the figure is the server
process's CPU (utime + stime) divided by the calls. The servers, measured in interleaved
rounds so that they see the same load:

- ``h2``: this checkout's ``ingress/grpc/h2_server`` (python-hyper's ``H2Connection``), on uvloop;
- ``ngh2``: the same server on its other HTTP/2 engine (libnghttp2 through ``ngh2``), on uvloop;
- ``grpcio-aio``: ``grpc.aio.server``, on uvloop;
- ``grpcio-sync``: ``grpc.server`` with a pool of 16 threads;
- ``old``: with ``--old-tree DIR``, the hand-written HTTP/2 server of an older checkout
  (``DIR/ingress/grpc/h2``, before fc07c14), imported through a link tree made there.

What it isolates is HTTP/2 and gRPC framing per call: the rest of a request's path (the
servicer, the codec, the router link) is the same whichever server runs it. A benchmark,
not a test: the figures go into docs/HTTP-SERVERS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conveyor.deploy.benchmarks.perf import cpu_seconds
from conveyor.deploy.ports import free_port

# A ModelInferResponse-sized answer and request (the bytes need not parse: nothing decodes them).
RESPONSE = b"\x0a\x06simple\x12\x011*<" + b"x" * 60 + b"2@" + b"y" * 64
REQUEST = b"\x0a\x06simple\x3a\x80\x01" + b"q" * 128
METHOD = "/inference.GRPCInferenceService/ModelInfer"

_SERVER = """
import asyncio, signal, sys, threading
from concurrent import futures
import grpc
kind, port, RESPONSE, METHOD = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]

async def infer(request, context):
    return RESPONSE

def sync_infer(request, context):
    return RESPONSE

async def serve_async():
    if kind == "grpcio-aio":
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
    else:
        if kind == "old":
            from conveyor.ingress.grpc.h2.server import H2Server
        else:
            from conveyor.ingress.grpc.h2_server.server import H2Server
        engine = {"engine": kind} if kind in ("h2", "ngh2") else {}
        server = H2Server({METHOD: grpc.unary_unary_rpc_method_handler(infer)}, **engine)
        await server.start("127.0.0.1", port)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()

if kind == "grpcio-sync":
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(sync_infer)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
else:
    import uvloop
    uvloop.run(serve_async())
"""



async def _drive(port: int, calls: int, concurrency: int) -> float:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        rpc = channel.unary_unary(METHOD)
        await rpc(REQUEST)
        left = calls

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await rpc(REQUEST)

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        return calls / (time.perf_counter() - started)


def measure(kind: str, script: Path, env: dict[str, str], calls: int, concurrency: int) -> tuple[float, float]:
    """(server CPU µs per call, calls/s) of one run."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), kind, str(port), RESPONSE.hex(), METHOD],
                            stdout=subprocess.PIPE, env={**os.environ, **env}, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", f"{kind} did not start"
        before = cpu_seconds(proc.pid)
        rate = asyncio.run(_drive(port, calls, concurrency))
        return (cpu_seconds(proc.pid) - before) / calls * 1e6, rate
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default="h2,ngh2,grpcio-aio,grpcio-sync",
                        help="which servers, comma-separated (of h2, ngh2, grpcio-aio, grpcio-sync)")
    parser.add_argument("--old-tree", type=Path, help="an older checkout whose ingress/grpc/h2 is measured too")
    args = parser.parse_args()
    servers: dict[str, dict[str, str]] = {kind: {} for kind in args.servers.split(",") if kind}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "server.py"
        script.write_text(_SERVER)
        if args.old_tree is not None:
            links = Path(tmp) / "old-links"
            subprocess.run([sys.executable, str(args.old_tree / "deploy" / "link_tree.py"), str(links)],
                           cwd=args.old_tree, check=True, capture_output=True)
            servers["old"] = {"PYTHONPATH": str(links)}
        results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in servers}
        for _ in range(args.rounds):
            for kind, env in servers.items():
                results[kind].append(measure(kind, script, env, args.calls, args.concurrency))
    print(f"| server | CPU µs per call, c={args.concurrency} (median; rounds) | calls/s (rounds) |")
    print("|---|---|---|")
    for kind, rows in results.items():
        cpu = [round(c) for c, _ in rows]
        print(f"| {kind} | **{round(statistics.median(cpu))}** ({', '.join(map(str, cpu))}) "
              f"| {', '.join(str(round(r)) for _, r in rows)} |")


if __name__ == "__main__":
    main()
