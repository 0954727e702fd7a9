"""Where the engine's control process runs: beside its model's compute threads on a small host.

vLLM's CPU build binds its model worker's compute threads to some cores and leaves the engine core
process (the scheduler, which hands each step to the model worker and waits for it by spinning)
free to run anywhere. On a small host "anywhere" is the few cores the server around it, and the
clients, need: there the engine core's spinning competes with the work that admits requests and
hands out tokens, and, at a lower priority (``ENGINE_NICE``), it loses to it and the next step
starts late. Kept on the compute cores, the engine core and the model take turns (one schedules
while the other waits), and the other cores are the server's: on the 2-vCPU reference host, 32
streaming clients got 2,690-2,850 tokens/s against 2,020-2,170 with the engine core left free
(docs/PERFORMANCE.md, "The engine core beside its model").

``ENGINE_CPUS`` in the model's ``parameters``: "compute" (keep the engine core on the cores the
model computes on), "free" (as vLLM leaves it), or "auto" (the default: "compute" on hosts with
fewer than ``priority.AUTO_MIN_CORES`` cores, as ``ENGINE_NICE``, "free" elsewhere, where the
spinning has cores of its own and the compute cores are all busy computing). Measured on 2 vCPUs
only; from 3 to 7 cores "auto" follows the same rule unmeasured. A GPU engine binds no cores:
nothing moves.
"""

from __future__ import annotations

from conveyor.proto.errors import unavailable
from conveyor.workers.backends.vllm.priority import small_host

CHOICES = ("auto", "compute", "free")


def engine_on_compute_cores(setting: str | None) -> bool:
    """Whether the engine core process joins the compute cores, from the model's ``ENGINE_CPUS``."""
    value = (setting or "auto").strip().lower()
    if value not in CHOICES:
        raise unavailable(f"ENGINE_CPUS must be one of {', '.join(repr(c) for c in CHOICES)}, not '{setting}'")
    return value == "compute" or (value == "auto" and small_host())
