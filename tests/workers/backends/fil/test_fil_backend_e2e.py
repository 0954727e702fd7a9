"""Tree models under Triton's FIL contract served by the real process group, called with
tritonclient over HTTP and gRPC, against what each framework itself predicts: single requests,
concurrent requests the dynamic batcher merges, and one large batch."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.group import Server, start_server
from tests.support.metrics import scrape

pytest.importorskip("xgboost", reason="the fil extra is not installed (pip install 'conveyor[fil]')")
pytest.importorskip("lightgbm", reason="the fil extra is not installed (pip install 'conveyor[fil]')")
pytest.importorskip("treelite", reason="the fil extra is not installed (pip install 'conveyor[fil]')")

from tests.support import fil_models  # after the skips: it imports the frameworks

LEVEL = "e2e"

# Class indices must match exactly; scores within 1e-5 relative (the frameworks' own float32).
EXACT = {"xgb_json_readme", "xgb_multi_class"}
FEATURES = {"xgb_legacy_binary": fil_models.LEGACY_FEATURES, "fil": 500}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, fil_models.Reference]]]:
    repo = str(tmp_path_factory.mktemp("fil"))
    refs = fil_models.build(repo)
    srv = start_server(repo, f"fil{os.getpid()}", "--workers", "1")
    yield srv, refs
    assert srv.stop() == 0
    assert srv.shm_segments() == [], "shared memory left behind after shutdown"


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> Any:
    return httpclient if request.param == "http" else grpcclient


def connect(server: Server, protocol: Any) -> Any:
    return protocol.InferenceServerClient(server.http_url if protocol is httpclient else server.grpc_url)


def infer(client: Any, protocol: Any, model: str, x: np.ndarray, outputs: tuple[str, ...] = ("output__0",)) -> Any:
    inp = protocol.InferInput("input__0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    wanted = [protocol.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, [inp], outputs=wanted)


def check(model: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == want.shape, (model, got.shape, want.shape)
    if model in EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-6)


MODELS = ["xgb_ubj_proba", "xgb_json_readme", "xgb_multi_class", "xgb_regressor", "xgb_legacy_binary", "fil",
          "lgb_binary_proba", "lgb_multi_proba", "lgb_regressor", "sklearn_pickle", "treelite_regressor"]


@pytest.mark.parametrize("model", MODELS)
def test_single_requests_match_the_framework(served: Any, protocol: Any, model: str) -> None:
    server, refs = served
    client = connect(server, protocol)
    features = FEATURES.get(model, fil_models.FEATURES)
    for rows, seed in ((1, 10), (7, 11)):
        x = fil_models.data(rows, seed=seed, features=features)
        check(model, infer(client, protocol, model, x).as_numpy("output__0"), refs[model](x))


@pytest.mark.parametrize("model", ["xgb_ubj_proba", "lgb_multi_proba", "sklearn_pickle", "xgb_multi_class"])
def test_dynamically_batched_requests_get_their_own_rows(served: Any, protocol: Any, model: str) -> None:
    server, refs = served

    def one(i: int) -> None:
        x = fil_models.data(1 + i % 4, seed=100 + i)
        check(model, infer(connect(server, protocol), protocol, model, x).as_numpy("output__0"), refs[model](x))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(32)))
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)["model_stats"][0]
    assert stats["inference_count"] >= 32
    # The batcher merged some of the 32 concurrent requests into shared executions.
    assert stats["execution_count"] < stats["inference_count"]


def test_a_large_batch(served: Any, protocol: Any) -> None:
    server, refs = served
    x = fil_models.data(4096, seed=5)
    got = infer(connect(server, protocol), protocol, "xgb_regressor", x).as_numpy("output__0")
    check("xgb_regressor", got, refs["xgb_regressor"](x))


def test_shap_values_beside_the_prediction(served: Any, protocol: Any) -> None:
    server, refs = served
    x = fil_models.data(5, seed=6)
    result = infer(connect(server, protocol), protocol, "xgb_shap", x, ("output__0", "treeshap_output"))
    check("xgb_shap", result.as_numpy("output__0"), refs["xgb_shap"](x))
    check("xgb_shap", result.as_numpy("treeshap_output"), refs["xgb_shap:treeshap_output"](x))


def test_statistics_and_metrics_count_the_model(served: Any) -> None:
    server, refs = served
    client = httpclient.InferenceServerClient(server.http_url)
    x = fil_models.data(3, seed=7)
    check("xgb_multi_class", infer(client, httpclient, "xgb_multi_class", x).as_numpy("output__0"),
          refs["xgb_multi_class"](x))
    stats = client.get_inference_statistics("xgb_multi_class")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1 and stats["inference_stats"]["compute_infer"]["ns"] > 0
    samples = scrape(server)
    key = 'nv_inference_request_success{model="xgb_multi_class",version="1"}'
    assert samples[key] >= 1, sorted(k for k in samples if "xgb_multi_class" in k)


def test_configs_report_triton_names(served: Any) -> None:
    server, _ = served
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("xgb_json_readme")
    assert config["backend"] == "fil" and config["default_model_filename"] == "xgboost.json"
    assert config["max_batch_size"] == 32768 and "dynamic_batching" in config
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("lgb_regressor")
    assert config["default_model_filename"] == "model.txt"


@pytest.mark.parametrize(("model", "reason"), [
    ("bad_features", "the model takes 8 features, the config declares [5]"),
    ("bad_model_type", "catboost not recognized as a valid serialization format"),
])
def test_models_that_cannot_load_say_why(served: Any, model: str, reason: str) -> None:
    server, _ = served
    client = httpclient.InferenceServerClient(server.http_url)
    assert not client.is_model_ready(model)
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert reason in index[model]["reason"]
    with pytest.raises(InferenceServerException):
        infer(client, httpclient, model, fil_models.data(1))
