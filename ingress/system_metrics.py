"""Host CPU/memory (from /proc) and GPU (through NVML, when present) metrics, with Triton's names.

Sampled every ``--metrics-interval-ms`` by the metrics process (Triton's "per
interval" metrics), not per scrape: CPU utilization is a difference between two
reads of /proc/stat, and NVML calls take milliseconds.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def _read_cpu_times(path: str = "/proc/stat") -> tuple[int, int]:
    """(busy, total) jiffies over every CPU since boot."""
    with open(path) as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user/nice
    return total - idle, total


def _read_meminfo(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, used) bytes; used is what is not available to new work (MemTotal - MemAvailable)."""
    values: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", total)


class CpuSampler:
    def __init__(self) -> None:
        self._last = _read_cpu_times()
        self.utilization = 0.0

    def sample(self) -> None:
        busy, total = _read_cpu_times()
        d_busy, d_total = busy - self._last[0], total - self._last[1]
        self._last = (busy, total)
        if d_total > 0:
            self.utilization = d_busy / d_total

    def render(self) -> list[str]:
        total, used = _read_meminfo()
        return [
            "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]",
            "# TYPE nv_cpu_utilization gauge",
            f"nv_cpu_utilization {self.utilization!r}",
            "# HELP nv_cpu_memory_total_bytes CPU total memory (RAM), in bytes",
            "# TYPE nv_cpu_memory_total_bytes gauge",
            f"nv_cpu_memory_total_bytes {total}",
            "# HELP nv_cpu_memory_used_bytes CPU used memory (RAM), in bytes",
            "# TYPE nv_cpu_memory_used_bytes gauge",
            f"nv_cpu_memory_used_bytes {used}",
        ]


_GPU_METRICS = [
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "utilization"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "memory_total"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "memory_used"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "power_usage"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "power_limit"),
]


class GpuSampler:
    """NVML readings per GPU, labelled ``gpu_uuid`` as Triton does. ``open()`` is None
    without pynvml (``nvidia-ml-py``) or without a GPU."""

    def __init__(self, nvml: Any, handles: list[tuple[str, Any]]) -> None:
        self._nvml = nvml
        self._handles = handles
        self.readings: list[tuple[str, dict[str, float]]] = []
        # NVML counts millijoules since the driver loaded; Triton reports joules since it started.
        self._energy_start: dict[str, int] = {}
        for uuid, h in handles:
            try:
                self._energy_start[uuid] = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            except Exception as exc:  # boards before Volta have no energy counter
                log.debug("no energy counter on %s: %s", uuid, exc)

    @classmethod
    def open(cls) -> GpuSampler | None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                handles.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
        except Exception as exc:  # no library, no driver, no device: no GPU metrics
            log.debug("no GPU metrics: %s", exc)
            return None
        return cls(pynvml, handles) if handles else None

    def sample(self) -> None:
        nvml, out = self._nvml, []
        for uuid, h in self._handles:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(h)
                out.append((uuid, {
                    "utilization": nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0,
                    "memory_total": float(mem.total),
                    "memory_used": float(mem.used),
                    "power_usage": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,  # mW -> W
                    "power_limit": nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0,
                }))
                if uuid in self._energy_start:
                    mj = int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) - self._energy_start[uuid]
                    out[-1][1]["energy"] = mj / 1000.0
            except Exception as exc:  # e.g. power readings unsupported on this board
                log.debug("NVML reading of %s failed: %s", uuid, exc)
        self.readings = out

    def render(self) -> list[str]:
        lines: list[str] = []
        for name, help_text, key in _GPU_METRICS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            lines += [f'{name}{{gpu_uuid="{uuid}"}} {values[key]!r}' for uuid, values in self.readings]
        lines += ["# HELP nv_energy_consumption GPU energy consumption in joules since the Triton Server started",
                  "# TYPE nv_energy_consumption counter"]
        lines += [f'nv_energy_consumption{{gpu_uuid="{uuid}"}} {values["energy"]!r}'
                  for uuid, values in self.readings if "energy" in values]
        return lines
