"""The dispatch core (deploy/runtime/dispatch_cpu.py) in a real group: the router and each worker's main
and ZeroMQ I/O threads on one core, the ingress and the models on every core."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from conveyor.deploy.runtime.procs import actor_role, children
from tests.support import python_models
from tests.support.group import start_server

LEVEL = "e2e"

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")

# A model that says how many CPUs its instance had when it loaded (where libraries start their pools).
MODEL = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.cpus = len(os.sched_getaffinity(0))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("CPUS", np.array([self.cpus], dtype=np.int32))])
                for _ in requests]
'''
CONFIG = '''
name: "cpus"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "CPUS" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
'''


def _threads(pid: int) -> dict[int, tuple[str, set[int]]]:
    """tid -> (name, the CPUs it may run on) for every thread of ``pid``."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                threads[int(tid)] = (f.read().strip(), os.sched_getaffinity(int(tid)))
        except OSError:
            pass  # the thread ended meanwhile
    return threads


def test_router_and_worker_dispatch_threads_share_a_core_and_models_keep_every_cpu(tmp_path: Path) -> None:
    every = os.sched_getaffinity(0)
    core = min(every)
    python_models.write_model(str(tmp_path), "cpus", MODEL, CONFIG)
    srv = start_server(str(tmp_path), f"dcpu{os.getpid()}", "--dispatch-cpu", str(core), "--workers", "1",
                       grpc=False)
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        request = httpclient.InferInput("IN", [1], "INT32")
        request.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        assert int(client.infer("cpus", [request]).as_numpy("CPUS")[0]) == len(every)
        roles = {}
        for pid, argv in children(srv.proc.pid).items():
            role = roles[pid] = actor_role(argv)
            threads = _threads(pid)
            main_cpus = threads[pid][1]
            io_cpus = [cpus for name, cpus in threads.values() if name.startswith("ZMQbg/IO")]
            if role in ("router", "worker"):
                assert main_cpus == {core}, role
                assert io_cpus and all(cpus == {core} for cpus in io_cpus), role
            elif role == "ingress-http":
                assert main_cpus == every
                assert all(cpus == every for cpus in io_cpus)
            if role == "worker":  # the instance thread, where the model loaded and runs
                assert any(cpus == every for tid, (_, cpus) in threads.items() if tid != pid)
        assert {"router", "worker", "ingress-http"} <= set(roles.values())
    finally:
        assert srv.stop() == 0


def test_dispatch_cpu_off_pins_nothing(light_repo: str) -> None:
    every = os.sched_getaffinity(0)
    srv = start_server(light_repo, f"dcpuoff{os.getpid()}", "--dispatch-cpu", "off", "--workers", "1", grpc=False)
    try:
        for pid, argv in children(srv.proc.pid).items():
            if actor_role(argv) in ("router", "worker"):
                assert all(cpus == every for _, cpus in _threads(pid).values()), actor_role(argv)
    finally:
        assert srv.stop() == 0


def test_a_cpu_the_host_does_not_have_is_refused_at_the_command_line(light_repo: str) -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "conveyor.deploy.cli", "serve", "--model-repository", light_repo,
                          "--dispatch-cpu", "4096"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "argument --dispatch-cpu: CPU 4096 is not one this process may run on" in out.stderr
