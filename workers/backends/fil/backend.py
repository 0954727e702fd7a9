"""Tree models under Triton's FIL backend contract (``backend: "fil"``), run by the
frameworks' own CPU predictors (``forests.py``) instead of RAPIDS FIL.

I/O as FIL has it: one input ``input__0`` [features] FP32; ``output__0``: for a classifier
with ``predict_proba`` each class's probability ([classes]; a binary model gives [1-p, p], or p
alone where the config declares one column, as FIL's CPU path does), without it the class
index (a binary model's positive probability against ``threshold``, else the most probable
class), for a regressor the predicted value; ``treeshap_output`` (optional): SHAP values
[features + 1] ([classes, features + 1] for multi-class), where the framework computes them.

Everything that depends only on the config and the model (which outputs, how scores become
``output__0``) is decided here at load, so a call is the framework's predict plus at most one
vectorised numpy step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import internal, unavailable
from conveyor.workers.backends.fil.forests import Forest, load_forest
from conveyor.workers.backends.fil.settings import FilSettings

log = logging.getLogger(__name__)

INPUT, OUTPUT, SHAP = "input__0", "output__0", "treeshap_output"

Post = Callable[[np.ndarray], np.ndarray]


def _dims(tensor: mc.ModelInput | mc.ModelOutput) -> list[int]:
    return list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)


def _width(tensor: mc.ModelOutput, batched: bool) -> int:
    """The last dimension the config declares for one row (-1: any)."""
    dims = _dims(tensor)
    if not batched:
        dims = dims[1:]  # without max_batch_size the rows are the first declared dimension
    return dims[-1] if dims else 1


class FilBackend:
    # Short batches may run on the worker's main thread (workers/inline.py): nothing here is tied
    # to the thread that loaded it.
    runs_on_any_thread = True

    def __init__(self, path: str, config: mc.ModelConfig, device: str) -> None:
        self.settings = settings = FilSettings.from_config(config)
        if device.startswith("cuda"):
            log.warning("model '%s': the fil backend predicts on the CPU (the frameworks' own predictors); "
                        "the instance placed on %s runs there", config.name, device)
        self.forest: Forest = load_forest(settings.model_type, path, settings.threads)
        self.classifier = self.forest.classifier if settings.is_classifier is None else settings.is_classifier
        if self.classifier and not self.forest.classifier:
            raise unavailable(f"the config says the model is a classifier (is_classifier/output_class) but "
                              f"'{path}' is a regressor")
        batched = config.max_batch_size > 0
        self._check_input(config, batched)
        outputs = {o.name: o for o in config.output}
        unknown = sorted(set(outputs) - {OUTPUT, SHAP})
        if OUTPUT not in outputs or unknown:
            raise unavailable(f"the fil backend answers '{OUTPUT}' (and optionally '{SHAP}'); the config declares "
                              f"{', '.join(repr(n) for n in outputs)}")
        self._post = self._output_rule(_width(outputs[OUTPUT], batched))
        if SHAP in outputs and self.forest.contributions(np.zeros((1, self.forest.num_features), np.float32)) is None:
            raise unavailable(f"'{SHAP}' (SHAP values) is computed for XGBoost and LightGBM models, not for "
                              f"model_type '{settings.model_type}'")
        log.info("model '%s': %s %s from %s, %d thread(s) per call", config.name, settings.model_type,
                 "classifier" if self.classifier else "regressor", path, settings.threads)

    def _check_input(self, config: mc.ModelConfig, batched: bool) -> None:
        if [i.name for i in config.input] != [INPUT]:
            raise unavailable(f"the fil backend takes one input, '{INPUT}' (FP32, [features]); the config declares "
                              f"{', '.join(repr(i.name) for i in config.input)}")
        tensor = config.input[0]
        if tensor.data_type != mc.TYPE_FP32:
            raise unavailable(f"input '{INPUT}' must be TYPE_FP32 (the fil backend predicts in 32-bit floats), "
                              f"not {mc.DataType.Name(tensor.data_type)}")
        dims = _dims(tensor)
        features = dims[-1] if dims else 0
        if len(dims) != (1 if batched else 2) or (features != -1 and features != self.forest.num_features
                                                  and self.forest.num_features > 0):
            raise unavailable(f"input '{INPUT}' must have dims [features] ([rows, features] without max_batch_size): "
                              f"the model takes {self.forest.num_features} features, the config declares {dims}")
        self.num_features = features if features > 0 else self.forest.num_features

    def _output_rule(self, width: int) -> Post:
        """How the forest's scores become output__0, for the width the config declares."""
        forest, settings = self.forest, self.settings
        if not self.classifier:
            return _as_column
        classes = forest.num_classes
        if settings.predict_proba:
            if classes == 2 and width in (1, 2):
                return _positive_column if width == 1 else _both_classes
            if width in (classes, -1):
                return _probabilities
            raise unavailable(f"output '{OUTPUT}' declares {width} values per row; with predict_proba this "
                              f"{classes}-class model gives {classes} (a binary one 2, or 1: the positive class)")
        if width not in (1, -1):
            raise unavailable(f"output '{OUTPUT}' declares {width} values per row; without predict_proba a "
                              f"classifier gives its class index: dims [ 1 ]")
        if classes == 2:
            threshold = np.float32(settings.threshold)
            return lambda scores: _above(scores, threshold)
        return _argmax

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        x = inputs[INPUT]
        if x.ndim != 2:
            x = x.reshape(-1, self.num_features)
        try:
            result = {OUTPUT: self._post(self.forest.scores(x))} if OUTPUT in outputs else {}
            if SHAP in outputs:
                values = self.forest.contributions(x)
                assert values is not None  # checked at load
                result[SHAP] = values
        except Exception as exc:
            raise internal(f"{self.settings.model_type} prediction failed: {exc}") from None
        return result

    def close(self) -> None:
        del self.forest


def _as_column(scores: np.ndarray) -> np.ndarray:
    return scores.reshape(scores.shape[0], -1)


def _positive_column(scores: np.ndarray) -> np.ndarray:
    return (scores if scores.ndim == 1 else scores[:, 1]).reshape(-1, 1)


def _both_classes(scores: np.ndarray) -> np.ndarray:
    if scores.ndim == 2:
        return scores
    return np.stack((1 - scores, scores), axis=1)


def _probabilities(scores: np.ndarray) -> np.ndarray:
    return scores if scores.ndim == 2 else np.stack((1 - scores, scores), axis=1)


def _above(scores: np.ndarray, threshold: np.float32) -> np.ndarray:
    positive = scores if scores.ndim == 1 else scores[:, 1]
    return (positive > threshold).astype(np.float32).reshape(-1, 1)


def _argmax(scores: np.ndarray) -> np.ndarray:
    return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
