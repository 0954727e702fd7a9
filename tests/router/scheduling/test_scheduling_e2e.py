"""Priorities, queue policies and response ordering, seen by real tritonclient
callers of the real process group.

The models (tests/support/models.py) run a batch only once it holds 4 rows (or after
30 s), so each test decides when a batch leaves, and what waited before it,
without relying on timing. The ``sched_*`` models answer each row with its
place in the batch it ran in.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import Future

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server, start_server
from tests.support.metrics import metrics_text
from tests.support.models import position

LEVEL = "e2e"

WAIT_S = 60.0  # generous: only reached when something is broken


class Calls:
    """gRPC requests in flight, with their results and the order they finished in."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.finished_at: dict[str, float] = {}
        self.contexts: dict[str, grpcclient.CallContext] = {}
        self._lock = threading.Lock()

    def send(self, name: str, model: str, data: np.ndarray, **kwargs: int) -> Future[np.ndarray]:
        fut: Future[np.ndarray] = Future()
        inp = grpcclient.InferInput("INPUT0", list(data.shape), "FP32" if data.dtype == np.float32 else "INT32")
        inp.set_data_from_numpy(data)

        def done(result: grpcclient.InferResult | None, error: InferenceServerException | None) -> None:
            with self._lock:
                self.finished_at[name] = time.monotonic()
            if error is not None:
                fut.set_exception(error)
            else:
                assert result is not None
                fut.set_result(result.as_numpy("OUTPUT0"))

        self.contexts[name] = self.client.async_infer(model, [inp], done, **kwargs)
        return fut


@pytest.fixture()
def calls(server: Server) -> Iterator[Calls]:
    c = Calls(server)
    yield c
    c.client.close()  # an open channel would hold the server's shutdown back


def ones(rows: int) -> np.ndarray:
    return np.ones((rows, 1), np.int32)


def positions(fut: Future[np.ndarray]) -> list[int]:
    return [int(v) for v in fut.result(WAIT_S).reshape(-1)]


def pending(server: Server, model: str) -> int:
    text = metrics_text(server)
    found = re.search(rf'^nv_inference_pending_request_count{{model="{model}",version="1"}} (\d+)$', text, re.M)
    assert found, f"no pending gauge for {model}"
    return int(found.group(1))


def wait_pending(server: Server, model: str, count: int) -> None:
    """Until the router's queue for ``model`` holds ``count`` requests."""
    deadline = time.monotonic() + WAIT_S
    while pending(server, model) != count:
        assert time.monotonic() < deadline, f"{model} never had {count} queued requests"
        time.sleep(0.05)


def http_error(server: Server, model: str, **kwargs: int) -> InferenceServerException:
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT0", [1, 1], "INT32").set_data_from_numpy(ones(1))
    with pytest.raises(InferenceServerException) as exc:
        client.infer(model, [inp], **kwargs)
    return exc.value


def grpc_error(server: Server, model: str, **kwargs: int) -> InferenceServerException:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    inp.set_data_from_numpy(ones(1))
    with pytest.raises(InferenceServerException) as exc:
        client.infer(model, [inp], **kwargs)
    return exc.value


def test_server_metadata_lists_the_schedule_policy_extension(server: Server) -> None:
    assert "schedule_policy" in httpclient.InferenceServerClient(server.http_url).get_server_metadata()["extensions"]


def test_high_priority_overtakes_requests_queued_before_it(server: Server, calls: Calls) -> None:
    low = []
    for i in range(3):  # one at a time, so they arrive in this order
        low.append(calls.send(f"low{i}", "sched_priority", ones(1), priority=2 if i else 0))
        wait_pending(server, "sched_priority", i + 1)
    high = calls.send("high", "sched_priority", ones(2), priority=1)
    # The 4-row batch is the high request and the two oldest low ones.
    assert positions(high) == [1, 2]
    assert positions(low[0]) == [3] and positions(low[1]) == [4]
    assert not low[2].done()
    wait_pending(server, "sched_priority", 1)  # it arrived before "high", yet still waits
    high2 = calls.send("high2", "sched_priority", ones(3), priority=1)
    assert positions(high2) == [1, 2, 3] and positions(low[2]) == [4]


def test_full_priority_level_refuses_at_once_with_503_and_unavailable(server: Server, calls: Calls) -> None:
    waiting = calls.send("waiting", "sched_queue_full", ones(1))  # level 2 holds one request
    wait_pending(server, "sched_queue_full", 1)
    http = http_error(server, "sched_queue_full", priority=2)
    # Triton's words, with its request-id prefix (PriorityQueue::PolicyQueue::Enqueue).
    assert (http.status(), http.message()) == ("503", "[request id: <id_unknown>] Exceeds maximum queue size")
    grpc = grpc_error(server, "sched_queue_full")
    assert grpc.status() == "StatusCode.UNAVAILABLE" and "Exceeds maximum queue size" in grpc.message()
    # A client that honours Retry-After backs off instead of retrying at once.
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
                       "parameters": {"priority": 2}}).encode()
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/sched_queue_full/infer", body)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
    flush = calls.send("flush", "sched_queue_full", ones(3), priority=1)  # level 1 is not full
    assert positions(flush) == [1, 2, 3] and positions(waiting) == [4]


def test_reject_policy_fails_a_request_whose_queue_timeout_passes(server: Server) -> None:
    # The request's own timeout (0.2 s) shortens the model's default (60 s).
    http = http_error(server, "sched_reject", timeout=200_000)
    assert http.status() == "503" and "Request timeout expired" in http.message()
    grpc = grpc_error(server, "sched_reject", timeout=200_000)
    assert grpc.status() == "StatusCode.UNAVAILABLE" and "Request timeout expired" in grpc.message()
    assert pending(server, "sched_reject") == 0


def test_delay_policy_serves_a_timed_out_request_after_the_others(server: Server, calls: Calls) -> None:
    late = calls.send("late", "sched_delay", ones(1), timeout=100_000)
    wait_pending(server, "sched_delay", 1)
    time.sleep(0.3)  # past its 0.1 s queue timeout: set aside, not failed
    others = []
    for i in range(3):
        others.append(calls.send(f"n{i}", "sched_delay", ones(1)))
        if i < 2:  # the third fills the batch
            wait_pending(server, "sched_delay", i + 2)
    assert [positions(f) for f in others] == [[1], [2], [3]]
    assert positions(late) == [4]


def test_a_request_whose_client_deadline_passes_never_runs(server: Server, calls: Calls) -> None:
    expired = calls.send("expired", "sched_priority", ones(1), client_timeout=0.3)  # type: ignore[arg-type]
    with pytest.raises(InferenceServerException) as exc:
        expired.result(WAIT_S)
    assert exc.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    wait_pending(server, "sched_priority", 0)  # the router dropped it on its own
    batch = calls.send("batch", "sched_priority", ones(4))
    assert positions(batch) == [1, 2, 3, 4]  # ran alone: the expired request was not in it


def test_preserve_ordering_holds_a_fast_response_behind_a_slow_one(server: Server, calls: Calls) -> None:
    n = 2048  # about 0.25 s of compute on a fast core; the small request takes microseconds
    slow = calls.send("slow", "sched_ordered", np.ones((1, n, n), np.float32))
    wait_pending(server, "sched_ordered", 1)
    # Another shape cannot join the slow request's batch, so both leave now, one per instance.
    fast = calls.send("fast", "sched_ordered", np.ones((4, 2, 2), np.float32))
    assert fast.result(WAIT_S).reshape(-1).tolist() == [8.0] * 4
    assert slow.result(WAIT_S).reshape(-1).tolist() == [float(n**3)]
    # Both answers leave the router together, in order; the client's callbacks may
    # still run a hair apart, hence the slack (far below the slow request's compute time).
    assert calls.finished_at["fast"] >= calls.finished_at["slow"] - 0.02


@pytest.fixture()
def capped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("capped"))
    position(repo, "gated", "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000")
    srv = start_server(repo, f"q{os.getpid()}", "--workers", "1", "--max-queue-size", "2")
    yield srv
    assert srv.stop() == 0


def test_server_wide_queue_cap_refuses_overload_without_a_configured_limit(capped_server: Server) -> None:
    calls = Calls(capped_server)
    try:
        check_capped(capped_server, calls)
    finally:
        calls.client.close()


def check_capped(capped_server: Server, calls: Calls) -> None:
    waiting = [calls.send(f"w{i}", "gated", ones(1)) for i in range(2)]
    wait_pending(capped_server, "gated", 2)
    http = http_error(capped_server, "gated")
    assert http.status() == "503" and "--max-queue-size" in http.message()
    grpc = grpc_error(capped_server, "gated")
    assert grpc.status() == "StatusCode.UNAVAILABLE" and "Exceeds maximum queue size" in grpc.message()
    for name in ("w0", "w1"):  # the client gives up on them: they leave the queue unexecuted
        calls.contexts[name].cancel()
    for fut in waiting:
        with pytest.raises(InferenceServerException):
            fut.result(WAIT_S)
    wait_pending(capped_server, "gated", 0)
    assert positions(calls.send("full", "gated", ones(4))) == [1, 2, 3, 4]
