"""Triton's FIL backend parameters (``parameters { key: "model_type" ... }``), read once at load.

As Triton's FIL backend reads them (its ``shared_state.h`` and docs/model_config.md):

* ``model_type``: ``xgboost`` (the default: XGBoost's legacy binary), ``xgboost_json``,
  ``xgboost_ubj``, ``lightgbm``, ``treelite_checkpoint``; and, a Conveyor addition,
  ``sklearn`` (a pickled scikit-learn estimator, ``model.pkl``), which Triton only serves
  after converting it to a Treelite checkpoint;
* ``is_classifier`` (``output_class`` before Triton 25.09, still honoured as Triton does);
  unset, the model file says (an XGBoost or LightGBM objective, an sklearn estimator's kind);
* ``predict_proba``, ``threshold`` (binary classifiers, default 0.5);
* ``cpu_nthread`` (Triton: -1, every core); ``threads`` is read as its alias.

The GPU-only and FIL-internal tuning knobs (``layout``, ``chunk_size``, ``transfer_threshold``,
``use_experimental_optimizations``, ``xgboost_allow_unknown_field``) and the ones Triton removed
in 25.09 (``algo``, ``storage_type``, ``blocks_per_sm``, ``threads_per_tree``) are checked where
Triton documents their values and otherwise ignored: the frameworks' own predictors have no
such setting, and none of them changes a prediction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_flag, parameter_text
from conveyor.proto.errors import invalid_arg
from conveyor.proto.fil_model_files import DEFAULT_MODEL_TYPE, MODEL_FILES
from conveyor.workers.backends import cpu_threads

log = logging.getLogger(__name__)


# Documented values of FIL's tuning parameters, checked so that a typo shows at load.
_CHOICES = {
    "layout": ("depth_first", "breadth_first", "layered"),
    "algo": ("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"),
    "storage_type": ("AUTO", "DENSE", "SPARSE", "SPARSE8"),
}
_IGNORED_FLAGS = ("use_experimental_optimizations", "xgboost_allow_unknown_field")
_IGNORED_COUNTS = ("chunk_size", "transfer_threshold", "blocks_per_sm", "threads_per_tree")


def model_type(config: mc.ModelConfig) -> str:
    """The config's serialization format; INVALID_ARG in Triton's words for an unknown one."""
    value = parameter_text(config, "model_type") or DEFAULT_MODEL_TYPE
    if value not in MODEL_FILES:
        raise invalid_arg(f"{value} not recognized as a valid serialization format (the fil backend reads "
                          f"{', '.join(MODEL_FILES)})")
    return value


def _int(config: mc.ModelConfig, key: str) -> int | None:
    text = parameter_text(config, key)
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise invalid_arg(f"parameter '{key}' must be an integer, not '{text}'") from None


def _threads(config: mc.ModelConfig) -> int:
    """Threads per prediction call: ``cpu_nthread`` (or ``threads``) as given, -1 (or 0) meaning
    every usable core, as in Triton; unset (Triton: every core, for every instance), Conveyor's
    CPU default (``cpu_threads``)."""
    given, alias = _int(config, "cpu_nthread"), _int(config, "threads")
    if given is not None and alias is not None and given != alias:
        raise invalid_arg(f"parameters 'cpu_nthread' ({given}) and 'threads' ({alias}) name the same "
                          f"thread count and disagree")
    value = given if given is not None else alias
    if value is not None:
        return cpu_threads.usable_cpus() if value <= 0 else value
    return cpu_threads.default_threads(config)


def _classifier(config: mc.ModelConfig) -> bool | None:
    """``is_classifier``, or Triton's older ``output_class``, which wins when both are set (as in
    Triton 25.09+, which maps the old name onto the new one)."""
    old = parameter_flag(config, "output_class")
    return old if old is not None else parameter_flag(config, "is_classifier")


def _threshold(config: mc.ModelConfig) -> float:
    text = parameter_text(config, "threshold")
    if not text:
        return 0.5
    try:
        return float(text)
    except ValueError:
        raise invalid_arg(f"parameter 'threshold' must be a number, not '{text}'") from None


def _check_ignored(config: mc.ModelConfig) -> None:
    for key, choices in _CHOICES.items():
        text = parameter_text(config, key)
        if text and text not in choices:
            raise invalid_arg(f"parameter '{key}' must be one of {', '.join(choices)}, not '{text}'")
    for key in _IGNORED_FLAGS:
        parameter_flag(config, key)
    for key in _IGNORED_COUNTS:
        _int(config, key)
    named = [k for k in (*_CHOICES, *_IGNORED_FLAGS, *_IGNORED_COUNTS) if parameter_text(config, k)]
    if named:
        log.info("model '%s': FIL tuning parameters %s have no effect on the frameworks' CPU predictors",
                 config.name, ", ".join(named))


@dataclass(frozen=True, slots=True)
class FilSettings:
    model_type: str = DEFAULT_MODEL_TYPE
    is_classifier: bool | None = None  # None: as the model file says
    predict_proba: bool = False
    threshold: float = 0.5
    threads: int = 1

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> FilSettings:
        _check_ignored(config)
        return cls(
            model_type=model_type(config),
            is_classifier=_classifier(config),
            predict_proba=bool(parameter_flag(config, "predict_proba")),
            threshold=_threshold(config),
            threads=_threads(config),
        )
