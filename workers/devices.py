"""The GPUs a worker reports, in the numbering ``instance_group { gpus: [...] }`` uses.

A worker started for one GPU (``conveyor-worker@gpu3``: ``CUDA_VISIBLE_DEVICES=3``)
sees that GPU as CUDA device 0. Triton configs name physical GPUs (``gpus: [3]``),
so the worker reports ``cuda:3`` to the router and turns the ``cuda:3`` of a
``LoadModel`` back into its own ``cuda:0`` before a backend sees it. With
``CUDA_VISIBLE_DEVICES`` unset, or naming GPUs by UUID (``GPU-...``, ``MIG-...``),
the numbering is left as CUDA gives it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping


def local_gpu_count() -> int:
    """CUDA devices this process sees (0 without cupy or a GPU)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


def gpu_backends(local_count: int) -> list[str]:
    """The backends that can run on this worker's GPUs, for the router's default (KIND_AUTO) placement:
    a GPU host with a CPU build of onnxruntime keeps its ONNX models on the CPU instead of leaving them
    unavailable. torch and TensorRT are taken as GPU builds where there is a GPU (importing torch to ask
    would cost every worker's start seconds); a CPU torch there fails the model with its reason."""
    if local_count == 0:
        return []
    found = [name for name, module in (("pytorch", "torch"), ("tensorrt", "tensorrt"))
             if importlib.util.find_spec(module) is not None]
    try:
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            found.append("onnxruntime")
    except Exception:  # no onnxruntime, or a broken one: the model says why when it loads
        pass
    return sorted(found)


class DeviceMap:
    def __init__(self, local_count: int, environ: Mapping[str, str]) -> None:
        visible = _visible_ids(environ.get("CUDA_VISIBLE_DEVICES"))
        if visible is None or len(visible) < local_count:
            visible = list(range(local_count))
        self.physical_ids = visible[:local_count]  # local ordinal -> physical id

    def reported(self) -> list[str]:
        """What the worker tells the router it has."""
        return [f"cuda:{p}" for p in self.physical_ids]

    def local(self, device: str) -> str:
        """The device string a backend of this worker uses for the router's ``device``."""
        if not device.startswith("cuda:"):
            return device
        try:
            physical = int(device.split(":", 1)[1])
        except ValueError:
            return device
        if physical in self.physical_ids:
            return f"cuda:{self.physical_ids.index(physical)}"
        return device


def _visible_ids(value: str | None) -> list[int] | None:
    """``CUDA_VISIBLE_DEVICES`` as physical ids; None when unset or not plain integers.
    CUDA stops at the first invalid entry, and so does this."""
    if value is None or not value.strip():
        return None
    ids: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part.isdigit():
            if not ids and part and not part.lstrip("-").isdigit():
                return None  # UUIDs: keep CUDA's numbering
            break
        ids.append(int(part))
    return ids
