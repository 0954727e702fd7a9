"""What a backend is: something that loads one model instance and runs batches."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from conveyor.proto import model_config_pb2 as mc


class Backend(Protocol):
    """One loaded model instance. ``execute`` may be called from a worker thread,
    one call at a time per instance."""

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run one (possibly batched) call; BYTES tensors are object arrays of bytes."""
        ...

    def close(self) -> None: ...


class BackendFactory(Protocol):
    def __call__(self, path: str, config: mc.ModelConfig, device: str) -> Backend: ...
