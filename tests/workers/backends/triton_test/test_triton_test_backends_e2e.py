"""Triton's test backends (``workers/backends/triton_test/``) served by a real group, as Triton's QA
suites use them: models with ``backend: "identity"`` and the others, no model file, asked with
tritonclient over HTTP and gRPC."""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support import triton_test_models as models
from tests.support.group import Server, start_server
from tests.support.metrics import scrape
from tests.support.waiting import eventually

LEVEL = "e2e"

WAIT_S = 30.0
PARAMETERS = {"param0": "an example string parameter", "param1": 42, "param2": False, "param3": 123.123}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("triton_test_models"))
    models.build(repo)
    srv = start_server(repo, f"tt{os.getpid()}", "--workers", "1")
    yield srv
    assert srv.stop() == 0


class Stream:
    """A tritonclient gRPC stream whose callbacks land in a queue."""

    def __init__(self, server: Server) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.replies: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.replies.put((result, error)))

    def send(self, model: str, arrays: dict[str, np.ndarray], request_id: str, **kwargs: Any) -> None:
        self.client.async_stream_infer(model, grpc_inputs(arrays), request_id=request_id,
                                       enable_empty_final_response=True, **kwargs)

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.replies.get(timeout=WAIT_S) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        inp = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs


def http_inputs(arrays: dict[str, np.ndarray]) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    return inputs


def final_flag(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def repeat_request(values: list[int], delays: list[int], wait: int = 0) -> dict[str, np.ndarray]:
    return {"IN": np.array(values, np.int32), "DELAY": np.array(delays, np.uint32), "WAIT": np.array([wait], np.uint32)}


# --- identity ---------------------------------------------------------------------------------


def test_identity_answers_its_input_in_every_datatype_with_its_parameters(served: Server) -> None:
    cases = [
        ("identity_fp32", np.arange(5, dtype=np.float32).reshape(1, 5)),
        ("identity_fp32", np.zeros((1, 0), np.float32)),
        ("identity_bytes", np.array([[b"abc", b"", b"\x00\xff"]], dtype=np.object_)),
        ("identity_bf16", np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)),
        ("identity_nobatch_int8", np.array([-7, 0, 7], np.int8)),
    ]
    http = httpclient.InferenceServerClient(served.http_url)
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    for model, array in cases:
        got = http.infer(model, http_inputs({"INPUT0": array}))
        out = got.as_numpy("OUTPUT0")
        assert out.dtype == array.dtype and out.shape == array.shape and np.array_equal(out, array), model
        assert got.get_response()["parameters"] == PARAMETERS
        result = grpc.infer(model, grpc_inputs({"INPUT0": array}))
        assert np.array_equal(result.as_numpy("OUTPUT0"), array), model
        params = result.get_response().parameters
        assert (params["param0"].string_param, params["param1"].int64_param, params["param2"].bool_param,
                params["param3"].double_param) == ("an example string parameter", 42, False, 123.123)


def test_identity_batches_concurrent_requests_and_counts_their_bytes(served: Server) -> None:
    client = httpclient.InferenceServerClient(served.http_url, concurrency=4)
    arrays = [np.full((2, 2), i, np.uint32) for i in range(4)]
    # The batcher waits for 8 rows, 4 requests (preferred_batch_size), however slowly they come.
    pending = [client.async_infer("identity_uint32", http_inputs({"INPUT0": a})) for a in arrays]
    for array, request in zip(arrays, pending, strict=True):
        assert np.array_equal(request.get_result(timeout=WAIT_S).as_numpy("OUTPUT0"), array)
    stats = client.get_inference_statistics("identity_uint32")["model_stats"][0]
    assert (stats["execution_count"], stats["inference_count"]) == (1, 8)
    key = 'input_byte_size_counter{model="identity_uint32",version="1"}'
    eventually(lambda: scrape(served).get(key) == 64, WAIT_S, what="the custom metric counted 4 x 16 bytes")


def test_identity_execute_delay_ms_delays_the_answer(served: Server) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    start = time.monotonic()
    got = client.infer("identity_delay", http_inputs({"INPUT0": np.array([[3]], np.int32)}))
    assert time.monotonic() - start >= models.IDENTITY_DELAY_MS / 1000
    assert got.as_numpy("OUTPUT0").tolist() == [[3]]


def test_identity_optional_input_left_out_answers_zeros(served: Server) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    got = client.infer("identity_optional", grpc_inputs({"INPUT1": np.array([[2.5]], np.float32)}))
    assert got.as_numpy("OUTPUT0").tolist() == [[0.0]] and got.as_numpy("OUTPUT1").tolist() == [[2.5]]


def test_identity_output_reshape_gives_the_configs_dims(served: Server) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    array = np.arange(8, dtype=np.int32).reshape(2, 4)
    got = client.infer("identity_reshape", http_inputs({"INPUT0": array})).as_numpy("OUTPUT0")
    assert got.shape == (2, 2, 2) and got.reshape(2, 4).tolist() == array.tolist()


def test_a_config_the_backend_refuses_is_unavailable_in_tritons_words(served: Server) -> None:
    index = httpclient.InferenceServerClient(served.http_url).get_model_repository_index()
    row = next(r for r in index if r["name"] == "identity_misnamed")
    assert row["state"] == "UNAVAILABLE"
    assert row["reason"] == "expected input name to follow INPUT<index> pattern, got 'IN'"


# --- repeat, square: decoupled --------------------------------------------------------------------


def test_repeat_streams_a_response_per_element_then_the_final_flag(served: Server) -> None:
    stream = Stream(served)
    try:
        stream.send("repeat_int32", repeat_request([4, 5, 6], [0, 0, 0]), "r")
        replies = stream.take(4)
    finally:
        stream.close()
    assert [e for _, e in replies] == [None] * 4
    assert [(r.as_numpy("OUT").tolist(), r.as_numpy("IDX").tolist()) for r, _ in replies[:3]] == [
        ([4], [0]), ([5], [1]), ([6], [2])]
    assert [final_flag(r) for r, _ in replies] == [False, False, False, True]
    assert replies[3][0].get_response().outputs == []  # the final flag alone


def test_repeat_takes_the_next_request_while_the_last_one_streams(served: Server) -> None:
    stream = Stream(served)
    try:
        stream.send("repeat_int32", repeat_request([1], [3000], wait=0), "slow")
        stream.send("repeat_int32", repeat_request([2], [0], wait=0), "quick")
        first, error = stream.replies.get(timeout=WAIT_S)
        stream.take(3)  # the rest: quick's final flag, slow's response and final flag
    finally:
        stream.close()
    assert error is None and first.get_response().id == "quick" and first.as_numpy("OUT").tolist() == [2]


def test_repeat_not_decoupled_answers_its_one_response(served: Server) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    got = client.infer("repeat_nondecoupled", http_inputs(repeat_request([7], [100], wait=0)))
    assert (got.as_numpy("OUT").tolist(), got.as_numpy("IDX").tolist()) == ([7], [0])
    with pytest.raises(InferenceServerException, match="expected a single response, got 2"):
        client.infer("repeat_nondecoupled", http_inputs(repeat_request([7, 8], [0, 0])))


def test_square_streams_its_simulated_results_and_reports_its_own_timing(served: Server) -> None:
    stream = Stream(served)
    try:
        stream.send("square_int32", {"IN": np.array([4], np.int32)}, "s")
        replies = stream.take(4)
    finally:
        stream.close()
    # 4 responses, the last CUSTOM_FAIL_COUNT failing and the last CUSTOM_EMPTY_COUNT empty (the final flag).
    assert [r.as_numpy("OUT").tolist() for r, _ in replies[:2]] == [[4], [4]]
    assert "simulated failure" in str(replies[2][1])
    assert replies[3][0].get_response().outputs == [] and final_flag(replies[3][0])
    client = httpclient.InferenceServerClient(served.http_url)

    def responses() -> dict[str, Any]:
        return dict(client.get_inference_statistics("square_int32")["model_stats"][0]["response_stats"])

    # The worker's note of the final response reaches the router beside the client's copy, not before it.
    eventually(lambda: "3" in responses(), WAIT_S, what="the router counted the final flag")
    first, failed, empty = responses()["0"], responses()["2"], responses()["3"]
    assert first["success"]["count"] == 1 and failed["fail"]["count"] == 1 and empty["empty_response"]["count"] == 1
    # The model's output delay counts as compute_output, not compute_infer (a failed response's too).
    assert first["compute_output"]["ns"] >= models.SQUARE_OUTPUT_NS
    assert models.SQUARE_INFER_NS <= first["compute_infer"]["ns"] < models.SQUARE_OUTPUT_NS
    assert failed["compute_output"]["count"] == 1 and failed["compute_output"]["ns"] >= models.SQUARE_OUTPUT_NS


# --- sequences ------------------------------------------------------------------------------------


def seq_infer(client: grpcclient.InferenceServerClient, model: str, values: list[int], sid: int | str,
              start: bool = False, end: bool = False) -> list[int]:
    got = client.infer(model, grpc_inputs({"INPUT": np.array([values], np.int32)}), sequence_id=sid,
                       sequence_start=start, sequence_end=end)
    return list(got.as_numpy("OUTPUT").reshape(-1))


def test_sequence_accumulates_each_sequence_on_its_own(served: Server) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    assert seq_infer(client, "sequence_int32", [1], 11, start=True) == [1]
    assert seq_infer(client, "sequence_int32", [10, 5], 12, start=True) == [15, 15]
    assert seq_infer(client, "sequence_int32", [2], 11) == [3]
    assert seq_infer(client, "sequence_int32", [20], 12) == [35]
    assert seq_infer(client, "sequence_int32", [3], 11, end=True) == [6]
    assert seq_infer(client, "sequence_int32", [4], 11, start=True, end=True) == [4]  # START resets


def test_dyna_sequence_adds_the_correlation_id_at_the_end(served: Server) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    assert seq_infer(client, "dyna_sequence_int32", [1], 100, start=True) == [1]
    assert seq_infer(client, "dyna_sequence_int32", [2], 100) == [3]
    assert seq_infer(client, "dyna_sequence_int32", [3], 100, end=True) == [106]
    assert seq_infer(client, "dyna_sequence_string", [5], "42", start=True) == [5]
    assert seq_infer(client, "dyna_sequence_string", [1], "42", end=True) == [48]
    with pytest.raises(InferenceServerException, match="expects correlation ID to be decodable into an integer"):
        seq_infer(client, "dyna_sequence_string", [1], "abc", start=True)


def test_iterative_sequence_counts_down_to_its_final_response(served: Server) -> None:
    stream = Stream(served)
    try:
        stream.send("iterative_sequence", {"INPUT": np.array([[3]], np.int32)}, "it")
        replies = stream.take(3)
    finally:
        stream.close()
    assert [r.as_numpy("OUTPUT").tolist() for r, _ in replies] == [[[2]], [[1]], [[0]]]
    assert [final_flag(r) for r, _ in replies] == [False, False, True]


def test_iterative_sequence_without_its_scheduler_cannot_go_on(served: Server) -> None:
    stream = Stream(served)
    try:
        # Each a whole sequence: the model's one slot frees for the next.
        stream.send("iterative_direct", {"INPUT": np.array([[1]], np.int32)}, "one", sequence_id=5,
                    sequence_start=True, sequence_end=True)
        (done, error), = stream.take(1)  # one response needs no second execution
        stream.send("iterative_direct", {"INPUT": np.array([[2]], np.int32)}, "two", sequence_id=6,
                    sequence_start=True, sequence_end=True)
        (_, refused), = stream.take(1)
    finally:
        stream.close()
    assert error is None and done.as_numpy("OUTPUT").tolist() == [[0]] and final_flag(done)
    assert "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured " \
           "to handle such a flag." in str(refused)



def implicit_infer(server: Server, model: str, case: int, sid: int, value: int = 1, *, start: bool = False,
                   end: bool = False) -> httpclient.InferResult:
    """One request of qa/L0_implicit_state's kind: INPUT and the TEST_CASE that picks what the backend does."""
    client = httpclient.InferenceServerClient(server.http_url)
    inputs = [httpclient.InferInput("INPUT", [1], "INT32"), httpclient.InferInput("TEST_CASE", [1], "INT32")]
    inputs[0].set_data_from_numpy(np.array([value], np.int32))
    inputs[1].set_data_from_numpy(np.array([case], np.int32))
    return client.infer(model, inputs, sequence_id=sid, sequence_start=start, sequence_end=end)


def test_implicit_state_refuses_an_undeclared_state_in_tritons_words(served: Server) -> None:
    with pytest.raises(InferenceServerException) as missing:
        implicit_infer(served, "implicit_no_state", 0, 1, start=True)
    assert "unable to add state 'undefined_state'. State configuration is missing for model " \
           "'implicit_no_state'." in str(missing.value)
    assert missing.value.status() == "400"
    with pytest.raises(InferenceServerException, match="state 'undefined_state' is not a valid state name"):
        # A whole sequence: one left open would hold the instance's one slot until its idle timeout.
        implicit_infer(served, "implicit_state_int32", 0, 2, start=True, end=True)


def test_implicit_state_left_unupdated_stays_the_initial_state(served: Server) -> None:
    outputs = [implicit_infer(served, "implicit_state_int32", 1, 3, 5, start=True)]
    outputs += [implicit_infer(served, "implicit_state_int32", 1, 3, 5) for _ in range(3)]
    outputs.append(implicit_infer(served, "implicit_state_int32", 1, 3, 5, end=True))
    assert [o.as_numpy("OUTPUT").tolist() for o in outputs] == [[5]] * 5
    implicit_infer(served, "implicit_state_int32", 2, 4, start=True)  # the shared buffer: nothing written
    assert implicit_infer(served, "implicit_state_int32", 2, 4, end=True).get_response().get("outputs", []) == []


def test_implicit_state_grows_by_a_block_per_request(served: Server) -> None:
    block = 1024 * 1024
    got = [implicit_infer(served, "implicit_growable", 3, 5, start=True).as_numpy("OUTPUT_STATE")]
    got += [implicit_infer(served, "implicit_growable", 3, 5).as_numpy("OUTPUT_STATE") for _ in range(2)]
    assert [g.shape for g in got] == [(block,), (2 * block,), (3 * block,)]
    np.testing.assert_equal(got[2], np.repeat(np.arange(3, dtype=np.int8), block))
    # START again: the initial state, whatever the sequence left.
    restarted = implicit_infer(served, "implicit_growable", 3, 5, start=True, end=True).as_numpy("OUTPUT_STATE")
    np.testing.assert_equal(restarted, np.zeros(block, np.int8))
