"""Ragged and padded batching seen by real tritonclient callers of the real
process group: requests of different lengths share one execution and each
client gets its own answer back.

The models (tests/support/ragged_models.py) run a batch only at their preferred size
(or after 30 s), so the tests decide which requests share a batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ragged_models
from tests.support.group import Server, start_server

LEVEL = "e2e"

WAIT_S = 60.0  # generous: only reached when something is broken


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("ragged"))
    ragged_models.build(repo)
    srv = start_server(repo, f"rg{os.getpid()}", "--workers", "1")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(scope="module")
def grpc(server: Server) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()  # an open channel would hold the server's shutdown back


@pytest.fixture(scope="module")
def http(server: Server) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.http_url)


def send(client: grpcclient.InferenceServerClient, model: str, data: np.ndarray) -> Future[Any]:
    """One request in flight; its result once the batch it joined has run."""
    fut: Future[Any] = Future()
    inp = grpcclient.InferInput("INPUT", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)

    def done(result: Any, error: InferenceServerException | None) -> None:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    client.async_infer(model, [inp], done)
    return fut


def executions(http: httpclient.InferenceServerClient, model: str) -> tuple[int, int, dict[int, int]]:
    """(inference count, execution count, {batch size: executions})."""
    stats = http.get_inference_statistics(model)["model_stats"][0]
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    return int(stats["inference_count"]), int(stats["execution_count"]), sizes


def test_ragged_requests_of_different_lengths_run_as_one_batch(
    grpc: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient,
) -> None:
    lengths = [3, 1, 5, 2]
    data = [np.arange(n, dtype=np.float32).reshape(1, n) + 10 * i for i, n in enumerate(lengths)]
    futures = [send(grpc, "ragged_sum", x) for x in data]  # the 4th completes the preferred batch
    for x, fut in zip(data, futures, strict=True):
        result = fut.result(WAIT_S)
        # Per request: its own sum and mean, from the offsets and counts the server computed.
        assert result.as_numpy("SUM").tolist() == [[float(x.sum())]]
        assert result.as_numpy("MEAN").tolist() == [[pytest.approx(float(x.mean()))]]
        assert result.as_numpy("BATCH_MAX").tolist() == [[5.0]]  # the longest request in its batch
        doubled = result.as_numpy("DOUBLED")  # scattered back with its own input's shape
        assert doubled.shape == x.shape and np.array_equal(doubled, x * 2)
    assert executions(http, "ragged_sum") == (4, 1, {4: 1})


def test_batch_inputs_are_the_servers_not_the_clients(
    grpc: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient,
) -> None:
    assert [i["name"] for i in http.get_model_metadata("ragged_sum")["inputs"]] == ["INPUT"]
    assert [b["target_name"] for b in http.get_model_config("ragged_sum")["batch_input"]] == [
        ["OFFSETS"], ["COUNTS"], ["MAXSHAPE"]]
    x = httpclient.InferInput("INPUT", [1, 2], "FP32").set_data_from_numpy(np.ones((1, 2), np.float32))
    offsets = httpclient.InferInput("OFFSETS", [1, 2], "INT32").set_data_from_numpy(np.zeros((1, 2), np.int32))
    with pytest.raises(InferenceServerException) as exc:
        http.infer("ragged_sum", [x, offsets])
    # Triton's words: a batch input is not a model input, so the request has one input too many.
    assert exc.value.status() == "400" and exc.value.message() == (
        "[request id: <id_unknown>] expected 1 inputs but got 2 inputs for model 'ragged_sum'. Got input(s) "
        "['OFFSETS','INPUT'], but missing required input(s) ]. Please provide all required input(s).")


def test_padded_requests_share_a_batch_and_each_gets_its_own_length_back(
    grpc: grpcclient.InferenceServerClient, http: httpclient.InferenceServerClient,
) -> None:
    lengths = [2, 5, 3]  # padded to 8, the smallest bucket holding the longest
    data = [np.arange(1, n + 1, dtype=np.float32).reshape(1, n) * (i + 1) for i, n in enumerate(lengths)]
    futures = [send(grpc, "padded_sum", x) for x in data]
    for x, n, fut in zip(data, lengths, futures, strict=True):
        result = fut.result(WAIT_S)
        assert result.as_numpy("WIDTH").tolist() == [[8.0]]
        assert result.as_numpy("MASKED_SUM").tolist() == [[float(x.sum())]]  # LENGTHS told the model
        assert result.as_numpy("RAW_SUM").tolist() == [[float(x.sum()) + 100 * (8 - n)]]  # the pad value
        scaled = result.as_numpy("SCALED")  # cut back from [1, 8] to the client's own length
        assert scaled.shape == (1, n) and np.array_equal(scaled, x * 2)
    assert executions(http, "padded_sum") == (3, 1, {3: 1})


def test_a_request_longer_than_the_largest_bucket_is_refused(http: httpclient.InferenceServerClient) -> None:
    x = httpclient.InferInput("INPUT", [1, 17], "FP32").set_data_from_numpy(np.ones((1, 17), np.float32))
    with pytest.raises(InferenceServerException) as exc:
        http.infer("padded_sum", [x])
    assert exc.value.status() == "400"
    assert "more than the largest pad bucket 16 (parameter conveyor.pad_batching)" in exc.value.message()


@pytest.mark.parametrize("model", ["python_shapes", "python_ragged"])  # pad_batching, allow_ragged_batch
def test_python_model_gets_each_request_as_sent(grpc: grpcclient.InferenceServerClient, model: str) -> None:
    data = [np.full((1, 2, 3), 1, np.float32), np.full((1, 4, 1), 2, np.float32), np.full((1, 1, 5), 3, np.float32)]
    futures = [send(grpc, model, x) for x in data]
    for x, fut in zip(data, futures, strict=True):
        result = fut.result(WAIT_S)
        assert result.as_numpy("TOGETHER").tolist() == [[3]]  # one execute call for the three
        doubled = result.as_numpy("DOUBLED")
        assert doubled.shape == x.shape and np.array_equal(doubled, x * 2)  # not padded


def test_bad_ragged_and_pad_configs_are_refused_at_load(http: httpclient.InferenceServerClient) -> None:
    # A config Triton's validation refuses fails its poll: the model is never added, and the index lists it
    # UNAVAILABLE with the reason (Triton's lists the name alone).
    index = {r["name"]: r for r in http.get_model_repository_index()}
    for bad, why in (("bad_batch_input_type", "batch input data type must be TYPE_INT32 or TYPE_FP32"),
                     ("bad_pad_buckets", "ascending positive bucket sizes")):
        assert index[bad]["state"] == "UNAVAILABLE"
        assert why in index[bad]["reason"]
        assert not http.is_model_ready(bad)
    assert index["ragged_sum"]["state"] == index["padded_sum"]["state"] == "READY"
