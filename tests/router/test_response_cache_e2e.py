"""Triton's response cache end to end: hits and misses in the statistics and the
metrics, identical outputs, eviction by size, no cache unless configured, and an
ensemble's (its whole response, and its steps' in their models' caches)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conveyor.deploy.example_repo import add_sub, identity
from tests.support.ensemble_models import ADD_SUB, _step, ensemble
from tests.support.group import Server, start_server
from tests.support.metrics import metrics_text

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)

CACHE_BYTES = 1 << 20


def build_repo(repo: str) -> None:
    add_sub(repo, "simple_cached", 8, "dynamic_batching { }\nresponse_cache { enable: true }")
    add_sub(repo, "simple", 8, "dynamic_batching { }")  # no response_cache: never cached
    identity(repo, "big_cached", "FP32", 0, "-1", "response_cache { enable: true }")
    # An ensemble caching its whole response over a model that does not; one that does not over one that does.
    add_sub(repo, "simple_uncached_step", 8, "dynamic_batching { }")
    ensemble(repo, "ens_cached", ["A", "B"], ["SUM", "DIFF"],
             [_step("simple_uncached_step", ADD_SUB, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"})],
             extra="response_cache { enable: true }")
    add_sub(repo, "simple_cached_step", 8, "dynamic_batching { }\nresponse_cache { enable: true }")
    ensemble(repo, "ens_over_cached", ["A", "B"], ["SUM", "DIFF"],
             [_step("simple_cached_step", ADD_SUB, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"})])


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("cached"))
    build_repo(path)
    return path


@pytest.fixture(scope="module")
def cache_server(repo: str) -> Iterator[Server]:
    srv = start_server(repo, f"c{os.getpid()}", "--workers", "2", "--cache-config", f"local,size={CACHE_BYTES}")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def client_for(server: Server, protocol: Any) -> Any:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def add_sub_inputs(protocol: Any, seed: int, names: tuple[str, str] = ("INPUT0", "INPUT1"),
                   ) -> tuple[list[Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a, b = (rng.integers(-1000, 1000, (1, 16), dtype=np.int32) for _ in range(2))
    inputs = [protocol.InferInput(name, [1, 16], "INT32") for name in names]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def stats(server: Server, model: str) -> dict[str, Any]:
    http = httpclient.InferenceServerClient(server.http_url)
    return dict(http.get_inference_statistics(model)["model_stats"][0])


def counts(s: dict[str, Any]) -> tuple[int, int, int, int]:
    inf = s["inference_stats"]
    return (int(inf["cache_hit"]["count"]), int(inf["cache_miss"]["count"]), int(inf["success"]["count"]),
            int(s["execution_count"]))


def test_a_repeated_request_is_a_hit_with_identical_outputs(cache_server: Server, protocol: Any) -> None:
    client = client_for(cache_server, protocol)
    seed = 1 if protocol is httpclient else 2
    hits, misses, successes, executions = counts(stats(cache_server, "simple_cached"))
    inputs, a, b = add_sub_inputs(protocol, seed)
    first = client.infer("simple_cached", inputs)
    second = client.infer("simple_cached", add_sub_inputs(protocol, seed)[0])
    for result in (first, second):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    after = counts(stats(cache_server, "simple_cached"))
    assert after == (hits + 1, misses + 1, successes + 2, executions + 1)  # a hit counts as a success only
    # Other inputs, or other requested outputs, are other entries.
    client.infer("simple_cached", add_sub_inputs(protocol, seed + 10)[0])
    only = client.infer("simple_cached", add_sub_inputs(protocol, seed)[0],
                        outputs=[protocol.InferRequestedOutput("OUTPUT1")])
    np.testing.assert_array_equal(only.as_numpy("OUTPUT1"), a - b)
    assert only.as_numpy("OUTPUT0") is None
    assert counts(stats(cache_server, "simple_cached"))[:2] == (hits + 1, misses + 3)


def test_models_without_response_cache_are_not_cached(cache_server: Server) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    for _ in range(2):
        client.infer("simple", add_sub_inputs(httpclient, 3)[0])
    hits, misses, _, _ = counts(stats(cache_server, "simple"))
    assert (hits, misses) == (0, 0)


def test_the_cache_evicts_the_least_recently_used_by_size(cache_server: Server) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)

    def send(value: float) -> None:
        x = np.full(CACHE_BYTES // 4 * 2 // 3, value, dtype=np.float32)  # two of these do not fit
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_array_equal(client.infer("big_cached", [inp]).as_numpy("OUTPUT0"), x)

    send(1.0)
    send(1.0)
    send(2.0)  # evicts 1.0
    send(2.0)
    send(1.0)
    hits, misses, _, _ = counts(stats(cache_server, "big_cached"))
    assert (hits, misses) == (2, 3)


def test_cache_metrics(cache_server: Server) -> None:
    client = httpclient.InferenceServerClient(cache_server.http_url)
    for _ in range(3):
        client.infer("simple_cached", add_sub_inputs(httpclient, 42)[0])
    hits, misses, _, _ = counts(stats(cache_server, "simple_cached"))
    text = metrics_text(cache_server)
    labels = '{model="simple_cached",version="1"}'
    assert f"nv_cache_num_hits_per_model{labels} {hits}" in text
    assert f"nv_cache_num_misses_per_model{labels} {misses}" in text
    assert "nv_cache_hit_duration_per_model" in text and "nv_cache_miss_duration_per_model" in text


def ensemble_inputs(seed: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    return add_sub_inputs(grpcclient, seed, ("A", "B"))


def run_twice(server: Server, model: str, seed: int) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs, a, b = ensemble_inputs(seed)
    for _ in range(2):
        result = client.infer(model, inputs)
        np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)


def test_an_ensemble_with_the_cache_caches_its_whole_response(cache_server: Server) -> None:
    """qa/L0_response_cache's test_ensemble_top_level_response_cache: the second request is answered from
    the ensemble's cache, and its step runs once."""
    run_twice(cache_server, "ens_cached", 7)
    hits, misses, successes, _ = counts(stats(cache_server, "ens_cached"))
    assert (hits, misses, successes) == (1, 1, 2)
    step = counts(stats(cache_server, "simple_uncached_step"))
    assert step == (0, 0, 1, 1)


def test_an_ensembles_step_is_looked_up_in_its_models_cache(cache_server: Server) -> None:
    """qa/L0_response_cache's test_ensemble_composing_model_cache_enabled: the step's model has the cache
    (keyed on the inputs its step got, as a client's request to it is), the ensemble has none."""
    run_twice(cache_server, "ens_over_cached", 8)
    assert counts(stats(cache_server, "ens_over_cached"))[:3] == (0, 0, 2)
    assert counts(stats(cache_server, "simple_cached_step")) == (1, 1, 2, 1)
    # A client's own request with the same inputs is the same entry.
    client = grpcclient.InferenceServerClient(cache_server.grpc_url)
    inputs, a, b = add_sub_inputs(grpcclient, 8)
    np.testing.assert_array_equal(client.infer("simple_cached_step", inputs).as_numpy("OUTPUT0"), a + b)
    assert counts(stats(cache_server, "simple_cached_step"))[:2] == (2, 1)


def test_no_cache_without_cache_config(repo: str) -> None:
    srv = start_server(repo, f"n{os.getpid()}", "--workers", "1", "--grpc-ingress", "0", grpc=False)
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        for _ in range(2):
            client.infer("simple_cached", add_sub_inputs(httpclient, 5)[0])
        hits, misses, successes, executions = counts(stats(srv, "simple_cached"))
        assert (hits, misses, successes, executions) == (0, 0, 2, 2)
    finally:
        assert srv.stop() == 0
