"""Triton's FIL backend's model files by ``model_type``: the router's repository scan finds a FIL model's
file by them (``router/repository/frameworks.py``), the worker's FIL backend reads the type
(``workers/backends/fil/settings.py``)."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text

# model_type -> the file Triton's FIL backend reads from the version directory.
MODEL_FILES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
    "sklearn": "model.pkl",
}
DEFAULT_MODEL_TYPE = "xgboost"  # Triton's default when the config names none


def default_model_file(config: mc.ModelConfig) -> str:
    """The file name FIL expects for the config's ``model_type`` (an unknown type: the default's,
    so the repository scan finds a file and the load reports the bad type)."""
    return MODEL_FILES.get(parameter_text(config, "model_type") or DEFAULT_MODEL_TYPE, "xgboost.model")
