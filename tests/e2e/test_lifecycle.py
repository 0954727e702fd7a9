"""The process group under churn: a worker crashes, another joins and leaves,
the group shuts down — and clients keep getting right answers, no segment leaks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.runtime.procs import children
from tests.support.group import Server, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"


def infer_simple(server: Server, offset: int = 0) -> list[int]:
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [16], "data": [offset + i for i in range(16)]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [16], "data": [1] * 16},
        ]
    }
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/simple/infer", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        out = json.loads(r.read())
    return next(o["data"] for o in out["outputs"] if o["name"] == "OUTPUT0")


@pytest.fixture()
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("lifecycle"))
    add_sub(repo, "simple", 0)  # unbatched: shapes [16]
    srv = start_server(repo, f"l{os.getpid()}", "--workers", "1", "--grpc-ingress", "0", grpc=False)
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def test_crashed_worker_is_restarted_and_its_memory_swept(small_server: Server) -> None:
    assert infer_simple(small_server) == [i + 1 for i in range(16)]
    workers = [p for p, argv in children(small_server.proc.pid).items() if "worker" in argv]
    assert len(workers) == 1
    os.kill(workers[0], signal.SIGKILL)
    eventually(lambda: not any(f".worker.{workers[0]}" in s for s in small_server.shm_segments()))
    eventually(lambda: infer_simple(small_server, 5) == [i + 6 for i in range(16)])


def test_a_worker_can_join_and_leave_at_run_time(small_server: Server) -> None:
    extra = subprocess.Popen(
        [sys.executable, "-m", "conveyor.deploy.cli", "worker", "--group", small_server.group]
    )
    try:
        eventually(lambda: any(f".worker.{extra.pid}" in s for s in small_server.shm_segments()))
        for i in range(20):
            assert infer_simple(small_server, i) == [i + j + 1 for j in range(16)]
    finally:
        extra.send_signal(signal.SIGTERM)
        assert extra.wait(20) == 0
    assert not any(f".worker.{extra.pid}" in s for s in small_server.shm_segments())
    for i in range(5):
        assert infer_simple(small_server, i) == [i + j + 1 for j in range(16)]


def test_a_restarted_router_gets_its_workers_back(small_server: Server) -> None:
    assert infer_simple(small_server) == [i + 1 for i in range(16)]
    router = next(p for p, argv in children(small_server.proc.pid).items() if "router" in argv)
    os.kill(router, signal.SIGKILL)
    eventually(lambda: infer_simple(small_server, 3) == [i + 4 for i in range(16)])
