"""What a BLS request may ask for beyond its tensors: Triton's ``PreferredMemory``
(with the ``MemoryType`` values) and ``InferenceTrace``.

Both are accepted so that models written for Triton run; neither changes what
Conveyor does: BLS outputs are CPU numpy arrays, and models get no trace context.
"""

from __future__ import annotations

import enum


class MemoryType(enum.IntEnum):
    TRITONSERVER_MEMORY_GPU = 0  # Triton's numbering
    TRITONSERVER_MEMORY_CPU = 1


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """``PreferredMemory(preferred_memory_type, preferred_device_id=0)``: where a BLS
    call would like its outputs. Conveyor hands them back in CPU memory."""

    def __init__(self, preferred_memory_type: MemoryType | int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = MemoryType(preferred_memory_type)
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace as Triton hands it to models; Conveyor has no context to give."""

    def get_context(self) -> str | None:
        return None
