"""Ensembles end to end with tritonclient: a chain and a diamond over HTTP and gRPC,
a failing step, invalid ensembles, and the statistics Triton reports for them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import ensemble_models
from tests.support.group import Server, start_server
from tests.support.metrics import scrape

LEVEL = "e2e"

pytestmark = pytest.mark.timeout(180)

Client = Any


@pytest.fixture(scope="module")
def ens_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    repo = str(tmp_path_factory.mktemp("ensembles"))
    ensemble_models.build(repo)
    srv = start_server(repo, f"e{os.getpid()}", "--workers", "2", "--allow-client-shm", "true")
    yield srv
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


@pytest.fixture()
def client(ens_server: Server, protocol: Any) -> Client:
    return protocol.InferenceServerClient(ens_server.http_url if protocol is httpclient else ens_server.grpc_url)


def ab_inputs(protocol: Any, a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [protocol.InferInput("A", list(a.shape), "INT32"), protocol.InferInput("B", list(b.shape), "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def sample(rows: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(-100, 100, (rows, 16), dtype=np.int32), rng.integers(-100, 100, (rows, 16), dtype=np.int32))


def test_chain_runs_both_steps(client: Client, protocol: Any) -> None:
    a, b = sample(2)
    result = client.infer("ens_chain", ab_inputs(protocol, a, b))
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    only = client.infer("ens_chain", ab_inputs(protocol, a, b), outputs=[protocol.InferRequestedOutput("DIFF")])
    assert only.as_numpy("SUM") is None
    np.testing.assert_array_equal(only.as_numpy("DIFF"), a - b)


def test_diamond_with_independent_steps(client: Client, protocol: Any) -> None:
    for seed in range(3):
        a, b = sample(1, seed)
        result = client.infer("ens_diamond", ab_inputs(protocol, a, b))
        np.testing.assert_array_equal(result.as_numpy("OUT0"), 2 * b)
        np.testing.assert_array_equal(result.as_numpy("OUT1"), 2 * a)


def test_concurrent_requests_keep_their_own_tensors(ens_server: Server) -> None:
    client = httpclient.InferenceServerClient(ens_server.http_url, concurrency=8)
    samples = [sample(1, seed) for seed in range(24)]
    pending = [client.async_infer("ens_diamond", ab_inputs(httpclient, a, b)) for a, b in samples]
    for (a, b), request in zip(samples, pending, strict=True):
        result = request.get_result(timeout=60)
        np.testing.assert_array_equal(result.as_numpy("OUT0"), 2 * b)
        np.testing.assert_array_equal(result.as_numpy("OUT1"), 2 * a)
    client.close()


def test_a_failing_step_fails_the_request_with_its_message(ens_server: Server, client: Client, protocol: Any) -> None:
    a, b = sample()
    failures = 'nv_inference_request_failure{model="ens_fails",reason="OTHER",version="1"}'
    before = scrape(ens_server).get(failures, 0)
    with pytest.raises(InferenceServerException) as failed:
        client.infer("ens_fails", ab_inputs(protocol, a, b))
    assert failed.value.message() == "in ensemble 'ens_fails', step exploded on purpose"  # as Triton names it
    # Counted as Triton counts an ensemble's failure: reason OTHER, whatever its step's, and twice (its error
    # answer, then its request tracker: qa/L0_model_queue asserts it).
    assert scrape(ens_server)[failures] == before + 2
    # The ensemble keeps serving after a failure.
    np.testing.assert_array_equal(client.infer("ens_chain", ab_inputs(protocol, a, b)).as_numpy("SUM"), a + b)


def test_a_step_is_checked_as_a_clients_request_is(client: Client, protocol: Any) -> None:
    """Triton's core checks every request, an ensemble's steps' too: a tensor the step's model cannot
    take is a 400 in its words, named by the ensemble, not the backend's failure."""
    short = protocol.InferInput("A", [1, 3], "INT32")
    short.set_data_from_numpy(np.arange(3, dtype=np.int32).reshape(1, 3))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("ens_loose", [short])
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert refused.value.message() == (
        "in ensemble 'ens_loose', [request id: <id_unknown>] unexpected shape for input 'INPUT0' for model "
        "'ident'. Expected [-1,16], got [1,3]. NOTE: Setting a non-zero max_batch_size in the model config "
        "requires a batch dimension to be prepended to each input shape. If you want to specify the full shape "
        "including the batch dim in your input dims config, try setting max_batch_size to zero. See the model "
        "configuration docs for more info on max_batch_size.")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    fits = protocol.InferInput("A", [1, 16], "INT32")
    fits.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("ens_loose", [fits]).as_numpy("OUT"), a)


def test_a_batching_ensemble_runs_a_non_batching_step(client: Client, protocol: Any) -> None:
    """Triton's rule and shapes: the non-batching step gets [16] of a request's [1, 16], and its output
    goes on as [1, 16] (to the batching step after it, and to the client)."""
    a, _ = sample(1)
    inputs = ab_inputs(protocol, a, a)[:1]
    result = client.infer("ens_nobatch_step", inputs)
    np.testing.assert_array_equal(result.as_numpy("NEG"), -a)
    np.testing.assert_array_equal(result.as_numpy("OUT"), -a)
    assert result.as_numpy("NEG").shape == (1, 16)


@pytest.mark.parametrize(("model", "reason"), [
    # Triton's words (its dependency graph's, then ValidateEnsembleConfig's)
    ("ens_missing_model", "ensemble ens_missing_model contains models that are not available or ambiguous: "
                          "no_such_model"),
    ("ens_too_big", "ensemble ens_too_big allows maximum batch size 16, but it contains model ident which only "
                    "allows maximum batch size to be 8"),
    ("ens_bad_tensor", "in ensemble ens_bad_tensor, ensemble tensor A is mapping to non-existing input NOPE in model "
                       "ident"),
    ("ens_two_streams", "in ensemble ens_two_streams, step of model 'ens_two_streams' receives inputs originated "
                        "from different decoupled models"),
    ("ens_bad_condition", "parameter 'conveyor.step.0.when': condition 'A is big': expected '<tensor> <op> <value>'"),
])
def test_invalid_ensembles_are_unavailable_with_the_reason(ens_server: Server, model: str, reason: str) -> None:
    http = httpclient.InferenceServerClient(ens_server.http_url)
    assert not http.is_model_ready(model)
    rows = {r["name"]: r for r in http.get_model_repository_index()}
    assert rows[model]["state"] == "UNAVAILABLE"
    assert reason in rows[model]["reason"]
    with pytest.raises(InferenceServerException, match=r"not ready|no available versions") as err:
        http.infer(model, ab_inputs(httpclient, *sample())[:1])
    assert reason in str(err.value)
    assert http.is_server_ready()


def test_an_ensemble_triton_refuses_at_its_poll_is_listed_unavailable_with_the_reason(ens_server: Server) -> None:
    """Steps in a cycle: Triton's data-flow check refuses the config as it reads the repository ("ensemble tensor
    'y' is unused in ensemble 'ens_cycle'" in the log). Listed as a model its poll failed is: UNAVAILABLE with
    that reason (Triton lists the name alone, the reason only in its log: docs/ERRORS.md)."""
    http = httpclient.InferenceServerClient(ens_server.http_url)
    assert not http.is_model_ready("ens_cycle")
    row = {r["name"]: r for r in http.get_model_repository_index()}["ens_cycle"]
    assert row == {"name": "ens_cycle", "version": "", "state": "UNAVAILABLE",
                   "reason": "model 'ens_cycle': ensemble tensor 'y' is unused in ensemble 'ens_cycle'"}


def test_metadata_and_readiness(ens_server: Server) -> None:
    http = httpclient.InferenceServerClient(ens_server.http_url)
    assert http.is_model_ready("ens_chain")
    meta = http.get_model_metadata("ens_chain")
    assert meta["platform"] == "ensemble"
    assert [t["name"] for t in meta["inputs"]] == ["A", "B"]
    config = http.get_model_config("ens_chain")
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["simple", "ident"]


def _stats(client: Client, model: str) -> dict[str, Any]:
    return dict(client.get_inference_statistics(model)["model_stats"][0])


def test_statistics_of_the_ensemble_and_its_composing_models(ens_server: Server) -> None:
    http = httpclient.InferenceServerClient(ens_server.http_url)
    before = {m: _stats(http, m) for m in ("ens_chain", "simple", "ident")}
    a, b = sample()
    for _ in range(3):
        http.infer("ens_chain", ab_inputs(httpclient, a, b))
    after = {m: _stats(http, m) for m in ("ens_chain", "simple", "ident")}

    def grew(model: str, path: str) -> int:
        key, field = path.split(".")
        return int(after[model]["inference_stats"][key][field]) - int(before[model]["inference_stats"][key][field])

    assert grew("ens_chain", "success.count") == 3
    assert after["ens_chain"]["inference_count"] - before["ens_chain"]["inference_count"] == 3
    # Each step is an ordinary request to its composing model...
    assert grew("simple", "success.count") == 3 and grew("ident", "success.count") == 3
    # ...and, as in Triton, the ensemble's queue and compute times add up its steps' (two per request).
    assert grew("ens_chain", "queue.count") == 6
    assert grew("ens_chain", "compute_infer.count") == 6
    assert grew("ens_chain", "compute_infer.ns") > 0
    # One execution of its batch size per request, with its steps' compute times (Triton's batch_stats).
    sizes = {b["batch_size"]: b for b in after["ens_chain"]["batch_stats"]}
    old = {b["batch_size"]: b for b in before["ens_chain"]["batch_stats"]}
    assert sizes[1]["compute_infer"]["count"] - (old[1]["compute_infer"]["count"] if 1 in old else 0) == 3
    assert sizes[1]["compute_infer"]["ns"] > 0
    grpc = grpcclient.InferenceServerClient(ens_server.grpc_url)
    stats = grpc.get_inference_statistics("ens_chain", as_json=True)["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) >= 3


def test_a_response_carries_the_requests_sequence_as_tritons_ensembles(ens_server: Server) -> None:
    a, b = sample()
    with grpcclient.InferenceServerClient(ens_server.grpc_url) as client:
        params = [client.infer("ens_chain", ab_inputs(grpcclient, a, b), **kwargs).get_response().parameters
                  for kwargs in ({"sequence_id": 9, "sequence_start": True}, {})]
    assert [(p["sequence_id"].int64_param, p["sequence_start"].bool_param, p["sequence_end"].bool_param)
            for p in params] == [(9, True, False), (0, False, False)]


def test_a_request_for_some_outputs_runs_only_the_steps_they_need(ens_server: Server) -> None:
    # ens_chain: simple makes DIFF (and sum), ident makes SUM from sum: asking for DIFF alone never runs ident.
    client = httpclient.InferenceServerClient(ens_server.http_url)

    def ident_runs() -> int:
        stats = client.get_inference_statistics("ident")["model_stats"][0]["inference_stats"]
        return int(stats["success"]["count"])

    a, b = sample()
    before = ident_runs()
    only = client.infer("ens_chain", ab_inputs(httpclient, a, b), outputs=[httpclient.InferRequestedOutput("DIFF")])
    np.testing.assert_array_equal(only.as_numpy("DIFF"), a - b)
    assert ident_runs() == before
    client.infer("ens_chain", ab_inputs(httpclient, a, b))
    assert ident_runs() == before + 1


def test_an_output_no_step_produced_is_left_out_of_the_response(client: Client, protocol: Any) -> None:
    a, b = sample()
    result = client.infer("ens_partial", ab_inputs(protocol, a, b),
                          outputs=[protocol.InferRequestedOutput("SUM"), protocol.InferRequestedOutput("DIFF")])
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    assert result.as_numpy("DIFF") is None


def test_a_request_may_leave_out_an_optional_input(client: Client, protocol: Any) -> None:
    """Triton's L0_optional_input: the step gets only the inputs the request gave."""
    a = np.arange(16, dtype=np.int32)
    only_a = protocol.InferInput("A", [16], "INT32")
    only_a.set_data_from_numpy(a)
    assert client.infer("ens_optional", [only_a]).as_numpy("OUT").tolist() == a.tolist()
    both = [only_a, protocol.InferInput("B", [16], "INT32")]
    both[1].set_data_from_numpy(a)
    assert client.infer("ens_optional", both).as_numpy("OUT").tolist() == (2 * a).tolist()


def test_conditional_steps_run_one_branch(ens_server: Server, client: Client, protocol: Any) -> None:
    http = httpclient.InferenceServerClient(ens_server.http_url)
    before = _stats(http, "ident")
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inp = protocol.InferInput("A", [1, 16], "INT32")
    inp.set_data_from_numpy(a)
    positive = client.infer("ens_if_else", [inp])
    np.testing.assert_array_equal(positive.as_numpy("POS"), a)
    assert positive.as_numpy("NEG") is None  # that step was skipped: its output is left out
    inp.set_data_from_numpy(-a)
    negative = client.infer("ens_if_else", [inp])
    np.testing.assert_array_equal(negative.as_numpy("NEG"), a)
    assert negative.as_numpy("POS") is None
    after = _stats(http, "ident")
    grown = int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"])
    assert grown == 1  # "ident" ran for the positive request only


def test_early_exit_returns_what_exists(client: Client, protocol: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inp = protocol.InferInput("A", [1, 16], "INT32")
    inp.set_data_from_numpy(-a)
    stopped = client.infer("ens_exit", [inp])
    np.testing.assert_array_equal(stopped.as_numpy("FLAG"), [[False]])
    assert stopped.as_numpy("OUT") is None
    inp.set_data_from_numpy(a)
    full = client.infer("ens_exit", [inp])
    np.testing.assert_array_equal(full.as_numpy("FLAG"), [[True]])
    np.testing.assert_array_equal(full.as_numpy("OUT"), -a)


def test_client_shared_memory_in_and_out(client: Client, protocol: Any) -> None:
    """Inputs read from the client's segment, an ensemble output written into it by its step."""
    a, b = sample(1, 9)
    nbytes = a.nbytes
    key = f"/cv_ens_{protocol.__name__.split('.')[-1]}_{os.getpid()}"
    handle = shm.create_shared_memory_region("ens_io", key, 3 * nbytes)
    try:
        shm.set_shared_memory_region(handle, [a, b])
        client.register_system_shared_memory("ens_io", key, 3 * nbytes)
        inputs = ab_inputs(protocol, a, b)
        inputs[0].set_shared_memory("ens_io", nbytes)
        inputs[1].set_shared_memory("ens_io", nbytes, offset=nbytes)
        placed = protocol.InferRequestedOutput("SUM")
        placed.set_shared_memory("ens_io", nbytes, offset=2 * nbytes)
        result = client.infer("ens_chain", inputs, outputs=[placed, protocol.InferRequestedOutput("DIFF")])
        np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
        summed = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=2 * nbytes)
        np.testing.assert_array_equal(summed, a + b)
    finally:
        client.unregister_system_shared_memory("ens_io")
        shm.destroy_shared_memory_region(handle)
