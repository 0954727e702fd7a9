"""Scaling a running ``conveyor serve``, and workers that leave under load: the
router moves their instances, their batches finish, no client sees an error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.runtime.procs import children
from conveyor.deploy.scale import parse_request
from conveyor.proto.errors import ConveyorError
from tests.support.group import Server, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"


class Load:
    """Clients sending requests back to back until stopped; every outcome is counted."""

    def __init__(self, server: Server, models: list[str], threads: int = 2) -> None:
        self.server = server
        self.models = models
        self.ok = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, seed: int) -> None:
        client = httpclient.InferenceServerClient(self.server.http_url, network_timeout=30)
        a = np.arange(16, dtype=np.int32) + seed
        n = 0
        while not self._stop.is_set():
            model = self.models[n % len(self.models)]
            n += 1
            inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(np.ones_like(a))
            try:
                out = client.infer(model, inputs).as_numpy("OUTPUT0")
                assert out is not None and out.tolist() == (a + 1).tolist()
                with self._lock:
                    self.ok += 1
            except Exception as exc:
                with self._lock:
                    self.errors.append(f"{model}: {exc}")
        client.close()

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def served_more_than(self, n: int) -> bool:
        with self._lock:
            return self.ok > n


def scale(server: Server, *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "conveyor.deploy.cli", "scale", *args, "--group", server.group],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def worker_pids(server: Server) -> list[int]:
    return sorted(p for p, argv in children(server.proc.pid).items() if "worker" in argv)


def arena_used(server: Server, pid: int) -> bool:
    """Whether worker ``pid`` wrote outputs: its arena (sparse tmpfs) has pages."""
    path = f"/dev/shm/conveyor.{server.group}.worker.{pid}"
    return os.path.exists(path) and os.stat(path).st_blocks > 0


@pytest.fixture()
def scaled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("scale"))
    add_sub(repo, "simple", 0)  # one instance per worker
    add_sub(repo, "pinned", 0, "instance_group [{ count: 1 kind: KIND_CPU }]")  # one instance in all
    srv = start_server(repo, f"sc{os.getpid()}", "--workers", "1", "--grpc-ingress", "0", grpc=False)
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == []


def test_scale_workers_up_and_down_under_load_without_errors(scaled_server: Server) -> None:
    srv = scaled_server
    assert scale(srv) == "workers=1 http-ingress=1 grpc-ingress=0"
    [first] = worker_pids(srv)
    with Load(srv, ["simple", "pinned"]) as load:
        eventually(lambda: load.served_more_than(20))
        assert scale(srv, "workers", "2").startswith("workers=2 ")
        eventually(lambda: len(worker_pids(srv)) == 2)
        [new] = [p for p in worker_pids(srv) if p != first]
        eventually(lambda: arena_used(srv, new))  # the router sends the new worker batches
        # The newest goes: it hands its instance back and finishes its batches first.
        assert scale(srv, "workers", "1").startswith("workers=1 ")
        eventually(lambda: worker_pids(srv) == [first])
        served = load.ok
        eventually(lambda: load.served_more_than(served + 20))
    assert load.errors == []
    assert not any(f".worker.{new}" in s for s in srv.shm_segments())


def test_a_stopped_worker_hands_its_pinned_instance_over_without_errors(scaled_server: Server) -> None:
    srv = scaled_server
    [first] = worker_pids(srv)
    scale(srv, "workers", "2")
    eventually(lambda: len(worker_pids(srv)) == 2)
    [second] = [p for p in worker_pids(srv) if p != first]
    with Load(srv, ["simple", "pinned"]) as load:
        eventually(lambda: arena_used(srv, second))  # the second worker serves "simple" too
        # "pinned" lives on the first worker (it was alone when the model was placed):
        # stopping it makes the router load the instance on the other worker first.
        os.kill(first, signal.SIGTERM)
        eventually(lambda: first not in worker_pids(srv))
        served = load.ok
        eventually(lambda: load.served_more_than(served + 20))
    assert load.errors == []
    eventually(lambda: len(worker_pids(srv)) == 2)  # the supervisor replaced the stopped worker


def test_scale_requests_are_checked() -> None:
    assert parse_request(b'{"role": "workers", "count": 3}') == ("workers", 3)
    assert parse_request(b"{}") == ("", None)
    for bad in (b"nope", b'{"role": "routers", "count": 1}', b'{"role": "workers", "count": -1}',
                b'{"count": 2}'):
        with pytest.raises(ConveyorError):
            parse_request(bad)


def test_scale_without_a_supervisor_says_so() -> None:
    result = subprocess.run([sys.executable, "-m", "conveyor.deploy.cli", "scale", "--group", "nobody-here"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "no 'conveyor serve'" in result.stderr


def test_a_protocol_that_is_off_scales_to_zero_quietly() -> None:
    """`serve --allow-grpc false` starts with zero gRPC ingress processes instead of failing."""
    from conveyor.deploy.cli import build_parser
    from conveyor.deploy.settings import ServeSettings
    from conveyor.deploy.supervisor import Supervisor

    supervisor = Supervisor(ServeSettings.of(build_parser().parse_args(["serve", "--allow-grpc", "false"])))
    assert supervisor.scale("grpc-ingress", 0)["grpc-ingress"] == 0
    with pytest.raises(ConveyorError, match="turned off"):
        supervisor.scale("grpc-ingress", 1)
