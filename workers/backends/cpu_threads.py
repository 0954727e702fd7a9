"""How many threads a CPU framework backend (fil, openvino, tensorflow) gives one instance by default.

Frameworks default to a thread per core for every session; several instances, and several worker
processes, each doing that oversubscribe the host. Conveyor's default instead: the usable cores
(the process's CPU affinity) shared among the config's CPU instances, and one thread for a config
without ``instance_group``, where each worker process runs one instance and is itself the unit of
parallelism (as the onnxruntime and pytorch backends' one intra-op thread).
"""

from __future__ import annotations

import os

from conveyor.proto import model_config_pb2 as mc


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_instances(config: mc.ModelConfig) -> int:
    """How many CPU instances the config asks for in all (0: no ``instance_group``, one per worker)."""
    return sum(max(g.count, 1) for g in config.instance_group
               if g.kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_AUTO))


def default_threads(config: mc.ModelConfig) -> int:
    instances = cpu_instances(config)
    return max(1, usable_cpus() // instances) if instances else 1
