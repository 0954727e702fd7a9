"""Adaptive batching's parameter (``router/scheduling/adaptive.py``) and its check at load."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc

LATENCY_TARGET_PARAMETER = "conveyor.latency_target_us"


def adaptive_problem(config: mc.ModelConfig) -> str:
    """Why the model's latency target cannot be used, or ''."""
    param = config.parameters.get(LATENCY_TARGET_PARAMETER)
    if param is None:
        return ""
    value = param.string_value.strip()
    if not value.isdigit() or int(value) <= 0:
        return f"parameter '{LATENCY_TARGET_PARAMETER}' must be a positive number of microseconds, got '{value}'"
    if not config.HasField("dynamic_batching"):
        return f"parameter '{LATENCY_TARGET_PARAMETER}' needs dynamic_batching (and max_batch_size > 0)"
    return ""
