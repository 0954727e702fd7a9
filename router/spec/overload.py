"""The overload limits' parameters (``router/scheduling/overload.py``) and their check at load."""

from __future__ import annotations

import math

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text

MAX_WAITING_PARAMETER = "MAX_WAITING_REQUESTS"
MAX_KV_PARAMETER = "MAX_KV_CACHE_USAGE"


def overload_problem(config: mc.ModelConfig) -> str:
    """Why the config's limits cannot be used (the model does not load), or ''."""
    waiting = parameter_text(config, MAX_WAITING_PARAMETER)
    if waiting and (not (waiting.isascii() and waiting.isdigit()) or int(waiting) <= 0):
        return (f"parameter '{MAX_WAITING_PARAMETER}' must be a positive number of requests, got '{waiting}' "
                "(leave it unset for no limit)")
    kv = parameter_text(config, MAX_KV_PARAMETER)
    if kv:
        try:
            value = float(kv)
        except ValueError:
            value = math.nan
        if not 0.0 < value <= 1.0:  # nan fails too
            return (f"parameter '{MAX_KV_PARAMETER}' must be a fraction in (0, 1], got '{kv}' "
                    "(leave it unset for no limit)")
    return ""
