"""The ``shared_memory_*`` tensor parameters, read the same way for HTTP and gRPC.

A tensor placed in a client-registered region carries ``shared_memory_region``
(the registered name), ``shared_memory_byte_size`` (required) and
``shared_memory_offset`` (default 0) instead of data. The ingress only checks
their form; the router checks them against the registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.proto.errors import invalid_arg

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
_KEYS = (REGION, BYTE_SIZE, OFFSET)


@dataclass(slots=True, frozen=True)
class ShmPlacement:
    region: str
    offset: int
    byte_size: int


def take_placement(params: dict[str, Any], kind: str, name: str) -> tuple[ShmPlacement | None, dict[str, Any]]:
    """The tensor's placement (None if it has no ``shared_memory_region``) and its
    other parameters."""
    if REGION not in params:
        return None, params
    region = params[REGION]
    if not isinstance(region, str) or not region:
        raise invalid_arg(f"Unable to parse '{REGION}' of {kind} '{name}': expected a region name")
    size = params.get(BYTE_SIZE)
    if size is None:
        raise invalid_arg(f"{kind} '{name}' names '{REGION}' but no '{BYTE_SIZE}'")
    offset = params.get(OFFSET, 0)
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise invalid_arg(f"Unable to parse '{key}' of {kind} '{name}': expected a non-negative integer")
    rest = {k: v for k, v in params.items() if k not in _KEYS}
    return ShmPlacement(region, offset, size), rest
