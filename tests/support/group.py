"""The real process group as tests start it: ``conveyor serve`` on free loopback ports,
readiness, and the router asked directly over its ingress socket."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from conveyor.deploy.ports import free_ports
from conveyor.deploy.runtime.procs import actor_role, children


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    group: str
    http_port: int
    grpc_port: int
    metrics_port: int
    repo: str

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def shm_segments(self) -> list[str]:
        return sorted(e for e in os.listdir("/dev/shm") if e.startswith(f"conveyor.{self.group}."))

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_ready(http_port: int, proc: subprocess.Popen[bytes], other_ports: tuple[int, ...] = (),
               timeout: float = 60.0, https: ssl.SSLContext | None = None) -> None:
    """Ready over HTTP (HTTPS with ``https``), and every other ingress port accepting connections."""
    deadline = time.monotonic() + timeout
    url = f"{'https' if https else 'http'}://127.0.0.1:{http_port}/v2/health/ready"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"conveyor serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2, context=https) as r:
                if r.status == 200 and all(_listening(p) for p in other_ports):
                    return
        except Exception:
            pass
        time.sleep(0.05)  # a test waits on this for every group it starts
    raise RuntimeError("the server did not become ready in time")


def start_server(repo: str, group: str, *extra: str, grpc: bool = True, https: ssl.SSLContext | None = None,
                 ready_timeout: float = 60.0, env: dict[str, str] | None = None) -> Server:
    """``conveyor serve`` of ``repo`` on free loopback ports, ready; ``env``: its environment (default: ours)."""
    http_port, grpc_port, metrics_port = free_ports(3)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "conveyor.deploy.cli", "serve",
            "--model-repository", repo, "--group", group,
            "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--arena-size", str(64 << 20), "--exit-timeout-secs", "10", "--drain-grace-secs", "0", *extra,
        ],
        env=env,
    )
    try:
        wait_ready(http_port, proc, (grpc_port, metrics_port) if grpc else (metrics_port,), timeout=ready_timeout,
                   https=https)
    except BaseException:  # pytest-timeout's Failed too: a group left starting would outlive the session
        abandon(proc)
        raise
    return Server(proc, group, http_port, grpc_port, metrics_port, repo)


class SharedGroups:
    """Groups started once for the session, one per repository and flags (tests/conftest.py ``shared_groups``):
    modules whose tests leave a group as they found it (nothing loaded, unloaded, killed or set that they do not
    undo) ask for theirs here rather than start their own. Each is stopped when the session ends, and must then
    exit cleanly and leave no shared memory behind, as a module's own group does."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._live: dict[tuple[str, ...], Server] = {}

    def get(self, repo: str, *extra: str) -> Server:
        key = (repo, *extra)
        if key not in self._live:
            self._live[key] = start_server(repo, f"{self._prefix}{len(self._live)}", *extra)
        return self._live[key]

    def stop(self) -> None:
        live, self._live = list(self._live.values()), {}
        for srv in live:
            assert srv.stop() == 0
            assert srv.shm_segments() == [], "shared memory left behind after shutdown"


def abandon(proc: subprocess.Popen[Any]) -> None:
    """Stop a group that did not come up. SIGTERM first: a SIGKILLed supervisor cannot stop its
    children, whose shared-memory segments would then stay in /dev/shm."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


def router_control(group: str, op: str, **args: Any) -> Any:
    """Ask the router of ``group`` directly, over its real ingress socket, as an ingress does."""
    import zmq

    from conveyor.deploy.options import default_endpoints
    from conveyor.proto import messages as m

    ctx = zmq.Context.instance()  # type: ignore[var-annotated]
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(default_endpoints(group)[0])
    try:
        sock.send(m.encode(m.ControlRequest(1, op, args)))
        if not sock.poll(10_000):
            raise TimeoutError(f"the router did not answer '{op}'")
        reply = m.router_reply_decoder.decode(sock.recv())
        assert isinstance(reply, m.ControlReply) and reply.error is None, reply
        return reply.result
    finally:
        sock.close(0)


def wait_all_instances_ready(group: str, model: str, count: int, timeout: float = 60.0) -> None:
    """Server readiness means every model can serve; this waits for every instance of ``model``."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in router_control(group, "instances") if r["model"] == model]
        if len(rows) >= count and all(r["state"] == "READY" for r in rows):
            return
        assert time.monotonic() < deadline, f"instances of '{model}' not ready: {rows}"
        time.sleep(0.1)


def roles(server: Server) -> dict[int, str]:
    return {pid: actor_role(argv) for pid, argv in children(server.proc.pid).items()}


def pids_of(server: Server, role: str) -> set[int]:
    return {pid for pid, r in roles(server).items() if r == role}
