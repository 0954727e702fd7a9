"""``tritonserver``'s stop as Triton's (qa/L0_lifecycle's shutdown tests): ports closed or connections served
until the exit timeout, and the core stop's in-flight lines."""

from __future__ import annotations

import os
import re

import pytest

from tests.support.group import wait_ready
from tests.support.tritonserver import Triton, repo_with_simple
from tests.support.waiting import eventually

LEVEL = "e2e"


def test_a_stop_closes_the_grpc_port_at_once_and_lets_running_calls_finish(run_dir: str) -> None:
    """Triton's GracefulStop (qa/L0_lifecycle test_shutdown_dynamic): after SIGINT a new call, even on a channel
    already connected, finds the port closed ("Connection refused"), the call running finishes, and the log counts
    the connection each second as Triton's does."""
    import signal

    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tests.support.triton_test_models import identity

    repo = os.path.join(run_dir, "models")
    identity(repo, "slow", "TYPE_FP32", 4, 'parameters [ { key: "execute_delay_ms" value: { string_value: "3000" } } ]',
             dims="[ 1 ]")
    server = Triton("tritonserver --model-repository=/models", repo, run_dir)
    client = None
    try:
        wait_ready(server.http, server.proc, (server.grpc,))
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        row = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        row.set_data_from_numpy(np.full((1, 1), 7, np.float32))
        answers: list[object] = []
        client.async_infer("slow", [row], lambda result, error: answers.append(error or result))
        eventually(lambda: _running(client), 30, what="the call running")
        server.proc.send_signal(signal.SIGINT)
        eventually(lambda: "gRPC service connections and inference handlers" in server.output(), 30,
                   what="Triton's stop line")
        with pytest.raises(InferenceServerException) as refused:
            client.infer("slow", [row])
        assert "Connection refused" in str(refused.value), refused.value
        eventually(lambda: bool(answers), 30, what="the running call's answer")
        assert isinstance(answers[0], grpcclient.InferResult), answers[0]
        assert answers[0].as_numpy("OUTPUT0").tolist() == [[7.0]]
        assert server.proc.wait(60) == 0
        assert re.search(r"Timeout \d+: Found 1 gRPC service connections and inference handlers", server.output())
    finally:
        if client is not None:
            client.close()
        server.stop()


def _running(client: object) -> bool:
    stats = client.get_inference_statistics("slow")  # type: ignore[attr-defined]
    return bool(stats.model_stats[0].inference_stats.queue.count)


def test_a_stop_serves_open_http_connections_and_refuses_new_ones(run_dir: str) -> None:
    """Triton's HTTPServer::Stop (qa/L0_lifecycle test_shutdown_with_live_connection): after SIGINT a keep-alive
    connection is still served while new connections are refused; once it closes, the stop goes on."""
    import http.client
    import json
    import signal

    server = Triton("tritonserver --model-repository=/models", repo_with_simple(run_dir), run_dir)
    body = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                                  for n in ("INPUT0", "INPUT1")]})
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    try:
        wait_ready(server.http, server.proc)

        def infer() -> int:
            conn.request("POST", "/v2/models/simple/infer", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            return answer.status

        assert infer() == 200
        server.proc.send_signal(signal.SIGINT)
        eventually(lambda: "Timeout 10: Found 1 HTTP service connections" in server.output(), 30,
                   what="Triton's stop line")
        assert infer() == 200  # the open connection is served
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection("127.0.0.1", server.http, timeout=5).request("GET", "/v2/health/live")
        conn.close()
        assert server.proc.wait(60) == 0
        out = server.output()
        assert "Waiting for in-flight requests to complete." in out and out.count("Timeout 10: ") == 1
    finally:
        conn.close()
        server.stop()


def test_a_stop_logs_the_sequences_still_open_as_tritons_core_stop(run_dir: str) -> None:
    """Triton's core stop counts a sequence model's open sequences as in-flight inferences (qa/L0_lifecycle
    test_shutdown_sequence greps "Model 'custom_sequence_int32' (version 1) has 2 in-flight inferences")."""
    import signal

    import numpy as np
    import tritonclient.grpc as grpcclient

    from tests.support.triton_test_models import build

    repo = os.path.join(run_dir, "models")
    build(repo)
    server = Triton("tritonserver --model-repository=/models --model-control-mode=explicit "
                    "--load-model=sequence_int32", repo, run_dir)
    try:
        wait_ready(server.http, server.proc, (server.grpc,))
        with grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}") as client:
            row = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            row.set_data_from_numpy(np.ones((1, 1), np.int32))
            for sequence in (1, 2):  # started, not ended
                client.infer("sequence_int32", [row], sequence_id=sequence, sequence_start=True)
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(60) == 0
        out = server.output()
        assert "Waiting for in-flight requests to complete." in out
        assert re.search(r"Timeout \d+: Found 1 model versions that have in-flight inferences", out), out
        assert "Model 'sequence_int32' (version 1) has 2 in-flight inferences" in out
    finally:
        server.stop()
