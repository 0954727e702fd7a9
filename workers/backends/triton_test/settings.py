"""What the test backends read from a model's config: its ``parameters`` (string values, read as
Triton's C++ backends read them) and an instance's place among the model's instances."""

from __future__ import annotations

import re

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import invalid_arg

# std::stoi's grammar: leading blanks, a sign, digits; what follows the digits is ignored.
_STOI = re.compile(r"\s*([+-]?\d+)")
_INT32_MAX = 2**31 - 1


def parameter(config: mc.ModelConfig, key: str) -> str | None:
    """The ``string_value`` of parameter ``key`` (None: the config has no such parameter)."""
    return config.parameters[key].string_value if key in config.parameters else None


def stoi(text: str, key: str) -> int:
    """``text`` read as C++'s ``std::stoi`` reads it ("12ms" is 12), the backends' reading of
    their numeric parameters; what it cannot read fails the load (Triton's backend would throw)."""
    found = _STOI.match(text)
    if found is None or abs(int(found.group(1))) > _INT32_MAX:
        raise invalid_arg(f"parameter '{key}' must be an integer, got '{text}'")
    return int(found.group(1))


def int_parameter(config: mc.ModelConfig, key: str, default: int = 0) -> int:
    value = parameter(config, key)
    return default if value is None else stoi(value, key)


def instance_ordinal(config: mc.ModelConfig, instance_name: str) -> int:
    """The instance's number among its model's instances, 0 first, as Triton counts them when it
    creates them in the config's order (the ``instance_group`` names ``<group>_<i>``, the group
    named by ``name`` or ``<model>_<group index>``); a model without ``instance_group`` (one
    instance per worker, ``<model>_<i>``): its ``i``."""
    names: list[str] = []
    for g, group in enumerate(config.instance_group):
        prefix = group.name or f"{config.name}_{g}"
        names += [f"{prefix}_{i}" for i in range(group.count if group.count > 0 else 1)]
    if instance_name in names:
        return names.index(instance_name)
    tail = instance_name.rpartition("_")[2]
    return int(tail) if tail.isdigit() else 0


def need(condition: bool, message: str) -> None:
    """A config check of a backend: INVALID_ARG with Triton's words when it fails."""
    if not condition:
        raise invalid_arg(message)


def shape_text(dims: list[int]) -> str:
    """A shape as Triton's ``ShapeToString`` writes it: ``[1,-1]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def type_name(data_type: int) -> str:
    """A config datatype as Triton's messages name it: ``TYPE_INT32``."""
    return mc.DataType.Name(data_type)

