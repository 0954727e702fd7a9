"""Ensembles with a decoupled step, served by the real process group: every response
of ``py_count`` (it streams 1 .. N) runs through the ONNX steps after it and reaches
the client as one ensemble response, in order, over tritonclient's gRPC stream and
HTTP generate_stream; errors, cancellation, conditions, statistics, and the router
letting go of every block it held (tests/support/ensemble_stream_models.py has the models)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ensemble_stream_models
from tests.support.group import Server, router_control, start_server

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)

WAIT_S = 30.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("ensemble_streams"))
    ensemble_stream_models.build(repo)
    server = start_server(repo, f"d{os.getpid()}", "--workers", "2", "--metrics-config", "histogram_latencies=true")
    yield server
    assert server.stop() == 0
    assert server.shm_segments() == [], "shared memory left behind after shutdown"


def n_input(n: int) -> Any:
    inp = grpcclient.InferInput("N", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[n]], dtype=np.int32))
    return inp


class Stream:
    """A tritonclient gRPC stream whose callbacks land in a queue."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)))

    def send(self, model: str, n: int, request_id: str, final: bool = True) -> None:
        self.client.async_stream_infer(model, [n_input(n)], request_id=request_id, enable_empty_final_response=final)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.replies.get(timeout=WAIT_S) for _ in range(count)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def values(result: Any) -> dict[str, int]:
    return {o.name: int(result.as_numpy(o.name).reshape(-1)[0]) for o in result.get_response().outputs}


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def released(server: Server) -> dict[str, int]:
    """What the router still holds once the loans came back (it collects them every second)."""
    deadline = time.monotonic() + 5
    while True:
        held = router_control(server.group, "held_blocks")
        if not any(held.values()) or time.monotonic() > deadline:
            return dict(held)
        time.sleep(0.1)


def cancelled_so_far(server: Server) -> int:
    """How many py_count requests saw request.is_cancelled() (N = 999 asks the model)."""
    stream = Stream(server)
    try:
        stream.send("py_count", 999, "probe", final=False)
        ((result, error),) = stream.take(1)
    finally:
        stream.close()
    assert error is None
    return values(result)["OUT"]


def wait_cancelled(server: Server, count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while cancelled_so_far(server) < count:
        assert time.monotonic() < deadline, "the decoupled step never saw the cancellation"
        time.sleep(0.1)


def stats(server: Server, model: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(server.http_url)
    return dict(client.get_inference_statistics(model)["model_stats"][0])


def test_each_response_runs_the_next_steps_and_streams_in_order(srv: Server) -> None:
    before = stats(srv, "times_ten")
    stream = Stream(srv)
    try:
        stream.send("ens_stream", 6, "six")
        stream.send("ens_stream", 3, "three")
        replies = stream.take(9)
    finally:
        stream.close()
    assert [e for _, e in replies] == [None] * 9
    by_id: dict[str, list[Any]] = {}
    for result, _ in replies:
        by_id.setdefault(result.get_response().id, []).append(result)
    for rid, n in (("six", 6), ("three", 3)):
        got = by_id[rid]
        # COUNT = i from the decoupled step, TENS = 10 i from times_ten, PLUS = i + N from plus (which
        # reads the response's tensor and the request's own input).
        assert [values(r) for r in got] == [{"COUNT": i, "TENS": 10 * i, "PLUS": i + n} for i in range(1, n + 1)]
        assert [final_flag(r) for r in got] == [False] * (n - 1) + [True]  # the flag rides on the last one
    after = stats(srv, "times_ten")
    ran = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    batches = after["execution_count"] - before["execution_count"]
    assert ran == 9 and batches < 9  # the responses met in times_ten's dynamic batcher
    assert released(srv) == {"held": 0, "loans": 0, "ensembles": 0}


def test_no_response_sends_only_the_final_flag(srv: Server) -> None:
    stream = Stream(srv)
    try:
        stream.send("ens_stream", 0, "none")
        ((result, error),) = stream.take(1)
    finally:
        stream.close()
    assert error is None and final_flag(result) and result.get_response().outputs == []


def test_generate_stream_over_http(srv: Server) -> None:
    def post(path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=WAIT_S)
        try:
            conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    status, raw = post("/v2/models/ens_stream/generate_stream", {"N": 3})
    assert status == 200
    events = [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]
    assert [(e["COUNT"], e["TENS"], e["PLUS"]) for e in events] == [(1, 10, 4), (2, 20, 5), (3, 30, 6)]
    status, raw = post("/v2/models/ens_stream/generate", {"N": 1})  # one response: /generate works too
    assert status == 200 and json.loads(raw)["TENS"] == 10
    status, raw = post("/v2/models/ens_stream/generate", {"N": 2})
    assert status == 400 and "use generate_stream" in json.loads(raw)["error"]


def test_non_streaming_calls_are_refused_and_other_models_serve(srv: Server) -> None:
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("ens_stream", [n_input(1)])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in info.value.message()
    http_client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("N", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("ens_stream", [inp])
    assert info.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in info.value.message()
    # As in Triton, the ensemble reports the decoupled policy its step gives it; a plain one does not.
    assert http_client.get_model_config("ens_stream")["model_transaction_policy"] == {"decoupled": True}
    assert grpc.get_model_config("ens_stream").config.model_transaction_policy.decoupled
    x = httpclient.InferInput("X", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    assert http_client.infer("times_ten", [x]).as_numpy("Y").tolist() == [[70]]
    assert http_client.is_model_ready("ens_stream")


def test_an_error_mid_stream_ends_the_request(srv: Server) -> None:
    stream = Stream(srv)
    try:
        stream.send("ens_stream", -3, "broken")
        replies = stream.take(4)
        stream.send("ens_stream", 2, "after")  # the stream itself goes on
        after = stream.take(2)
    finally:
        stream.close()
    assert [values(r)["TENS"] for r, _ in replies[:3]] == [10, 20, 30]
    assert [final_flag(r) for r, _ in replies[:3]] == [False] * 3
    assert replies[3][0] is None and "stream broke after 3" in str(replies[3][1])
    assert [values(r)["COUNT"] for r, _ in after] == [1, 2]
    assert released(srv) == {"held": 0, "loans": 0, "ensembles": 0}


def test_a_failing_step_stops_the_decoupled_step(srv: Server) -> None:
    before = cancelled_so_far(srv)
    stream = Stream(srv)
    try:
        stream.send("ens_tail_fails", 1000, "tail")  # py_count streams until it is cancelled
        (_, error), (final, _) = stream.take(2)
    finally:
        stream.close()
    assert "the tail step failed on purpose" in str(error)  # sent at once, not when the stream ends
    assert final_flag(final) and final.get_response().outputs == []  # once py_count stopped
    wait_cancelled(srv, before + 1)
    assert released(srv) == {"held": 0, "loans": 0, "ensembles": 0}
    assert stats(srv, "ens_tail_fails")["inference_stats"]["fail"]["count"] >= 1


def test_closing_the_stream_cancels_the_decoupled_step(srv: Server) -> None:
    before = cancelled_so_far(srv)
    stream = Stream(srv)
    stream.send("ens_stream", 1000, "forever")
    first = stream.take(2)
    assert [values(r)["TENS"] for r, _ in first] == [10, 20]
    stream.close(cancel=True)  # py_count sees request.is_cancelled(); the steps after it are dropped
    wait_cancelled(srv, before + 1)
    assert released(srv) == {"held": 0, "loans": 0, "ensembles": 0}


def test_a_condition_is_evaluated_per_response(srv: Server) -> None:
    stream = Stream(srv)
    try:
        stream.send("ens_stream_odd", 4, "odd")
        replies = stream.take(4)
    finally:
        stream.close()
    # times_ten runs for the odd counts only; the even responses leave TENS out.
    assert [values(r) for r, _ in replies] == [
        {"COUNT": 1, "TENS": 10}, {"COUNT": 2}, {"COUNT": 3, "TENS": 30}, {"COUNT": 4}]


def test_an_ensemble_of_a_streaming_ensemble_streams_too(srv: Server) -> None:
    http_client = httpclient.InferenceServerClient(srv.http_url)
    assert http_client.get_model_config("ens_outer")["model_transaction_policy"] == {"decoupled": True}
    stream = Stream(srv)
    try:
        stream.send("ens_outer", 3, "outer")
        replies = stream.take(3)
    finally:
        stream.close()
    assert [values(r) for r, _ in replies] == [{"COUNT": i, "TENS": 100 * i, "MORE": 10 * i + 3} for i in (1, 2, 3)]
    assert [final_flag(r) for r, _ in replies] == [False, False, True]
    assert released(srv) == {"held": 0, "loans": 0, "ensembles": 0}


def test_statistics_of_the_ensemble_and_its_steps(srv: Server) -> None:
    models = ("ens_stream", "py_count", "times_ten", "plus")
    before = {m: stats(srv, m) for m in models}
    stream = Stream(srv)
    try:
        stream.send("ens_stream", 3, "counted")
        stream.take(3)
    finally:
        stream.close()
    after = {m: stats(srv, m) for m in models}

    def grew(model: str, path: str) -> int:
        key, field = path.split(".")
        return int(after[model]["inference_stats"][key][field]) - int(before[model]["inference_stats"][key][field])

    assert grew("ens_stream", "success.count") == 1
    assert after["ens_stream"]["inference_count"] - before["ens_stream"]["inference_count"] == 1
    assert grew("py_count", "success.count") == 1
    assert grew("times_ten", "success.count") == 3 and grew("plus", "success.count") == 3
    # One queue and compute count per step run: the decoupled step once, each ONNX step per response.
    assert grew("ens_stream", "queue.count") == 7
    assert grew("ens_stream", "compute_infer.count") == 7


def _first_responses(srv: Server, model: str) -> int:
    """``nv_inference_first_response_histogram_ms_count`` of ``model`` (0 when absent)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    key = f'nv_inference_first_response_histogram_ms_count{{model="{model}",version="1"}} '
    return next((int(line[len(key):]) for line in text.splitlines() if line.startswith(key)), 0)


def test_an_ensembles_first_responses_are_in_its_histogram(srv: Server) -> None:
    # As Triton's histogram of every model (qa/L0_metrics histogram_metrics_test test_ensemble_decoupled).
    before = _first_responses(srv, "ens_stream")
    steps_before = _first_responses(srv, "times_ten")  # a step that is not decoupled has its histogram too
    stream = Stream(srv)
    try:
        stream.send("ens_stream", 2, "h1")
        stream.send("ens_stream", 3, "h2")
        replies = stream.take(5)
    finally:
        stream.close()
    assert [e for _, e in replies] == [None] * 5
    assert _first_responses(srv, "ens_stream") - before == 2  # one first response per request
    assert _first_responses(srv, "times_ten") - steps_before == 5  # it ran once per streamed response
