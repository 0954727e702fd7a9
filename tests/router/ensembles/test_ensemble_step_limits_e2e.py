"""``ensemble_scheduling.max_inflight_requests`` on the real process group: at most that many requests
of each step in flight over all the ensemble's requests (Triton's back-pressure, qa/L0_simple_ensemble),
logged at load as Triton logs it; an invalid value fails the load (tests/router/repository/test_cpp_parse_words.py
has the words Triton's protobuf parser logs for it)."""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conveyor.deploy.example_repo import add_sub, write_model
from tests.support.group import Server, start_server

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)

REQUESTS = 4  # concurrent ensemble requests: without the limit one batch of them all
DELAY_US = 1_000_000  # the step's batcher waits this long for a batch of REQUESTS
WAIT_S = 60.0


# qa/L0_simple_ensemble's invalid values.
INVALID = {"ens_negative": "-5", "ens_string": '"invalid_value"', "ens_too_large": "12345678901"}


def limited_ensemble(repo: str, name: str, limit: int | str) -> None:
    write_model(repo, name, f'''name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_INT32 dims: [ 16 ] }}, {{ name: "B" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{
  max_inflight_requests: {limit}
  step [ {{ model_name: "batched_step" model_version: -1
           input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "B" }}
           output_map {{ key: "OUTPUT0" value: "SUM" }} }} ]
}}
''')


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("step_limits"))
    add_sub(repo, "batched_step", 8, f"dynamic_batching {{ preferred_batch_size: [ {REQUESTS} ] "
            f"max_queue_delay_microseconds: {DELAY_US} }}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]")
    limited_ensemble(repo, "ens_limit_1", 1)
    for name, value in INVALID.items():
        limited_ensemble(repo, name, value)
    server = start_server(repo, f"sl{os.getpid()}", "--workers", "1", "--log-file", os.path.join(repo, "server.log"))
    yield server
    assert server.stop() == 0


def test_the_limit_is_logged_at_load(srv: Server) -> None:
    log = (Path(srv.repo) / "server.log").read_text()
    assert "Ensemble model 'ens_limit_1' configured with max_inflight_requests: 1" in log


def test_invalid_values_fail_the_load(srv: Server) -> None:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    for name in INVALID:
        assert index[name].get("state") == "UNAVAILABLE" and "failed to parse" in index[name]["reason"]


def test_one_step_request_in_flight_at_a_time(srv: Server) -> None:
    """Four requests at once: the step runs them one by one (four batches of one), where without the limit
    its batcher makes one batch of four."""
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for i in range(REQUESTS):
        inputs = [grpcclient.InferInput("A", [1, 16], "INT32"), grpcclient.InferInput("B", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(np.full((1, 16), i, dtype=np.int32))
        client.async_infer("ens_limit_1", inputs, partial(lambda i, result, error: results.put((i, result, error)), i))
    for _ in range(REQUESTS):
        i, result, error = results.get(timeout=WAIT_S)
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("SUM"), a + i)
    stats = client.get_inference_statistics("batched_step", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) == REQUESTS
    assert [(int(b["batch_size"]), int(b["compute_infer"]["count"])) for b in stats["batch_stats"]] == [(1, REQUESTS)]
