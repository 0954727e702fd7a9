"""The request path's transport against a running group: workers answer the ingress
directly when the router has nothing left to do with a response, and every other
response still comes through the router; concurrent clients each get their own
answer while the links carry several descriptors per message."""

from __future__ import annotations

import os
import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conveyor.deploy.runtime.io_threads import io_sched_policy
from conveyor.deploy.runtime.procs import actor_role, children
from tests.support.group import Server, router_control, start_server
from tests.support.waiting import eventually

LEVEL = "e2e"


def _add_sub(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, seed: int,
             module: object) -> None:
    a = np.full((1, 16), seed, dtype=np.int32)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_plain_requests_are_answered_by_their_worker(server: Server) -> None:
    before = router_control(server.group, "transport")
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for i in range(10):
        _add_sub(http, i, httpclient)
        _add_sub(grpc, i, grpcclient)
    after = router_control(server.group, "transport")
    assert after["dispatched"] - before["dispatched"] >= 20
    assert after["direct"] - before["direct"] >= 20


def test_concurrent_clients_get_their_own_answers(server: Server) -> None:
    """16 clients at once over both protocols: the coalesced links keep every answer with its request."""

    def client(n: int) -> None:
        if n % 2:
            c: httpclient.InferenceServerClient | grpcclient.InferenceServerClient = (
                httpclient.InferenceServerClient(server.http_url))
            module: object = httpclient
        else:
            c, module = grpcclient.InferenceServerClient(server.grpc_url), grpcclient
        for i in range(25):
            _add_sub(c, n * 1000 + i, module)

    with ThreadPoolExecutor(16) as pool:
        for f in [pool.submit(client, n) for n in range(16)]:
            f.result()


def test_decoupled_responses_come_straight_from_the_worker_and_are_counted(server: Server) -> None:
    """A decoupled model's responses go from the worker straight to the ingress; the router,
    told by the worker's notes, still counts every response and the request's end."""
    before = router_control(server.group, "transport")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    stats_before = _py_repeat_stats(client)
    received: queue.SimpleQueue[object] = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: received.put(error or result))
    try:
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(np.array([5, 6, 7], dtype=np.int32))
        client.async_stream_infer("py_repeat", [inp], request_id="r")
        values = []
        for _ in range(3):
            result = received.get(timeout=30)
            assert isinstance(result, grpcclient.InferResult), result
            values.append(int(result.as_numpy("OUT")[0]))
        assert values == [5, 6, 7]
    finally:
        client.stop_stream()
    after = router_control(server.group, "transport")
    assert after["dispatched"] - before["dispatched"] == 1
    assert after["direct"] - before["direct"] == 1
    eventually(lambda: _py_repeat_stats(client)["success"] > stats_before["success"], 10,
               what="the router counted the stream's end")
    stats = _py_repeat_stats(client)
    assert stats["success"] == stats_before["success"] + 1
    assert stats["responses"] - stats_before["responses"] >= 3  # one success per response index


def _py_repeat_stats(client: grpcclient.InferenceServerClient) -> dict[str, int]:
    stats = client.get_inference_statistics("py_repeat", as_json=True)["model_stats"][0]
    responses = stats.get("response_stats", {})
    return {
        "success": int(stats["inference_stats"]["success"].get("count", 0)),
        "responses": sum(int(r.get("success", {}).get("count", 0)) for r in responses.values()),
    }


def _io_thread_policies(pid: int) -> list[int]:
    """The scheduling policy of each ZeroMQ I/O thread of process ``pid``."""
    policies = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().startswith("ZMQbg/IO"):
                    policies.append(os.sched_getscheduler(int(tid)))
        except OSError:
            pass  # the thread ended meanwhile
    return policies


def test_every_actor_runs_its_zeromq_io_thread_as_sched_batch(server: Server) -> None:
    """The I/O thread does not preempt the actor that woke it (deploy/runtime/io_threads.py): measured
    at c=1 as 19% more requests per second on 2 vCPUs."""
    actors = {pid: actor_role(argv) for pid, argv in children(server.proc.pid).items()}
    roles = {role for role in actors.values() if role in ("router", "worker", "ingress-http", "ingress-grpc")}
    assert roles == {"router", "worker", "ingress-http", "ingress-grpc"}
    for pid, role in actors.items():
        if role == "?":
            continue
        policies = _io_thread_policies(pid)
        assert policies, f"{role} has no ZeroMQ I/O thread"
        assert set(policies) == {os.SCHED_BATCH}, f"{role}: {policies}"


def test_io_sched_normal_keeps_the_default_policy(light_repo: str) -> None:
    with pytest.raises(ValueError, match="batch, normal"):
        io_sched_policy("fifo")
    srv = start_server(light_repo, f"ios{os.getpid()}", "--io-sched", "normal", "--workers", "1", grpc=False)
    try:
        seen = set()
        for pid, argv in children(srv.proc.pid).items():
            if actor_role(argv) in ("router", "worker", "ingress-http"):
                seen.add(actor_role(argv))
                assert set(_io_thread_policies(pid)) == {os.SCHED_OTHER}, actor_role(argv)
        assert seen == {"router", "worker", "ingress-http"}
    finally:
        assert srv.stop() == 0
