"""Tree models as their own frameworks load and run them, one class per framework.

Each ``Forest`` answers ``scores(x)`` for a float32 batch ``x`` of shape (rows, features), in the
framework's own terms: a regressor's values (rows,), a binary classifier's positive-class
probability (rows,), or a multi-class classifier's probabilities (rows, classes). The backend
(``backend.py``) turns these into FIL's outputs. ``contributions(x)`` gives the SHAP values FIL
returns as ``treeshap_output`` where the framework computes them (XGBoost, LightGBM).

A framework is imported only by the loader that needs it: a worker serving XGBoost models never
imports LightGBM, and a framework that is not installed fails that model's load with the extra
to install.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any, Protocol

import numpy as np

from conveyor.proto.errors import ConveyorError, unavailable
from conveyor.proto.repository_files import check_regular, open_binary, unreadable
from conveyor.workers.backends.fil.xgboost_call import MARGIN, VALUE, dense_predict

INSTALL = "pip install 'conveyor[fil]'"


class Forest(Protocol):
    num_features: int
    classifier: bool  # what the model file says it is
    num_classes: int  # classifiers: 2 for binary, else the class count; regressors: 1

    def scores(self, x: np.ndarray) -> np.ndarray: ...

    def contributions(self, x: np.ndarray) -> np.ndarray | None:
        """SHAP values, (rows, features + 1) or (rows, classes, features + 1); None: not offered."""
        ...


def _import(module: str, package: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise unavailable(f"{package} is not installed in the worker's environment ({INSTALL}): {exc}") from None


def _cannot_read(what: str, path: str, exc: BaseException) -> ConveyorError:
    return unavailable(f"{what} could not load '{path}': {' '.join(str(exc).split())[:500]}")


def _softmax(margins: np.ndarray) -> np.ndarray:
    shifted = margins - margins.max(axis=1, keepdims=True)
    np.exp(shifted, out=shifted)
    shifted /= shifted.sum(axis=1, keepdims=True)
    return shifted


class XGBoostForest:
    """An XGBoost ``Booster`` (legacy binary, JSON or UBJSON: its loader tells them apart),
    predicting with ``inplace_predict`` on the float32 batch as it is (no DMatrix)."""

    _MULTI = ("multi:softprob", "multi:softmax")

    def __init__(self, path: str, threads: int) -> None:
        xgb = _import("xgboost", "XGBoost")
        self._xgb = xgb
        try:
            self.booster = xgb.Booster()
            self.booster.load_model(path)
        except Exception as exc:
            raise _cannot_read("XGBoost", path, exc) from None
        self.booster.set_param({"nthread": threads})  # after the load, which may bring the trainer's
        learner = json.loads(self.booster.save_config())["learner"]
        objective = learner["objective"]["name"]
        self.num_features = self.booster.num_features()
        classes = int(float(learner["learner_model_param"].get("num_class", "0")))
        self.classifier = objective in self._MULTI or objective.startswith("binary:")
        self.num_classes = max(classes, 2) if self.classifier else 1
        # multi:softmax predicts class ids: FIL returns probabilities, so take the margins and
        # apply the softmax (what FIL does to such a model for predict_proba).
        self._margins = objective == "multi:softmax"
        self._direct = dense_predict(xgb, self.booster, MARGIN if self._margins else VALUE)

    def scores(self, x: np.ndarray) -> np.ndarray:
        direct = self._direct
        if direct is not None and x.dtype == np.float32 and x.flags.c_contiguous:
            result: np.ndarray = direct(x)
        else:
            result = self.booster.inplace_predict(x, predict_type="margin" if self._margins else "value")
        return _softmax(np.asarray(result, dtype=np.float32)) if self._margins else result

    def contributions(self, x: np.ndarray) -> np.ndarray | None:
        result: np.ndarray = self.booster.predict(self._xgb.DMatrix(x), pred_contribs=True)
        return result


class LightGBMForest:
    """A LightGBM ``Booster`` from its text model file, predicting on the float32 batch."""

    _CLASSIFIERS = ("binary", "multiclass", "multiclassova")

    def __init__(self, path: str, threads: int) -> None:
        lgb = _import("lightgbm", "LightGBM")
        try:
            self.booster = lgb.Booster(model_file=path)
        except Exception as exc:
            raise _cannot_read("LightGBM", path, exc) from None
        self.threads = threads
        header = _lightgbm_header(path)
        objective = header.get("objective", "regression").split(" ", 1)[0]
        self.num_features = self.booster.num_feature()
        self.classifier = objective in self._CLASSIFIERS
        classes = int(header.get("num_class", "1"))
        self.num_classes = max(classes, 2) if self.classifier else 1

    def scores(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self.booster.predict(x, num_threads=self.threads)
        return result

    def contributions(self, x: np.ndarray) -> np.ndarray | None:
        values: np.ndarray = self.booster.predict(x, pred_contrib=True, num_threads=self.threads)
        if self.num_classes > 2:  # LightGBM puts the classes side by side: (rows, classes * (features + 1))
            values = values.reshape(values.shape[0], self.num_classes, self.num_features + 1)
        return values


def _lightgbm_header(path: str) -> dict[str, str]:
    """The ``key=value`` lines before the first tree of a LightGBM text model (objective, num_class)."""
    header: dict[str, str] = {}
    with io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("Tree="):
                break
            key, sep, value = line.strip().partition("=")
            if sep:
                header[key] = value
    return header


class SklearnForest:
    """A pickled scikit-learn estimator (``joblib.dump`` or ``pickle.dump``): ``predict_proba``
    for classifiers, ``predict`` otherwise. Unpickling runs code from the file: a model
    repository is trusted as its ``model.py`` files are."""

    def __init__(self, path: str, threads: int) -> None:
        joblib = _import("joblib", "scikit-learn")
        _import("sklearn", "scikit-learn")
        from sklearn.base import is_classifier
        try:
            self.model = joblib.load(path)
        except Exception as exc:
            raise _cannot_read("scikit-learn (joblib.load)", path, exc) from None
        if not hasattr(self.model, "predict"):
            raise unavailable(f"'{path}' holds a {type(self.model).__name__}, not an estimator with predict()")
        if "n_jobs" in getattr(self.model, "get_params", dict)():
            self.model.set_params(n_jobs=threads)
        self.classifier = bool(is_classifier(self.model))
        self.num_features = int(getattr(self.model, "n_features_in_", -1))
        self.num_classes = len(self.model.classes_) if self.classifier else 1
        # A model fitted on a DataFrame warns on every numpy batch that it has no column names.
        warnings.filterwarnings("ignore", message="X does not have valid feature names")
        self._predict = self.model.predict_proba if self.classifier else self.model.predict

    def scores(self, x: np.ndarray) -> np.ndarray:
        result: np.ndarray = self._predict(x)
        return result

    def contributions(self, x: np.ndarray) -> np.ndarray | None:
        return None


class TreeliteForest:
    """A Treelite model, predicted with Treelite's own CPU predictor, GTIL, as Triton's FIL backend
    does on a CPU: a checkpoint (``checkpoint.tl``, e.g. an sklearn forest converted as Triton's
    docs say), or an XGBoost model in the legacy binary format, which XGBoost itself no longer
    reads since 3.1 (Treelite still does)."""

    # Treelite's TaskType values that are classifiers: kBinaryClf, kMultiClf.
    _CLASSIFIER_TASKS = (0, 2)

    def __init__(self, path: str, threads: int, legacy_xgboost: bool = False) -> None:
        what = "an XGBoost model in the legacy binary format" if legacy_xgboost else "model_type 'treelite_checkpoint'"
        try:
            import treelite
        except ImportError as exc:
            raise unavailable(f"{what} needs Treelite, which is not installed in the worker's environment "
                              f"({INSTALL}, or pip install treelite): {exc}") from None
        self._gtil = treelite.gtil
        try:
            if legacy_xgboost:
                self.model = treelite.frontend.load_xgboost_model_legacy_binary(path)
            else:
                self.model = treelite.Model.deserialize(path)
        except Exception as exc:
            raise _cannot_read("Treelite", path, exc) from None
        self.threads = threads
        header = self.model.get_header_accessor()
        self.num_features = int(header.get_field("num_feature")[0])
        self.classifier = int(header.get_field("task_type")[0]) in self._CLASSIFIER_TASKS
        classes = int(max(header.get_field("num_class")))
        self.num_classes = max(classes, 2) if self.classifier else 1

    def scores(self, x: np.ndarray) -> np.ndarray:
        # GTIL answers (rows, targets, classes); FIL serves single-target models.
        result: np.ndarray = self._gtil.predict(self.model, x, nthread=self.threads)[:, 0, :]
        return result[:, 0] if result.shape[1] == 1 else result

    def contributions(self, x: np.ndarray) -> np.ndarray | None:
        return None


def load_forest(model_type: str, path: str, threads: int) -> Forest:
    try:  # each framework opens it by name again: a name swapped after this check is not seen
        check_regular(path)
    except OSError as exc:  # a FIFO would hold the instance's thread for ever (proto/repository_files.py)
        raise unavailable(unreadable(path, exc)) from None
    if model_type == "xgboost" and not _json_or_ubjson(path):
        return TreeliteForest(path, threads, legacy_xgboost=True)
    if model_type.startswith("xgboost"):
        return XGBoostForest(path, threads)
    if model_type == "lightgbm":
        return LightGBMForest(path, threads)
    if model_type == "sklearn":
        return SklearnForest(path, threads)
    return TreeliteForest(path, threads)


def _json_or_ubjson(path: str) -> bool:
    """Whether an XGBoost model file is JSON or UBJSON (both open an object, as XGBoost's own loader
    tells them apart), rather than the legacy binary format. XGBoost >= 2 saves ``xgboost.model``
    as UBJSON, so Triton's default file name holds either."""
    try:
        with open_binary(path) as f:
            return f.read(1) == b"{"
    except OSError as exc:
        raise unavailable(f"unable to read '{path}': {exc.strerror}") from None
