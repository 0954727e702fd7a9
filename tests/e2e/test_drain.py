"""Shutdown drains (Triton unloads at once, server#6230): readiness goes false
first while requests are still served, then new requests get 503/UNAVAILABLE
while those in flight finish, then the group exits clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conveyor.deploy.example_repo import add_sub
from conveyor.deploy.ports import free_ports
from conveyor.deploy.runtime.drain import DrainClock, Phase
from conveyor.router.control import ControlHandler
from conveyor.router.pool import WorkerPool
from conveyor.router.registry import ModelRegistry
from conveyor.workers.stopping import UNLOAD_GRACE_S
from tests.support.group import Server, abandon, start_server, wait_ready
from tests.support.python_models import write_model
from tests.support.waiting import eventually

LEVEL = "e2e"

SLEEP_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(seconds[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", seconds)]))
        return responses
"""

SLEEP_CONFIG = """
name: "sleep"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

GRACE_S = 5.0
IN_FLIGHT_S = 9.0  # outlives the grace by 3 s or more: the refusing phase is seen while it runs


def test_drain_clock_phases() -> None:
    clock = DrainClock(grace_s=5, exit_timeout_s=10)
    assert clock.phase(busy=True, now=0) is Phase.SERVING and not clock.draining and not clock.refusing(0)
    clock.begin(now=100)
    clock.begin(now=101)  # a second stop request changes nothing
    assert clock.draining
    assert clock.phase(busy=True, now=104) is Phase.GRACE and not clock.refusing(104)
    assert clock.phase(busy=False, now=104, quiet=False) is Phase.GRACE  # idle, but a client connection is open
    assert clock.phase(busy=False, now=104) is Phase.DONE  # nothing in flight: the grace ends early
    assert clock.phase(busy=True, now=106) is Phase.REFUSING and clock.refusing(106)
    assert clock.phase(busy=False, now=106) is Phase.DONE
    assert clock.phase(busy=True, now=115.5) is Phase.DONE  # the exit timeout cuts it off
    assert clock.time_left(now=106) == 9


def test_a_draining_router_is_not_ready() -> None:
    # Stopping the router alone (systemctl stop conveyor-router): every ingress reports not ready.
    clock = DrainClock(grace_s=0)
    control = ControlHandler(ModelRegistry(), WorkerPool(), clock)
    assert control.server_ready()
    clock.begin()
    assert not control.server_ready()


def _ready_status(server: Server) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _infer_http(server: Server) -> np.ndarray[Any, Any]:
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    try:
        a = np.arange(16, dtype=np.int32)
        inputs = [httpclient.InferInput("INPUT0", [16], "INT32"), httpclient.InferInput("INPUT1", [16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        out = client.infer("simple", inputs).as_numpy("OUTPUT0")
        assert out is not None
        return out
    finally:
        client.close()


def _infer_grpc(server: Server) -> np.ndarray[Any, Any]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        a = np.arange(16, dtype=np.int32)
        inputs = [grpcclient.InferInput("INPUT0", [16], "INT32"), grpcclient.InferInput("INPUT1", [16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        out = client.infer("simple", inputs, client_timeout=30).as_numpy("OUTPUT0")
        assert out is not None
        return out
    finally:
        client.close()


def _refused_http(server: Server) -> bool:
    try:
        _infer_http(server)
    except InferenceServerException as exc:
        return exc.status() == "503" or "503" in str(exc)
    return False


def _refused_grpc(server: Server) -> bool:
    try:
        _infer_grpc(server)
    except InferenceServerException as exc:
        return exc.status() == "StatusCode.UNAVAILABLE"
    return False


def _grpc_ready(server: Server) -> bool:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return bool(client.is_server_ready(client_timeout=5))
    finally:
        client.close()


@pytest.fixture()
def draining_server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    repo = str(tmp_path_factory.mktemp("drain"))
    add_sub(repo, "simple", 0)
    write_model(repo, "sleep", SLEEP_MODEL, SLEEP_CONFIG)
    return start_server(repo, f"dr{os.getpid()}", "--workers", "1", "--drain-grace-secs", str(GRACE_S),
                        "--exit-timeout-secs", "30")


def test_sigterm_drains_readiness_first_then_refuses_while_in_flight_requests_finish(
    draining_server: Server,
) -> None:
    srv = draining_server
    slow: dict[str, Any] = {}

    def slow_request() -> None:
        client = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
        try:
            inp = httpclient.InferInput("INPUT0", [1], "FP32")
            inp.set_data_from_numpy(np.array([IN_FLIGHT_S], dtype=np.float32))
            slow["out"] = client.infer("sleep", [inp]).as_numpy("OUTPUT0")
        except Exception as exc:
            slow["error"] = exc
        finally:
            client.close()

    def slow_grpc_request() -> None:
        # Each ingress process drains on its own: one with nothing in flight skips the grace.
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            inp = grpcclient.InferInput("INPUT0", [1], "FP32")
            inp.set_data_from_numpy(np.array([IN_FLIGHT_S], dtype=np.float32))
            slow["grpc"] = client.infer("sleep", [inp], client_timeout=60).as_numpy("OUTPUT0")
        except Exception as exc:
            slow["grpc_error"] = exc
        finally:
            client.close()

    try:
        assert _ready_status(srv) == 200 and _grpc_ready(srv)
        in_flight = threading.Thread(target=slow_request)
        in_flight.start()
        grpc_in_flight = threading.Thread(target=slow_grpc_request)
        grpc_in_flight.start()
        time.sleep(1.0)  # let them reach the worker
        signalled = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)

        # Grace: not ready over HTTP and gRPC, but requests are still served.
        eventually(lambda: _ready_status(srv) == 400 and not _grpc_ready(srv), timeout=GRACE_S)
        assert _infer_http(srv).tolist() == [2 * i for i in range(16)]
        assert _infer_grpc(srv).tolist() == [2 * i for i in range(16)]
        assert time.monotonic() - signalled < GRACE_S, "the machine was too slow to see the grace period"

        # After the grace: new requests are refused while the slow one still runs.
        eventually(lambda: _refused_http(srv) and _refused_grpc(srv), timeout=IN_FLIGHT_S)
        assert in_flight.is_alive()
        in_flight.join(60)
        grpc_in_flight.join(60)
        assert slow.get("error") is None and slow["out"].tolist() == [IN_FLIGHT_S]
        assert slow.get("grpc_error") is None and slow["grpc"].tolist() == [IN_FLIGHT_S]
        assert srv.proc.wait(60) == 0
        assert srv.shm_segments() == []
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()


def test_tritonserver_refuses_at_once_on_sigterm_but_finishes_what_is_in_flight(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Triton's way (no readiness grace unless --drain-grace-secs asks for one): new requests are
    # refused from the SIGTERM on; the running one still gets --exit-timeout-secs to finish.
    repo = str(tmp_path_factory.mktemp("drain-triton"))
    add_sub(repo, "simple", 0)
    write_model(repo, "sleep", SLEEP_MODEL, SLEEP_CONFIG)
    http_port, grpc_port, metrics_port = free_ports(3)
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.tritonserver", f"--model-repository={repo}",
        f"--group=dt{os.getpid()}", f"--http-port={http_port}", f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--workers=1",
        f"--arena-size={32 << 20}", "--exit-timeout-secs=30",
    ])
    srv = Server(proc, f"dt{os.getpid()}", http_port, grpc_port, metrics_port, repo)
    slow: dict[str, Any] = {}

    def slow_request() -> None:
        client = httpclient.InferenceServerClient(srv.http_url, network_timeout=60)
        try:
            inp = httpclient.InferInput("INPUT0", [1], "FP32")
            inp.set_data_from_numpy(np.array([3.0], dtype=np.float32))
            slow["out"] = client.infer("sleep", [inp]).as_numpy("OUTPUT0")
        except Exception as exc:
            slow["error"] = exc
        finally:
            client.close()

    try:
        wait_ready(http_port, proc, (grpc_port, metrics_port))
        in_flight = threading.Thread(target=slow_request)
        in_flight.start()
        time.sleep(1.0)  # let it reach the worker
        proc.send_signal(signal.SIGTERM)
        eventually(lambda: _refused_grpc(srv), timeout=5)  # the idle gRPC ingress is gone or refusing
        in_flight.join(30)
        assert slow.get("error") is None and slow["out"].tolist() == [3.0]
        assert proc.wait(30) == 0
        assert srv.shm_segments() == []
    finally:
        abandon(proc)


HOLD_MODEL = """
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.done = threading.Event()
        self.holding = []

    def execute(self, requests):
        for request in requests:
            # Holds the request open (a response now and then, never the final flag) until finalize.
            thread = threading.Thread(target=self.hold, args=(request.get_response_sender(),), daemon=True)
            thread.start()
            self.holding.append(thread)
        return None

    def hold(self, sender):
        out = pb_utils.Tensor("OUTPUT0", np.array([1.0], dtype=np.float32))
        sender.send(pb_utils.InferenceResponse([out]))
        self.done.wait()

    def finalize(self):
        print("Finalize invoked", flush=True)
        self.done.set()
        for thread in self.holding:
            thread.join()
        print("Finalize complete...", flush=True)
"""

HOLD_CONFIG = """
name: "hold"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

EXIT_TIMEOUT_S = 2


def test_at_the_exit_timeout_the_models_are_unloaded_with_a_request_still_open(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # As Triton: --exit-timeout-secs runs out with a stream still open, the server says so and exits
    # 1, and the models are unloaded first (Triton's decoupled QA counts finalize's log lines).
    repo = str(tmp_path_factory.mktemp("drain-hold"))
    write_model(repo, "hold", HOLD_MODEL, HOLD_CONFIG)
    http_port, grpc_port, metrics_port = free_ports(3)
    group = f"dh{os.getpid()}"
    proc = subprocess.Popen([
        sys.executable, "-m", "conveyor.deploy.tritonserver", f"--model-repository={repo}", f"--group={group}",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--workers=1", f"--arena-size={32 << 20}",
        f"--exit-timeout-secs={EXIT_TIMEOUT_S}",
    ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    srv = Server(proc, group, http_port, grpc_port, metrics_port, repo)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    first = threading.Event()
    try:
        wait_ready(http_port, proc, (grpc_port, metrics_port))
        client.start_stream(callback=lambda result, error: first.set())
        inp = grpcclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.0], dtype=np.float32))
        client.async_stream_infer("hold", [inp])
        assert first.wait(30)  # the request is in the model, held open
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode()
        took = time.monotonic() - signalled
    finally:
        client.close()
        abandon(proc)
    assert proc.returncode == 1, out
    assert "failed to stop server: Internal - Exit timeout expired. Exiting immediately." in out
    assert "unloaded with requests open: worker-0" in out and "worker-0 did not stop in time" not in out, out
    assert out.count("Finalize invoked") == 1 and out.count("Finalize complete...") == 1, out
    assert took < EXIT_TIMEOUT_S + UNLOAD_GRACE_S, took  # the model's finalize returned: nothing waited for a kill
    assert srv.shm_segments() == []
