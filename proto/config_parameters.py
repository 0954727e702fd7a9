"""Reading a model config's ``parameters { key: ... value { string_value: ... } }``
as backends do, with Triton's rules for booleans (its ``ParseBoolValue``:
true/on/1, false/off/0, any case). A bad value is INVALID_ARG: the model does
not load, and the reason names the parameter."""

from __future__ import annotations

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg

_TRUE = frozenset({"true", "1", "on"})
_FALSE = frozenset({"false", "0", "off"})


def parse_bool(value: str, what: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise invalid_arg(f"{what} must be true or false (1 or 0), not '{value}'")


def parameter_text(config: mc.ModelConfig, key: str) -> str:
    """A parameter's string value, stripped; "" when the config does not set it."""
    p = config.parameters.get(key)
    return p.string_value.strip() if p is not None else ""


def parameter_flag(config: mc.ModelConfig, key: str) -> bool | None:
    """A boolean parameter, or None when the config does not set it."""
    text = parameter_text(config, key)
    return parse_bool(text, f"parameter '{key}'") if text else None


def parameter_count(config: mc.ModelConfig, key: str, minimum: int = 0) -> int | None:
    """A whole-number parameter of at least ``minimum``, or None when the config does not set it."""
    text = parameter_text(config, key)
    if not text:
        return None
    if not text.isdigit() or int(text) < minimum:
        kind = "a non-negative integer" if minimum <= 0 else f"an integer of at least {minimum}"
        raise invalid_arg(f"parameter '{key}' must be {kind}, not '{text}'")
    return int(text)
