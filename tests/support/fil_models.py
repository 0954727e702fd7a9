"""Tree models for the fil backend's tests, trained on the fly on random data (tiny: 8 features,
a few shallow trees) and saved in each format Triton's FIL backend reads, with their configs.

Imported only where the frameworks are (``pip install 'conveyor[fil]'``). Each builder returns
the reference: a function giving what the framework itself predicts for a batch, shaped as FIL's
``output__0``.
"""

from __future__ import annotations

import os
import pickle
import shutil
from collections.abc import Callable
from functools import partial
from typing import Any

import lightgbm as lgb
import numpy as np
import treelite
import treelite.sklearn
import xgboost as xgb
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

from conveyor.deploy.example_repo import write_model

FEATURES = 8
Reference = Callable[[np.ndarray], np.ndarray]
LEGACY_BINARY = os.path.join(os.path.dirname(__file__), "data", "xgboost_legacy_binary.model")
LEGACY_FEATURES = 4  # tests/support/data/xgboost_legacy_binary.model: 4 features, binary:logistic (XGBoost 2.1)

# Triton's FIL README quick-start config as written (its $NUM_FEATURES, $MODEL_TYPE and
# $IS_A_CLASSIFIER filled in; it names no model, so the directory does).
README_CONFIG = """backend: "fil"
max_batch_size: 32768
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ $NUM_FEATURES ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 1 ]
  }
]
instance_group [{ kind: KIND_AUTO }]
parameters [
  {
    key: "model_type"
    value: { string_value: "$MODEL_TYPE" }
  },
  {
    key: "is_classifier"
    value: { string_value: "$IS_A_CLASSIFIER" }
  }
]

dynamic_batching {}
"""

# The FIL README's older example (before Triton 25.09 renamed output_class to is_classifier and
# dropped algo, storage_type and blocks_per_sm), as written but for its KIND_GPU: the tests run
# without a GPU, where Triton, too, cannot place a KIND_GPU instance.
OLD_README_CONFIG = """name: "fil"
backend: "fil"
max_batch_size: 8192
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ 500 ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 2 ]
  }
]
instance_group [{ kind: KIND_CPU }]
parameters [
  {
    key: "model_type"
    value: { string_value: "xgboost" }
  },
  {
    key: "predict_proba"
    value: { string_value: "true" }
  },
  {
    key: "output_class"
    value: { string_value: "true" }
  },
  {
    key: "threshold"
    value: { string_value: "0.5" }
  },
  {
    key: "algo"
    value: { string_value: "ALGO_AUTO" }
  },
  {
    key: "storage_type"
    value: { string_value: "AUTO" }
  },
  {
    key: "blocks_per_sm"
    value: { string_value: "0" }
  }
]

dynamic_batching {
  preferred_batch_size: [1, 2, 4, 8, 16, 32, 64, 128, 1024, 8192]
  max_queue_delay_microseconds: 30000
}
"""

# docs/explainability.md's config, with its $NUM_FEATURES_PLUS_ONE and the others filled in.
SHAP_CONFIG = """backend: "fil"
max_batch_size: 32768
input [
 {
    name: "input__0"
    data_type: TYPE_FP32
    dims: [ $NUM_FEATURES ]
  }
]
output [
 {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 1 ]
 },
 {
    name: "treeshap_output"
    data_type: TYPE_FP32
    dims: [ $NUM_FEATURES_PLUS_ONE ]
  }
]
instance_group [{ kind: KIND_AUTO }]
parameters [
  {
    key: "model_type"
    value: { string_value: "$MODEL_TYPE" }
  },
  {
    key: "is_classifier"
    value: { string_value: "$IS_A_CLASSIFIER" }
  }
]

dynamic_batching {}
"""


# Triton's model_warmup, run by the worker before the instance is READY (as for every backend).
WARMUP = f"""model_warmup [{{ name: "random rows" batch_size: 64 inputs {{ key: "input__0" value: {{
  data_type: TYPE_FP32 dims: [ {FEATURES} ] random_data: true }} }} }}]
"""


def config(template: str, model_type: str, classifier: bool, features: int = FEATURES, **extra: str) -> str:
    text = (template.replace("$NUM_FEATURES_PLUS_ONE", str(features + 1))
            .replace("$NUM_FEATURES", str(features)).replace("$MODEL_TYPE", model_type)
            .replace("$IS_A_CLASSIFIER", "true" if classifier else "false"))
    for key, value in extra.items():
        text += f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
    return text


def classic_config(model_type: str, width: int, max_batch_size: int = 8192, **parameters: str) -> str:
    """The config qa/L0_e2e/generate_example_model.py writes (CPU instance)."""
    params = {"model_type": model_type, **parameters}
    lines = "".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return (f'backend: "fil"\nmax_batch_size: {max_batch_size}\n'
            f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
            f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }}]\n'
            f'instance_group [{{ kind: KIND_CPU }}]\n{lines}dynamic_batching {{ }}\n')


def data(rows: int, seed: int = 0, features: int = FEATURES) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, features), dtype=np.float32)


def _labels(x: np.ndarray, classes: int) -> np.ndarray:
    score = x[:, 0] + 0.5 * x[:, 1] - 0.3 * x[:, 2]
    return np.minimum((score * classes / 1.2).astype(np.int64), classes - 1).clip(0)


def _write(repo: str, name: str, filename: str, config_text: str) -> str:
    return os.path.join(write_model(repo, name, config_text), "1", filename)


def _xgb(objective: str, classes: int = 2, rounds: int = 6) -> xgb.Booster:
    x = data(400, seed=1)
    y = _labels(x, classes) if objective.startswith(("binary", "multi")) else x @ np.arange(FEATURES, dtype=np.float32)
    params: dict[str, object] = {"objective": objective, "max_depth": 3, "nthread": 1}
    if objective.startswith("multi"):
        params["num_class"] = classes
    return xgb.train(params, xgb.DMatrix(x, label=y), rounds)


def _lgb(objective: str, classes: int = 2) -> lgb.Booster:
    x = data(400, seed=2)
    y = _labels(x, classes) if objective != "regression" else x @ np.arange(FEATURES, dtype=np.float32)
    params: dict[str, object] = {"objective": objective, "num_leaves": 7, "verbose": -1, "num_threads": 1,
                                 "min_data_in_leaf": 5}
    if objective == "multiclass":
        params["num_class"] = classes
    return lgb.train(params, lgb.Dataset(x, label=y), 6)


def _save_ubj(booster: xgb.Booster, path: str) -> None:
    """UBJSON under FIL's legacy name ``xgboost.model``: what XGBoost >= 2 writes there (said
    explicitly, so XGBoost does not warn about the extension)."""
    with open(path, "wb") as f:
        f.write(booster.save_raw(raw_format="ubj"))


Predict = Callable[[np.ndarray], Any]


def _plain(predict: Predict) -> Reference:
    return lambda x: np.asarray(predict(x))


def _column(predict: Predict) -> Reference:
    return lambda x: np.asarray(predict(x))[:, None]


def _two_columns(predict: Predict) -> Reference:
    """A binary model's positive probability p as FIL's [1-p, p]."""
    def both(x: np.ndarray) -> np.ndarray:
        p = np.asarray(predict(x))
        return np.stack((1 - p, p), axis=1)

    return both


def _above(predict: Predict, threshold: float) -> Reference:
    return lambda x: (np.asarray(predict(x)) > threshold).astype(np.float32)[:, None]


def _argmax(predict: Predict) -> Reference:
    return lambda x: np.argmax(predict(x), axis=1).astype(np.float32)[:, None]


def _gtil_positive(model: Any, x: np.ndarray) -> np.ndarray:
    return np.asarray(treelite.gtil.predict(model, x))[:, 0, 0]


def _shap(booster: xgb.Booster, x: np.ndarray) -> np.ndarray:
    return np.asarray(booster.predict(xgb.DMatrix(x), pred_contribs=True))


def build(repo: str) -> dict[str, Reference]:
    """Every FIL test model in ``repo``; by name, what its framework predicts as output__0."""
    refs: dict[str, Reference] = {}

    # XGBoost binary classifier, UBJSON, probabilities for both classes (FIL's two columns).
    booster = _xgb("binary:logistic")
    booster.save_model(_write(repo, "xgb_ubj_proba", "xgboost.ubj", classic_config(
        "xgboost_ubj", 2, predict_proba="true", is_classifier="true")))
    refs["xgb_ubj_proba"] = _two_columns(booster.inplace_predict)

    # The README's quick start: XGBoost JSON classifier, its class (threshold 0.5).
    booster = _xgb("binary:logistic", rounds=5)
    booster.save_model(_write(repo, "xgb_json_readme", "xgboost.json", config(README_CONFIG, "xgboost_json", True)))
    refs["xgb_json_readme"] = _above(booster.inplace_predict, 0.5)

    # A 3-class softprob model in JSON: class index, and a threshold that does not apply to it.
    booster = _xgb("multi:softprob", classes=3)
    booster.save_model(_write(repo, "xgb_multi_class", "xgboost.json", classic_config(
        "xgboost_json", 1, is_classifier="true", threshold="0.9") + WARMUP))
    refs["xgb_multi_class"] = _argmax(booster.inplace_predict)

    # A regressor saved by today's XGBoost under the legacy default name (UBJSON inside), with
    # is_classifier unset: the model says it is a regressor. max_batch_size in the thousands.
    booster = _xgb("reg:squarederror")
    _save_ubj(booster, _write(repo, "xgb_regressor", "xgboost.model", classic_config("xgboost", 1)))
    refs["xgb_regressor"] = _column(booster.inplace_predict)

    # The legacy binary format (written by XGBoost 2.1; XGBoost >= 3.1 cannot read it): Treelite.
    shutil.copy(LEGACY_BINARY, _write(repo, "xgb_legacy_binary", "xgboost.model", config(
        README_CONFIG, "xgboost", True, features=LEGACY_FEATURES,
        predict_proba="true").replace("dims: [ 1 ]", "dims: [ 2 ]")))
    legacy = treelite.frontend.load_xgboost_model_legacy_binary(LEGACY_BINARY)
    refs["xgb_legacy_binary"] = _two_columns(partial(_gtil_positive, legacy))

    # The FIL README's older example, output_class and the removed GPU knobs included, on a
    # 500-feature model: both classes' probabilities.
    x500 = data(300, seed=3, features=500)
    old = xgb.train({"objective": "binary:logistic", "max_depth": 2, "nthread": 1},
                    xgb.DMatrix(x500, label=(x500[:, 7] > 0.5)), 3)
    _save_ubj(old, _write(repo, "fil", "xgboost.model", OLD_README_CONFIG))
    refs["fil"] = _two_columns(old.inplace_predict)

    # SHAP values beside the prediction (docs/explainability.md's config).
    booster = _xgb("reg:squarederror", rounds=4)
    booster.save_model(_write(repo, "xgb_shap", "xgboost.json", config(SHAP_CONFIG, "xgboost_json", False)))
    refs["xgb_shap"] = _column(booster.inplace_predict)
    refs["xgb_shap:treeshap_output"] = _plain(partial(_shap, booster))

    # LightGBM: a binary classifier's positive probability alone (one column), a 3-class model's
    # probabilities, a regressor (the README config with is_classifier false).
    model = _lgb("binary")
    model.save_model(_write(repo, "lgb_binary_proba", "model.txt", classic_config(
        "lightgbm", 1, predict_proba="true", is_classifier="true")))
    refs["lgb_binary_proba"] = _column(model.predict)
    model = _lgb("multiclass", classes=3)
    model.save_model(_write(repo, "lgb_multi_proba", "model.txt", classic_config(
        "lightgbm", 3, predict_proba="true", is_classifier="true")))
    refs["lgb_multi_proba"] = _plain(model.predict)
    model = _lgb("regression")
    model.save_model(_write(repo, "lgb_regressor", "model.txt", config(README_CONFIG, "lightgbm", False)))
    refs["lgb_regressor"] = _column(model.predict)

    # scikit-learn: a pickled random forest (Conveyor's model_type "sklearn"), and the same kind
    # of forest converted to a Treelite checkpoint, as Triton's docs have it done.
    x = data(300, seed=4)
    forest = RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0).fit(x, _labels(x, 3))
    with open(_write(repo, "sklearn_pickle", "model.pkl", classic_config(
            "sklearn", 3, predict_proba="true", is_classifier="true")), "wb") as f:
        pickle.dump(forest, f)
    refs["sklearn_pickle"] = _plain(forest.predict_proba)
    regressor = RandomForestRegressor(n_estimators=4, max_depth=4, random_state=0).fit(x, x.sum(axis=1))
    treelite.sklearn.import_model(regressor).serialize(_write(
        repo, "treelite_regressor", "checkpoint.tl", classic_config("treelite_checkpoint", 1, is_classifier="false")))
    refs["treelite_regressor"] = _column(regressor.predict)

    # Models that must not load, each for its own reason.
    _xgb("binary:logistic").save_model(_write(repo, "bad_features", "xgboost.json", classic_config(
        "xgboost_json", 1).replace(f"dims: [ {FEATURES} ]", "dims: [ 5 ]")))
    _save_ubj(_xgb("binary:logistic"), _write(repo, "bad_model_type", "xgboost.model", classic_config("catboost", 1)))
    return refs
