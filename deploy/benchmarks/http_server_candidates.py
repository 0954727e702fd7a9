"""Compare HTTP servers for the HTTP ingress: the same falcon ASGI app under each.

    python -m conveyor.deploy.benchmarks.http_server_candidates compare [--rounds 2] [--seconds 5] [--concurrency 1 16]
    python -m conveyor.deploy.benchmarks.http_server_candidates drain

``compare`` starts a router and two workers (``conveyor router`` / ``conveyor
worker``, example repository) and then, one at a time on its own port, each
candidate server in front of that router, measured with perf_analyzer over
HTTP on model ``simple`` (infer/s, p50/p99 and the CPU the server's processes
used). ``drain`` checks what each candidate does on SIGTERM with requests in
flight, and whether a second process can bind the same port.
Results are written to bench-results/http-servers.{json,md}; the figures and
the conclusion are in docs/HTTP-SERVERS.md. This is a benchmark, not a test.

Candidates (one server process each, uvloop everywhere):

* ``uvicorn``: the production path, ``conveyor.ingress.http.server.serve``
  (uvicorn, httptools, our own SO_REUSEPORT socket);
* ``granian``: granian's ASGI interface (Rust HTTP stack, tokio runtime);
* ``granian-rust-tasks``: the same with ``--task-impl rust``;
* ``gunicorn``: gunicorn's master plus one ``uvicorn.workers.UvicornWorker``.

Every candidate serves the object ``app`` below: the falcon app of
``conveyor.ingress.http.app.build_app`` wrapped in ``BodyLimit``, exactly as
the production ingress builds it. Its ``IngressContext`` (ZeroMQ socket,
futures) must belong to the server's event loop, so it is created on the ASGI
lifespan startup (or, for a server without lifespan, on the first request),
and closed, unlinking the arena, on lifespan shutdown. Configuration comes
from the environment: ``CONVEYOR_ROUTER`` (the router's ingress endpoint),
``CONVEYOR_GROUP``, ``CONVEYOR_ARENA_BYTES``; ``CONVEYOR_CANDIDATE_DELAY=1``
honours an ``x-candidate-delay-ms`` request header (``drain`` uses it to keep
requests in flight).

The servers are started as commands (``python -m granian``, ``gunicorn``), so
neither needs to be importable where this module is type-checked.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conveyor.deploy.benchmarks.perf import CLK_TCK, perf_analyzer, run_one
from conveyor.deploy.options import default_endpoints, run_dir
from conveyor.ingress.context import DEFAULT_ARENA_BYTES, IngressContext
from conveyor.ingress.http.app import build_app
from conveyor.ingress.http.body import BodyLimit
from conveyor.ingress.limits import DEFAULT_MAX_BODY_BYTES

ROOT = Path(__file__).resolve().parents[2]
MODULE = "benchmarks.http_server_candidates"
BASE_PORT = 18100

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


# --------------------------------------------------------------------------- the app every candidate serves


def _delayed(inner: Any) -> Any:
    """Test hook: sleep ``x-candidate-delay-ms`` before handing the request on."""

    async def wrapper(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == b"x-candidate-delay-ms":
                    await asyncio.sleep(int(value) / 1000)
        await inner(scope, receive, send)

    return wrapper


class CandidateApp:
    """The production ASGI app, built inside whichever event loop serves it."""

    def __init__(self) -> None:
        self._ctx: IngressContext | None = None
        self._app: Any = None
        self._starting: asyncio.Lock | None = None

    async def _ensure(self) -> Any:
        if self._app is not None:
            return self._app
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._app is None:
                env = os.environ
                group = env.get("CONVEYOR_GROUP", "default")
                router = env.get("CONVEYOR_ROUTER") or default_endpoints(group)[0]
                arena = int(env.get("CONVEYOR_ARENA_BYTES", DEFAULT_ARENA_BYTES))
                self._ctx = await IngressContext.create(router, group, arena)
                inner = build_app(self._ctx, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
                app: Any = BodyLimit(inner, DEFAULT_MAX_BODY_BYTES)
                self._app = _delayed(app) if env.get("CONVEYOR_CANDIDATE_DELAY") == "1" else app
        return self._app

    async def _close(self) -> None:
        if self._ctx is not None:
            ctx, self._ctx, self._app = self._ctx, None, None
            await ctx.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    try:
                        await self._ensure()
                    except Exception as exc:
                        await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                        return
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self._close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        app = self._app if self._app is not None else await self._ensure()
        await app(scope, receive, send)


app = CandidateApp()


def _serve_uvicorn(port: int) -> None:
    """The production server, as ``conveyor ingress --protocol http`` runs it."""
    from conveyor.ingress.http import server

    env = os.environ
    group = env["CONVEYOR_GROUP"]

    def factory(ctx: IngressContext) -> Any:
        inner = build_app(ctx, max_body_bytes=DEFAULT_MAX_BODY_BYTES)
        return _delayed(inner) if env.get("CONVEYOR_CANDIDATE_DELAY") == "1" else inner

    server.serve(env["CONVEYOR_ROUTER"], group, "127.0.0.1", port,
                 arena_bytes=int(env["CONVEYOR_ARENA_BYTES"]), app_factory=factory)


# --------------------------------------------------------------------------- candidates


def candidate_command(name: str, port: int) -> list[str]:
    target = f"{MODULE}:app"
    if name == "uvicorn":
        return [sys.executable, "-m", MODULE, "serve-uvicorn", "--port", str(port)]
    if name.startswith("granian"):
        cmd = [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
               "--workers", "1", "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning",
               "--workers-kill-timeout", "30", "--backlog", "2048"]
        if name == "granian-rust-tasks":
            cmd += ["--task-impl", "rust"]
        return [*cmd, target]
    if name == "gunicorn":
        return [sys.executable, "-m", "gunicorn", "-k", "uvicorn.workers.UvicornWorker", "-w", "1",
                "-b", f"127.0.0.1:{port}", "--reuse-port", "--keep-alive", "75", "--graceful-timeout", "30",
                "--backlog", "2048", "--log-level", "warning", target]
    raise ValueError(name)


CANDIDATES = ["uvicorn", "granian", "granian-rust-tasks", "gunicorn"]


def _env(group: str, delay: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CONVEYOR_GROUP=group, CONVEYOR_ROUTER=default_endpoints(group)[0],
               CONVEYOR_ARENA_BYTES=str(64 << 20), CONVEYOR_CANDIDATE_DELAY="1" if delay else "0")
    # The servers import this module by name (benchmarks/ is not installed).
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
        except OSError:
            pass
    return total


def _machine() -> tuple[float, float]:
    """Busy and stolen CPU seconds of the whole machine so far (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def _get(port: int, path: str, timeout: float = 2, headers: dict[str, str] | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on :{port} exited with {proc.returncode}")
        try:
            if _get(port, "/v2/health/ready") == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"server on :{port} not ready")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 40) -> tuple[float, int | None]:
    t0 = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return time.monotonic() - t0, proc.returncode


class Backend:
    """A router and workers for ``group`` on the example repository."""

    def __init__(self, group: str, workers: int) -> None:
        from conveyor.deploy.example_repo import build

        self.group = group
        self.repo = build(os.path.join(tempfile.gettempdir(), f"conveyor-{group}-example-models"))
        cli = [sys.executable, "-m", "conveyor.deploy.cli"]
        self.procs = [subprocess.Popen([*cli, "router", "--group", group, "--model-repository", self.repo])]
        self.procs += [subprocess.Popen([*cli, "worker", "--group", group, "--arena-size", str(64 << 20)])
                       for _ in range(workers)]

    def roles(self) -> dict[str, list[int]]:
        return {"router": [self.procs[0].pid], "worker": [p.pid for p in self.procs[1:]]}

    def close(self) -> None:
        import shutil

        from conveyor.shm.naming import sweep_orphans

        for proc in self.procs:  # all at once, as the supervisor does
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            _stop(proc, 30)
        sweep_orphans(self.group)
        shutil.rmtree(self.repo, ignore_errors=True)
        shutil.rmtree(run_dir(self.group), ignore_errors=True)


def _leftover_segments(group: str) -> list[str]:
    from conveyor.shm.naming import PREFIX, SHM_DIR

    return sorted(e for e in os.listdir(SHM_DIR) if e.startswith(f"{PREFIX}{group}."))


# --------------------------------------------------------------------------- compare


def compare(args: argparse.Namespace) -> int:
    pa = perf_analyzer(ROOT / ".cache")
    group = f"httpcand{os.getpid()}"
    backend = Backend(group, args.workers)
    results: list[dict[str, Any]] = []
    try:
        for rnd in range(1, args.rounds + 1):
            # Rotate the order every round: whoever runs first after a pause tends to lose a little.
            shift = (rnd - 1) % len(args.candidates)
            for name in args.candidates[shift:] + args.candidates[:shift]:
                port = BASE_PORT + CANDIDATES.index(name)
                proc = subprocess.Popen(candidate_command(name, port), env=_env(group))
                try:
                    _wait_ready(port, proc)
                    run_one(pa, f"127.0.0.1:{port}", "http", "simple", 16, 1)  # warm-up, discarded
                    for c in args.concurrency:
                        pids = _tree(proc.pid)
                        roles = {name: pids, **backend.roles()}
                        before = {r: _cpu(p) for r, p in roles.items()}
                        client0 = os.times()
                        machine0 = _machine()
                        t0 = time.monotonic()
                        figures = run_one(pa, f"127.0.0.1:{port}", "http", "simple", c, args.seconds)
                        wall = time.monotonic() - t0
                        client1 = os.times()
                        machine1 = _machine()
                        cpu = {("server" if r == name else r): round((_cpu(p) - before[r]) / wall, 3)
                               for r, p in roles.items()}
                        cpu["perf_analyzer"] = round(
                            (client1.children_user + client1.children_system
                             - client0.children_user - client0.children_system) / wall, 3)
                        # Busy CPU of the whole machine, and what the hypervisor stole: a run where the
                        # known processes do not add up to the machine's busy CPU had company.
                        cpu["machine_busy"] = round((machine1[0] - machine0[0]) / wall, 3)
                        cpu["steal"] = round((machine1[1] - machine0[1]) / wall, 3)
                        results.append({"round": rnd, "server": name, "concurrency": c, **figures,
                                        "processes": len(pids), "cpu_cores": cpu})
                        print(json.dumps(results[-1]), flush=True)
                finally:
                    _stop(proc)
    finally:
        backend.close()
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "http-servers.json").write_text(json.dumps({"cores": os.cpu_count(), "results": results}, indent=2))
    lines = ["| round | server | concurrency | infer/s | p50 ms | p99 ms | server CPU | router | workers "
             "| perf_analyzer | machine busy | steal |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["cpu_cores"]
        lines.append(f"| {r['round']} | {r['server']} | {r['concurrency']} | {r['infer_per_sec']:.0f} | "
                     f"{r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} | {c['server']:.2f} | {c['router']:.2f} | "
                     f"{c['worker']:.2f} | {c['perf_analyzer']:.2f} | {c['machine_busy']:.2f} | {c['steal']:.2f} |")
    lines += ["", "| server | concurrency | infer/s (mean of rounds) | min | max | p50 ms | p99 ms | server CPU "
              "| server CPU µs/request |", "|---|---|---|---|---|---|---|---|---|"]
    for name in args.candidates:
        for c in args.concurrency:
            rs = [r for r in results if r["server"] == name and r["concurrency"] == c]
            if not rs:
                continue
            ips = [r["infer_per_sec"] for r in rs]
            lines.append(f"| {name} | {c} | {sum(ips) / len(ips):.0f} | {min(ips):.0f} | {max(ips):.0f} | "
                         f"{sum(r['p50_us'] for r in rs) / len(rs) / 1000:.2f} | "
                         f"{sum(r['p99_us'] for r in rs) / len(rs) / 1000:.2f} | "
                         f"{sum(r['cpu_cores']['server'] for r in rs) / len(rs):.2f} | "
                         f"{sum(r['cpu_cores']['server'] / r['infer_per_sec'] for r in rs) / len(rs) * 1e6:.0f} |")
    Path(args.out, "http-servers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("leftover segments:", _leftover_segments(group))
    return 0


# --------------------------------------------------------------------------- drain


def _second_bind(name: str, port: int, group: str) -> str:
    """Can a second, independent server process bind the port this one holds?"""
    proc = subprocess.Popen(candidate_command(name, port), env=_env(group),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.wait(6)
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        tail = err.strip().splitlines()[-1:] or [""]
        return f"second process exited {proc.returncode}: {tail[0][:120]}"
    except subprocess.TimeoutExpired:
        # Still running: it bound. Check it answers, then stop it.
        return "second process bound the same port and kept running"
    finally:
        _stop(proc, 40)


def drain(args: argparse.Namespace) -> int:
    group = f"httpdrain{os.getpid()}"
    backend = Backend(group, 1)
    report: list[dict[str, Any]] = []
    try:
        for i, name in enumerate(args.candidates):
            port = BASE_PORT + 20 + i
            proc = subprocess.Popen(candidate_command(name, port), env=_env(group, delay=True))
            _wait_ready(port, proc)
            pids = _tree(proc.pid)
            statuses: list[Any] = [None] * args.inflight

            def call(k: int, port: int = port, statuses: list[Any] = statuses) -> None:
                try:
                    statuses[k] = _get(port, "/v2/models/simple/ready", timeout=60,
                                       headers={"x-candidate-delay-ms": str(args.delay_ms)})
                except Exception as exc:
                    statuses[k] = type(exc).__name__

            threads = [threading.Thread(target=call, args=(k,)) for k in range(args.inflight)]
            for t in threads:
                t.start()
            time.sleep(0.5)  # all in flight
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            try:
                after = str(_get(port, "/v2/health/live", timeout=2))
            except Exception as exc:
                after = type(exc).__name__
            for t in threads:
                t.join()
            answered = time.monotonic() - t0
            try:
                proc.wait(45)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            exit_s = time.monotonic() - t0
            left = [e for e in os.listdir("/dev/shm") if any(e.endswith(f".{p}") for p in pids)]
            report.append({"server": name, "in_flight": args.inflight, "delay_ms": args.delay_ms,
                           "in_flight_statuses": statuses, "new_request_after_sigterm": after,
                           "in_flight_done_after_s": round(answered, 2), "exit_after_s": round(exit_s, 2),
                           "exit_code": proc.returncode, "segments_left": left})
            print(json.dumps(report[-1]), flush=True)
            # Port sharing: a first process holds the port, a second one tries to bind it too.
            first = subprocess.Popen(candidate_command(name, port), env=_env(group))
            try:
                _wait_ready(port, first)
                report[-1]["second_process_same_port"] = _second_bind(name, port, group)
            finally:
                _stop(first)
            print(json.dumps({"server": name, "second_process_same_port": report[-1]["second_process_same_port"]}),
                  flush=True)
    finally:
        backend.close()
    os.makedirs(args.out, exist_ok=True)
    Path(args.out, "http-servers-drain.json").write_text(json.dumps(report, indent=2))
    print("leftover segments:", _leftover_segments(group))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--candidates", nargs="+", default=CANDIDATES, choices=CANDIDATES)
    c.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    c.add_argument("--seconds", type=int, default=5)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--workers", type=int, default=2)
    c.add_argument("--out", default=str(ROOT / "bench-results"))
    d = sub.add_parser("drain")
    d.add_argument("--candidates", nargs="+", default=CANDIDATES, choices=CANDIDATES)
    d.add_argument("--inflight", type=int, default=8)
    d.add_argument("--delay-ms", type=int, default=3000)
    d.add_argument("--out", default=str(ROOT / "bench-results"))
    s = sub.add_parser("serve-uvicorn")
    s.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    if args.command == "serve-uvicorn":
        _serve_uvicorn(args.port)
        return 0
    return compare(args) if args.command == "compare" else drain(args)


if __name__ == "__main__":
    # Importable as benchmarks.http_server_candidates (the servers import ``app`` from there).
    sys.exit(main())
