"""XGBoost's dense prediction called through its C API with the call's settings encoded once.

``Booster.inplace_predict`` spends about 200 µs of Python a call before XGBoost's own work (it
builds a class, checks a dozen input kinds, JSON-encodes its settings and the array's interface):
on a 100-tree model and one row that is two thirds of the call, and enough to push a served
request's batch past the worker's main-thread shortcut (workers/inline.py). ``DensePredict`` calls
the same C function, ``XGBoosterPredictFromDense`` (stable since XGBoost 1.4), with the settings
encoded at load and only the array's address formatted per call. Where XGBoost lacks it, or the
call fails, the caller keeps ``inplace_predict``.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np

# XGBoost's PredictionType: 0 the transformed value (probability, regression value), 1 the margin.
VALUE, MARGIN = 0, 1


class DensePredict:
    """``inplace_predict(x, predict_type=...)`` for a C-contiguous float32 ``x`` (rows, features)."""

    __slots__ = ("_call", "_config", "_dims", "_handle", "_preds", "_shape")

    def __init__(self, xgb: Any, booster: Any, predict_type: int) -> None:
        lib = xgb.core._LIB  # the loaded libxgboost; AttributeError where a version hides it
        self._call = lib.XGBoosterPredictFromDense
        self._handle = booster.handle
        # As inplace_predict encodes them: missing values are NaN, every tree, no strict shape.
        self._config = json.dumps({
            "type": predict_type, "training": False, "iteration_begin": 0, "iteration_end": 0,
            "missing": float("nan"), "strict_shape": False, "cache_id": 0,
        }).encode()
        self._shape = ctypes.POINTER(ctypes.c_uint64)()
        self._dims = ctypes.c_uint64()
        self._preds = ctypes.POINTER(ctypes.c_float)()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows, features = x.shape
        interface = b'{"data":[%d,true],"shape":[%d,%d],"typestr":"<f4","version":3}' % (
            x.ctypes.data, rows, features)
        if self._call(self._handle, interface, self._config, None, ctypes.byref(self._shape),
                      ctypes.byref(self._dims), ctypes.byref(self._preds)) != 0:
            raise RuntimeError("XGBoosterPredictFromDense failed")
        shape = tuple(self._shape[i] for i in range(self._dims.value))
        # XGBoost owns the buffer until this thread's next prediction: copy it out.
        return np.ctypeslib.as_array(self._preds, shape).copy()


def dense_predict(xgb: Any, booster: Any, predict_type: int) -> DensePredict | None:
    """The direct call, or None where this XGBoost does not offer it (then ``inplace_predict``)."""
    try:
        return DensePredict(xgb, booster, predict_type)
    except (AttributeError, TypeError):
        return None
