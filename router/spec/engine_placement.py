"""Engine placement's parameter (``ENGINE_PLACEMENT``, ``router/scheduling/engine_placement.py``) and
its check at load."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.config_parameters import parameter_text

PARAMETER = "ENGINE_PLACEMENT"
PREFIX, ROUND_ROBIN = "prefix", "round_robin"
CHOICES = (PREFIX, ROUND_ROBIN)


def placement_problem(config: mc.ModelConfig) -> str:
    """Why the config's ``ENGINE_PLACEMENT`` cannot be used (the model does not load), or ''."""
    value = parameter_text(config, PARAMETER)
    if value and value not in CHOICES:
        return f"parameter '{PARAMETER}' must be one of {', '.join(repr(c) for c in CHOICES)}, got '{value}'"
    return ""
