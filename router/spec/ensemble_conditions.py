"""Conditional ensemble steps, a Conveyor extension (docs/ENSEMBLES.md): read from the config with its
plan (``ensemble_plan.py``), evaluated by the scheduler (``router/ensembles/scheduler.py``).

A condition is ``"<tensor> <op> <value>"``: an ensemble tensor, one of
``== != < <= > >=``, and a number or ``true``/``false``. It holds when it holds
for every element of the tensor, which must be numeric or BOOL and small
(``MAX_ELEMENTS``): the router reads those few values where the tensor lies,
and never reads any other tensor byte.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from conveyor.proto import messages as m
from conveyor.proto.datatypes import element_count, numpy_dtype
from conveyor.proto.errors import ConveyorError, invalid_arg

if TYPE_CHECKING:
    from conveyor.shm.regions import RegionCache

MAX_ELEMENTS = 64

_OPS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}


@dataclass(frozen=True, slots=True)
class Condition:
    tensor: str
    op: str
    value: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Condition:
        parts = text.split()
        if len(parts) != 3 or parts[1] not in _OPS:
            raise invalid_arg(f"condition '{text}': expected '<tensor> <op> <value>' with op one of {' '.join(_OPS)}")
        tensor, op, raw = parts
        if raw.lower() in ("true", "false"):
            return cls(tensor, op, float(raw.lower() == "true"), text)
        try:
            return cls(tensor, op, float(raw), text)
        except ValueError:
            raise invalid_arg(f"condition '{text}': '{raw}' is not a number, true or false") from None

    def holds(self, ref: m.TensorRef, regions: RegionCache) -> bool:
        """Evaluate on the tensor ``ref`` (the router's one look at tensor bytes: a few scalars)."""
        if ref.region.startswith(m.CLIENT_REGION_PREFIX):
            raise invalid_arg(f"condition '{self.text}': its tensor lies in a client's shared memory region")
        if ref.datatype == "BYTES":
            raise invalid_arg(f"condition '{self.text}': '{self.tensor}' is a BYTES tensor")
        count = element_count(ref.shape)
        if count > MAX_ELEMENTS:
            raise invalid_arg(
                f"condition '{self.text}': '{self.tensor}' has {count} elements; a condition reads at most "
                f"{MAX_ELEMENTS}"
            )
        try:
            values = regions.view(ref.region, ref.offset, ref.nbytes).view(numpy_dtype(ref.datatype))
        except ConveyorError as exc:
            raise invalid_arg(f"condition '{self.text}': {exc.message}") from None
        return bool(_OPS[self.op](values, self.value).all())
