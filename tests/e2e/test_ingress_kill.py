"""An HTTP ingress process SIGKILLed under load, on a group with two of them on one port
(SO_REUSEPORT) and a gRPC one.

Each HTTP request is made on a connection of its own, so the kernel hands it to
either HTTP process; after the kill only the survivor (and then the replacement)
listens. So an HTTP client can lose at most two requests, and only as connection
errors: the one it had on the dead process, and one more when its next connection
landed on the dead process's listening socket in the moment between the kernel
closing the accepted connection and closing the listener (both close in the
dying process's file teardown, in descriptor order; the kernel resets what sat
in that listener's accept queue). Every other request of every client,
HTTP or gRPC, is answered right. The supervisor starts a replacement that
serves new connections; the router and the worker never notice; the dead
process's arena is swept.
"""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.shm.naming import owner_pid
from tests.support.group import Server, pids_of, roles, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"

REQUEST_S = 10.0  # a request unanswered this long would count as hung
HTTP_CLIENTS, GRPC_CLIENTS = 3, 2


@pytest.fixture(scope="module")
def two_http_ingress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("ingress_kill"))
    add_sub(repo, "simple", 0)
    srv = start_server(repo, f"ik{os.getpid()}", "--workers", "1", "--http-ingress", "2", "--grpc-ingress", "1")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


@dataclass
class Outcomes:
    """What one client saw."""

    ok: int = 0
    answered_errors: list[str] = field(default_factory=list)  # the server answered with an error
    connection_errors: list[str] = field(default_factory=list)  # the connection broke, no answer
    slowest_failure_s: float = 0.0


@dataclass
class Load:
    server: Server
    stop: threading.Event = field(default_factory=threading.Event)
    http: list[Outcomes] = field(default_factory=lambda: [Outcomes() for _ in range(HTTP_CLIENTS)])
    grpc: list[Outcomes] = field(default_factory=lambda: [Outcomes() for _ in range(GRPC_CLIENTS)])

    def run(self, out: Outcomes, request: Callable[[np.ndarray], np.ndarray | None], seed: int) -> None:
        a = np.arange(16, dtype=np.int32) + seed
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                got = request(a)
            except InferenceServerException as exc:
                out.answered_errors.append(f"{exc.status()}: {exc.message()}")
            except Exception as exc:  # reset, closed, refused: whatever the socket said
                out.connection_errors.append(f"{type(exc).__name__}: {exc}")
            else:
                assert got is not None and got.tolist() == (a + 1).tolist()
                out.ok += 1
                continue
            out.slowest_failure_s = max(out.slowest_failure_s, time.monotonic() - start)

    def http_request(self, a: np.ndarray) -> np.ndarray | None:
        client = th.InferenceServerClient(self.server.http_url, network_timeout=REQUEST_S)  # a new connection
        try:
            inputs = [th.InferInput("INPUT0", [16], "INT32"), th.InferInput("INPUT1", [16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            return client.infer("simple", inputs).as_numpy("OUTPUT0")
        finally:
            client.close()

    def grpc_thread(self, out: Outcomes, seed: int) -> None:
        client = tg.InferenceServerClient(self.server.grpc_url)  # one connection for the whole test

        def request(a: np.ndarray) -> np.ndarray | None:
            inputs = [tg.InferInput("INPUT0", [16], "INT32"), tg.InferInput("INPUT1", [16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            return client.infer("simple", inputs, client_timeout=REQUEST_S).as_numpy("OUTPUT0")

        try:
            self.run(out, request, seed)
        finally:
            client.close()

    def threads(self) -> list[threading.Thread]:
        http = [threading.Thread(target=self.run, args=(o, self.http_request, i), daemon=True)
                for i, o in enumerate(self.http)]
        grpc = [threading.Thread(target=self.grpc_thread, args=(o, 100 + i), daemon=True)
                for i, o in enumerate(self.grpc)]
        return http + grpc

    def total_ok(self) -> int:
        return sum(o.ok for o in self.http + self.grpc)


def server_side_owner(http_port: int, client_port: int, candidates: set[int]) -> int | None:
    """Which of ``candidates`` holds the accepted end of the loopback connection from ``client_port``."""
    inode = ""
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            local, remote = cols[1].split(":")[1], cols[2].split(":")[1]
            if int(local, 16) == http_port and int(remote, 16) == client_port:
                inode = cols[9]
    for pid in candidates:
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if f"socket:[{inode}]" in links:
            return pid
    return None


def listening_ports(pid: int) -> set[int]:
    """TCP ports ``pid`` listens on (state 0A in /proc/net/tcp, matched through its fds)."""
    try:
        inodes = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return set()
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and f"socket:[{cols[9]}]" in inodes:
                ports.add(int(cols[1].split(":")[1], 16))
    return ports


def test_killing_an_http_ingress_under_load_costs_only_its_own_connections(two_http_ingress: Server) -> None:
    srv = two_http_ingress
    before = roles(srv)
    victim, survivor = sorted(pids_of(srv, "ingress-http"))
    steady = {pid for pid, role in before.items() if role in ("router", "worker", "ingress-grpc", "ingress-metrics")}
    load = Load(srv)
    threads = load.threads()
    for t in threads:
        t.start()
    try:
        eventually(lambda: all(o.ok >= 5 for o in load.http + load.grpc), timeout=60)
        os.kill(victim, signal.SIGKILL)
        # The supervisor starts a replacement on the same port.
        # (The victim is listed until the supervisor has reaped it: wait for a process that is neither.)
        eventually(lambda: len(pids_of(srv, "ingress-http") - {survivor, victim}) == 1, timeout=60)
        (replacement,) = pids_of(srv, "ingress-http") - {survivor, victim}
        served = load.total_ok()
        eventually(lambda: load.total_ok() >= served + 50, timeout=60)
    finally:
        load.stop.set()
        for t in threads:
            t.join(REQUEST_S + 30)
    assert not any(t.is_alive() for t in threads), "a client hung"

    # gRPC clients (another process) and HTTP requests on the survivor: no error at all. Each HTTP
    # client lost at most the request it had on the killed process and one connection queued on its
    # dying listener (see the module's docstring), as connection errors, quickly.
    assert all(not o.answered_errors and not o.connection_errors for o in load.grpc), load.grpc
    assert all(not o.answered_errors for o in load.http), [o.answered_errors for o in load.http]
    assert all(len(o.connection_errors) <= 2 for o in load.http), [o.connection_errors for o in load.http]
    assert all(o.slowest_failure_s < REQUEST_S / 2 for o in load.http)

    # New connections reach the replacement, and it answers them.
    eventually(lambda: srv.http_port in listening_ports(replacement), timeout=30)
    owners: dict[int | None, int] = {}
    for _ in range(24):
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=REQUEST_S)
        conn.connect()
        deadline = time.monotonic() + 5
        owner = None
        while owner is None and time.monotonic() < deadline:  # accepted by one of the two listeners
            owner = server_side_owner(srv.http_port, conn.sock.getsockname()[1], {survivor, replacement})
            time.sleep(0.01)
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
        conn.close()
        owners[owner] = owners.get(owner, 0) + 1
    assert owners.get(replacement, 0) > 0 and None not in owners, owners

    # Router, worker, gRPC and metrics ingress: the same processes; no request failed in the router.
    assert steady <= set(roles(srv)), "a process other than the killed ingress restarted"
    stats = th.InferenceServerClient(srv.http_url).get_inference_statistics("simple")["model_stats"][0]
    assert int(stats["inference_stats"]["fail"]["count"]) == 0
    assert int(stats["inference_stats"]["success"]["count"]) >= load.total_ok()
    # The killed process's arena went with the supervisor's sweep; every segment has a live owner.
    live = set(roles(srv))
    assert not [s for s in srv.shm_segments() if owner_pid(s) == victim]
    assert all(owner_pid(s) in live for s in srv.shm_segments()), srv.shm_segments()

