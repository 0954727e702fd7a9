"""Decoupled Python models (``model_transaction_policy { decoupled: true }``)
served by the real process group: responses stream to tritonclient's gRPC
``start_stream``/``async_stream_infer`` as the model sends them."""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

WAIT_S = 30.0


def repeat_input(values: list[int]) -> Any:
    inp = grpcclient.InferInput("IN", [len(values)], "INT32")
    inp.set_data_from_numpy(np.array(values, dtype=np.int32))
    return inp


class Stream:
    """A tritonclient gRPC stream whose callbacks land in a queue."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)))

    def send(self, model: str, values: list[int], request_id: str, **kwargs: Any) -> None:
        self.client.async_stream_infer(model, [repeat_input(values)], request_id=request_id, **kwargs)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.replies.get(timeout=WAIT_S) for _ in range(count)]

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def final_flag(result: Any) -> bool | None:
    param = result.get_response().parameters.get("triton_final_response")
    return None if param is None else param.bool_param


def test_repeat_sends_one_response_per_value_in_order(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("py_repeat", [5, 6, 7], "r")
        replies = stream.take(3)
    finally:
        stream.close()
    assert [e for _, e in replies] == [None, None, None]
    assert [(r.as_numpy("OUT").tolist(), r.as_numpy("IDX").tolist()) for r, _ in replies] == [
        ([5], [0]), ([6], [1]), ([7], [2])
    ]
    assert {r.get_response().id for r, _ in replies} == {"r"}
    assert stream.replies.empty()  # no empty final response unless asked for


def test_empty_final_response_when_asked(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("py_repeat", [3, 4], "a", enable_empty_final_response=True)
        replies = stream.take(3)
        stream.send("py_repeat", [0], "zero", enable_empty_final_response=True)  # no response, only final
        (empty, error), = stream.take(1)
    finally:
        stream.close()
    assert [final_flag(r) for r, _ in replies] == [False, False, True]
    assert replies[2][0].get_response().outputs == [] and replies[2][0].get_response().id == "a"
    assert error is None and final_flag(empty) is True and empty.get_response().id == "zero"
    assert empty.get_response().outputs == []


def test_concurrent_streams_keep_their_own_responses(server: Server) -> None:
    got: dict[str, list[int]] = {}
    lock = threading.Lock()
    failures: list[str] = []

    def run(client_no: int) -> None:
        stream = Stream(server)
        try:
            expected: dict[str, list[int]] = {}
            for r in range(3):
                values = [client_no * 1000 + r * 10 + i for i in range(1, 2 + r)]
                expected[f"{client_no}-{r}"] = values
                stream.send("py_repeat", values, f"{client_no}-{r}", enable_empty_final_response=True)
            total = sum(len(v) + 1 for v in expected.values())
            for result, error in stream.take(total):
                if error is not None:
                    failures.append(str(error))
                    continue
                if final_flag(result):
                    continue
                with lock:
                    got.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
            with lock:
                for rid, values in expected.items():
                    if got.get(rid) != values:
                        failures.append(f"{rid}: expected {values}, got {got.get(rid)}")
        finally:
            stream.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT_S)
    assert failures == []
    assert len(got) == 12


def test_error_response_mid_stream(server: Server) -> None:
    stream = Stream(server)
    try:
        stream.send("py_repeat", [1, -1, 2], "e", enable_empty_final_response=True)
        replies = stream.take(4)
        stream.send("py_repeat", [8, -2, 9], "stop")
        stopped = stream.take(2)
    finally:
        stream.close()
    assert replies[0][0].as_numpy("OUT").tolist() == [1]
    assert replies[1][0] is None and "value -1 at 1 is not allowed" in str(replies[1][1])
    assert replies[2][0].as_numpy("OUT").tolist() == [2]
    assert final_flag(replies[3][0]) is True
    assert stopped[0][0].as_numpy("OUT").tolist() == [8]
    assert stopped[1][0] is None and "told to stop" in str(stopped[1][1])


def test_unary_infer_refuses_decoupled_models(server: Server) -> None:
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("py_repeat", [repeat_input([1])])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in info.value.message()

    http_client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("py_repeat", [inp])
    assert info.value.status() == "501"
    assert "HTTP end point doesn't support models with decoupled transaction policy" in info.value.message()
    assert http_client.is_model_ready("py_repeat")


def test_client_going_away_cancels_the_running_request(server: Server) -> None:
    stream = Stream(server)
    stream.send("py_until_cancelled", [1], "forever")
    (first, error), = stream.take(1)
    assert error is None and first.as_numpy("OUT").tolist() == [-1]
    stream.close(cancel=True)  # the model sees request.is_cancelled() and ends the request
    seen = 0
    for _ in range(100):
        probe = Stream(server)
        try:
            probe.send("py_until_cancelled", [0], "count")
            (result, error), = probe.take(1)
        finally:
            probe.close()
        assert error is None
        seen = int(result.as_numpy("OUT")[0])
        if seen:
            break
        threading.Event().wait(0.1)
    assert seen == 1


def first_response_histogram(server: Server, model: str) -> dict[str, float]:
    """``nv_inference_first_response_histogram_ms`` of ``model`` from /metrics: bucket le -> count, sum, count."""
    text = metrics_text(server)
    family = "nv_inference_first_response_histogram_ms"
    labels = f'model="{model}",version="1"'
    out = {}
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key.startswith(f"{family}_bucket{{{labels},le="):
            out[key.split('le="')[1].rstrip('"}')] = float(value)
        elif key in (f"{family}_sum{{{labels}}}", f"{family}_count{{{labels}}}"):
            out[key.split("{")[0].rsplit("_", 1)[1]] = float(value)
    return out


def test_first_response_histogram_counts_each_decoupled_request_once(server: Server) -> None:
    before = first_response_histogram(server, "py_repeat")
    assert list(before)[:5] == ["100", "500", "2000", "5000", "+Inf"]  # Triton's default buckets, in ms
    stream = Stream(server)
    try:
        for n in range(3):  # three requests, three responses each: three first responses
            stream.send("py_repeat", [1, 2, 3], f"first-{n}")
        replies = stream.take(9)
    finally:
        stream.close()
    assert all(error is None for _, error in replies)
    after = first_response_histogram(server, "py_repeat")
    assert after["count"] - before["count"] == 3 == after["+Inf"] - before["+Inf"]
    assert after["sum"] >= before["sum"] and after["sum"] == int(after["sum"])  # whole ms, as Triton's
    assert first_response_histogram(server, "simple") == {}  # not decoupled, histogram_latencies not given
