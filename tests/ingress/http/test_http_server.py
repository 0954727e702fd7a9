"""``serve`` as a real process against a stand-in router: SO_REUSEPORT sharing,
graceful drain on SIGTERM, and the arena unlinked on exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import zmq

from conveyor.deploy.ports import free_port
from conveyor.proto import messages as m

LEVEL = "e2e"


class FakeRouter:
    """Answers ``server_ready`` with True after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeRouter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        pending: list[tuple[float, bytes, m.ControlReply]] = []
        try:
            while not self._stop.is_set():
                if sock.poll(20):
                    ident, *frames = sock.recv_multipart()  # one message may carry several descriptors
                    for frame in frames:
                        msg = m.ingress_decoder.decode(frame)
                        if isinstance(msg, m.ControlRequest):
                            pending.append((time.monotonic() + self.delay, ident, m.ControlReply(msg.id, True)))
                now = time.monotonic()
                for item in [p for p in pending if p[0] <= now]:
                    pending.remove(item)
                    sock.send_multipart([item[1], m.encode(item[2])])
        finally:
            sock.close()
            ctx.term()


def start_ingress(router: str, group: str, port: int) -> subprocess.Popen[bytes]:
    code = (
        "from conveyor.ingress.http.server import serve; "
        f"serve({router!r}, {group!r}, '127.0.0.1', {port}, arena_bytes=1 << 20, exit_timeout_s=5)"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def get(port: int, path: str, timeout: float = 5) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def wait_live(port: int, procs: list[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs), "ingress exited early"
        try:
            if get(port, "/v2/health/live", timeout=1) == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError("ingress did not come up")


def segment(group: str, pid: int) -> str:
    return f"/dev/shm/conveyor.{group}.ingress.{pid}"


@pytest.fixture
def group() -> Iterator[str]:
    g = "t" + uuid.uuid4().hex[:8]
    yield g
    for e in os.listdir("/dev/shm"):
        if e.startswith(f"conveyor.{g}."):
            os.unlink(os.path.join("/dev/shm", e))


def test_sigterm_drains_in_flight_then_unlinks_arena(group: str) -> None:
    port = free_port()
    with FakeRouter(delay=1.0) as router:
        proc = start_ingress(router.endpoint, group, port)
        try:
            wait_live(port, [proc])
            assert os.path.exists(segment(group, proc.pid))
            statuses: list[int] = []
            slow = threading.Thread(target=lambda: statuses.append(get(port, "/v2/health/ready")))
            slow.start()
            time.sleep(0.3)  # the ready call is now waiting on the router
            proc.send_signal(signal.SIGTERM)
            slow.join(10)
            assert statuses == [200]  # answered although SIGTERM came first
            assert proc.wait(10) == 0
            assert not os.path.exists(segment(group, proc.pid))
            with pytest.raises(OSError):
                get(port, "/v2/health/live", timeout=1)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_processes_share_the_port(group: str) -> None:
    port = free_port()
    with FakeRouter(delay=0) as router:
        procs = [start_ingress(router.endpoint, group, port) for _ in range(2)]
        try:
            for _ in procs:
                wait_live(port, procs)
            # Both bound: neither exited with "address in use", both have arenas.
            time.sleep(0.5)
            assert all(p.poll() is None for p in procs)
            assert all(os.path.exists(segment(group, p.pid)) for p in procs)
            assert get(port, "/v2/health/ready") == 200
        finally:
            for p in procs:
                p.send_signal(signal.SIGINT)
            assert [p.wait(10) for p in procs] == [0, 0]
        assert not any(os.path.exists(segment(group, p.pid)) for p in procs)
