"""The fil backend on its own: Triton's FIL parameters, how scores become output__0, and what
refuses a load (with the reason)."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from conveyor.deploy.example_repo import write_model
from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, Status
from conveyor.proto.model_config import parse_text
from conveyor.router.repository.scan import load_spec
from conveyor.workers.backends import cpu_threads, load_backend
from conveyor.workers.backends.base import Backend
from conveyor.workers.backends.fil import settings as fil_settings
from conveyor.workers.backends.fil.settings import FilSettings

LEVEL = "unit"


def params(**values: str) -> mc.ModelConfig:
    return parse_text("".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n'
                              for k, v in values.items()))


def test_settings_defaults_and_triton_names() -> None:
    s = FilSettings.from_config(mc.ModelConfig())
    assert (s.model_type, s.is_classifier, s.predict_proba, s.threshold, s.threads) == ("xgboost", None, False, 0.5, 1)
    s = FilSettings.from_config(params(model_type="lightgbm", is_classifier="true", predict_proba="true",
                                       threshold="0.3", cpu_nthread="3"))
    assert (s.model_type, s.is_classifier, s.predict_proba, s.threshold, s.threads) == ("lightgbm", True, True, 0.3, 3)
    # Triton 25.09 maps the old output_class onto is_classifier, the old name winning.
    assert FilSettings.from_config(params(output_class="false", is_classifier="true")).is_classifier is False
    # GPU and removed knobs: checked where Triton documents their values, then ignored.
    FilSettings.from_config(params(algo="ALGO_AUTO", storage_type="SPARSE8", blocks_per_sm="0", layout="layered",
                                   chunk_size="4", transfer_threshold="2", xgboost_allow_unknown_field="true"))


@pytest.mark.parametrize(("values", "reason"), [
    ({"model_type": "catboost"}, "catboost not recognized as a valid serialization format"),
    ({"threshold": "high"}, "parameter 'threshold' must be a number"),
    ({"storage_type": "DENSEST"}, "parameter 'storage_type' must be one of AUTO, DENSE, SPARSE, SPARSE8"),
    ({"predict_proba": "maybe"}, "parameter 'predict_proba' must be true or false"),
    ({"cpu_nthread": "2", "threads": "3"}, "'cpu_nthread' (2) and 'threads' (3)"),
    ({"cpu_nthread": "many"}, "parameter 'cpu_nthread' must be an integer"),
])
def test_bad_parameters_are_refused(values: dict[str, str], reason: str) -> None:
    with pytest.raises(ConveyorError, match=reason.replace("(", r"\(").replace(")", r"\)")) as exc:
        FilSettings.from_config(params(**values))
    assert exc.value.status == Status.INVALID_ARG


def test_threads_share_the_cores_among_instances(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: 8)
    assert FilSettings.from_config(params(cpu_nthread="-1")).threads == 8  # Triton's "every core"
    assert FilSettings.from_config(params(threads="2")).threads == 2
    assert FilSettings.from_config(mc.ModelConfig()).threads == 1  # one instance per worker process
    four = parse_text("instance_group [{ count: 4 kind: KIND_CPU }]")
    assert FilSettings.from_config(four).threads == 2
    assert FilSettings.from_config(parse_text("instance_group [{ count: 16 kind: KIND_CPU }]")).threads == 1


def test_default_model_file_follows_model_type(tmp_path: Path) -> None:
    for model_type, filename in fil_settings.MODEL_FILES.items():
        model = tmp_path / model_type
        write_model(
            tmp_path, model_type,
            f'backend: "fil"\nmax_batch_size: 8\ninput [{{ name: "input__0" data_type: TYPE_FP32 dims: [ 4 ] }}]\n'
            f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }}]\n'
            f'parameters {{ key: "model_type" value {{ string_value: "{model_type}" }} }}\n',
            {filename: b"{}"})
        spec = load_spec(model_type, str(model))
        assert spec.error == "" and spec.backend == "fil", spec.error
        assert spec.versions == {1: str(model / "1" / filename)}


def test_without_the_framework_the_model_says_which_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "xgboost", None)  # import xgboost now fails as if it were not installed
    path = tmp_path / "xgboost.json"
    path.write_text("{}")
    config = parse_text('backend: "fil" max_batch_size: 8 input [{ name: "input__0" data_type: TYPE_FP32 dims: [4] }]'
                        ' output [{ name: "output__0" data_type: TYPE_FP32 dims: [1] }]'
                        ' parameters { key: "model_type" value { string_value: "xgboost_json" } }')
    with pytest.raises(ConveyorError, match=r"pip install 'conveyor\[fil\]'") as exc:
        load_backend("fil", str(path), config, "cpu")
    assert exc.value.status == Status.UNAVAILABLE


@pytest.fixture()
def xgb() -> Any:
    return pytest.importorskip("xgboost", reason="the fil extra is not installed (pip install 'conveyor[fil]')")


def fil_config(model_type: str, width: int, features: int = 4, outputs: str = "", **values: str) -> mc.ModelConfig:
    return parse_text(
        f'backend: "fil" max_batch_size: 64 input [{{ name: "input__0" data_type: TYPE_FP32 dims: [{features}] }}]'
        f' output [{{ name: "output__0" data_type: TYPE_FP32 dims: [{width}] }}{outputs}]'
        + "".join(f' parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
                  for k, v in {"model_type": model_type, **values}.items()))


def binary_model(xgb: Any, path: Path) -> Any:
    x = np.random.default_rng(0).random((200, 4), dtype=np.float32)
    booster = xgb.train({"objective": "binary:logistic", "max_depth": 2, "nthread": 1},
                        xgb.DMatrix(x, label=x[:, 0] > 0.5), 3)
    booster.save_model(str(path))
    return booster


def test_threshold_decides_a_binary_class(xgb: Any, tmp_path: Path) -> None:
    booster = binary_model(xgb, tmp_path / "xgboost.json")
    backend = load_backend("fil", str(tmp_path / "xgboost.json"), fil_config("xgboost_json", 1, threshold="0.7"), "cpu")
    x = np.random.default_rng(1).random((50, 4), dtype=np.float32)
    p = booster.inplace_predict(x)
    got = cast(Backend, backend).execute({"input__0": x}, ["output__0"])["output__0"]
    np.testing.assert_array_equal(got, (p > 0.7).astype(np.float32)[:, None])
    assert 0 < got.sum() < 50


@pytest.mark.parametrize(("config", "reason"), [
    (fil_config("xgboost_json", 3, predict_proba="true"), "declares 3 values per row; with predict_proba"),
    (fil_config("xgboost_json", 2), "without predict_proba a classifier gives its class index"),
    (fil_config("xgboost_json", 1, features=6), "the model takes 4 features, the config declares [6]"),
    (fil_config("xgboost_json", 1, outputs=', { name: "probs" data_type: TYPE_FP32 dims: [2] }'),
     "answers 'output__0' (and optionally 'treeshap_output')"),
])
def test_config_and_model_must_agree(xgb: Any, tmp_path: Path, config: mc.ModelConfig, reason: str) -> None:
    binary_model(xgb, tmp_path / "xgboost.json")
    with pytest.raises(ConveyorError) as exc:
        load_backend("fil", str(tmp_path / "xgboost.json"), config, "cpu")
    assert reason in exc.value.message and exc.value.status == Status.UNAVAILABLE


def test_a_regressor_is_not_served_as_a_classifier(xgb: Any, tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((100, 4), dtype=np.float32)
    xgb.train({"objective": "reg:squarederror", "nthread": 1}, xgb.DMatrix(x, label=x[:, 0]),
              2).save_model(str(tmp_path / "xgboost.json"))
    with pytest.raises(ConveyorError, match="says the model is a classifier"):
        load_backend("fil", str(tmp_path / "xgboost.json"), fil_config("xgboost_json", 1, is_classifier="true"), "cpu")


def test_shap_values_only_where_the_framework_has_them(tmp_path: Path) -> None:
    ensemble = pytest.importorskip("sklearn.ensemble", reason="the fil extra is not installed")
    x = np.random.default_rng(0).random((100, 4), dtype=np.float32)
    with open(tmp_path / "model.pkl", "wb") as f:
        pickle.dump(ensemble.RandomForestRegressor(n_estimators=2, max_depth=2).fit(x, x[:, 0]), f)
    config = fil_config("sklearn", 1, outputs=', { name: "treeshap_output" data_type: TYPE_FP32 dims: [5] }')
    with pytest.raises(ConveyorError, match="computed for XGBoost and LightGBM models, not for model_type 'sklearn'"):
        load_backend("fil", os.fspath(tmp_path / "model.pkl"), config, "cpu")


@pytest.mark.parametrize("objective", ["binary:logistic", "multi:softprob", "multi:softmax", "reg:squarederror"])
def test_the_direct_call_predicts_what_inplace_predict_does(xgb: Any, objective: str, tmp_path: Path) -> None:
    """XGBoost called through its C API (xgboost_call.py) against its own ``inplace_predict``, with
    NaN as a missing value; a batch it cannot take as it is (float64, strided) takes the Python path."""
    from conveyor.workers.backends.fil.forests import XGBoostForest

    rng = np.random.default_rng(0)
    x = rng.random((300, 5), dtype=np.float32)
    label = (x[:, 0] * 3).astype(int) if objective.startswith("multi") else x[:, 0] > 0.5
    extra = {"num_class": 3} if objective.startswith("multi") else {}
    booster = xgb.train({"objective": objective, "max_depth": 3, "nthread": 1, **extra},
                        xgb.DMatrix(x, label=label), 5)
    booster.save_model(str(tmp_path / "xgboost.json"))
    forest = XGBoostForest(str(tmp_path / "xgboost.json"), 1)
    assert forest._direct is not None
    batch = x[:37].copy()
    batch[3, 2] = np.nan
    margins = objective == "multi:softmax"
    want = booster.inplace_predict(batch, predict_type="margin" if margins else "value")
    got = forest._direct(batch)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(forest.scores(batch), forest.scores(batch.astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(forest.scores(x[::2][:10]), forest.scores(np.ascontiguousarray(x[::2][:10])), rtol=1e-6)
