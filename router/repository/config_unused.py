"""Model-config fields that Conveyor reads but does not act on.

Nothing in a config is ignored silently: when a model's config is read (start-up,
load, reload), each such field it sets is named in one log line for that model,
with what Conveyor does instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from conveyor.proto import model_config_pb2 as mc

log = logging.getLogger(__name__)

_Check = Callable[[mc.ModelConfig], bool]


def _groups(test: Callable[[mc.ModelInstanceGroup], bool]) -> _Check:
    return lambda c: any(test(g) for g in c.instance_group)


def _opt(name: str) -> _Check:
    return lambda c: c.HasField("optimization") and c.optimization.HasField(name)


# (field, set in this config?, what Conveyor does instead)
FIELDS: tuple[tuple[str, _Check, str], ...] = (
    ("model_repository_agents", lambda c: len(c.model_repository_agents.agents) > 0,
     "no repository agent runs: the files load as they are"),
    ("model_operations", lambda c: len(c.model_operations.op_library_filename) > 0,
     "no custom op library is loaded (ONNX Runtime custom ops: load them in the worker's environment)"),
    ("instance_group.passive", _groups(lambda g: g.passive), "passive instances take batches like the others"),
    ("instance_group.secondary_devices", _groups(lambda g: len(g.secondary_devices) > 0),
     "no secondary device (NVDLA) is used"),
    ("instance_group.host_policy", _groups(lambda g: bool(g.host_policy)),
     "no host policy pins the instance (no NUMA or core binding)"),
    ("instance_group.profile", _groups(lambda g: len(g.profile) > 0),
     "TensorRT engines run with their default optimization profile"),
    ("cc_model_filenames", lambda c: len(c.cc_model_filenames) > 0,
     "the model file is default_model_filename, whatever the GPU's compute capability"),
    ("metric_tags", lambda c: len(c.metric_tags) > 0, "metrics carry no extra labels"),
    ("optimization.cuda", _opt("cuda"), "no CUDA graphs or busy-wait events: each backend runs the model as is"),
    ("optimization.priority", lambda c: c.optimization.priority != mc.ModelOptimizationPolicy.PRIORITY_DEFAULT,
     "every instance runs at the same priority"),
    ("optimization.input_pinned_memory", _opt("input_pinned_memory"),
     "inputs come from shared memory: there is no pinned staging buffer"),
    ("optimization.output_pinned_memory", _opt("output_pinned_memory"),
     "outputs go to shared memory: there is no pinned staging buffer"),
    ("optimization.gather_kernel_buffer_threshold", lambda c: c.optimization.gather_kernel_buffer_threshold > 0,
     "a batch's inputs are gathered by the worker on the CPU"),
    ("optimization.eager_batching", lambda c: c.optimization.eager_batching,
     "batches form in the router's dynamic batcher only"),
)


def unused_fields(config: mc.ModelConfig) -> list[tuple[str, str]]:
    """(field, what Conveyor does instead) for each field ``config`` sets that changes nothing."""
    return [(name, instead) for name, is_set, instead in FIELDS if is_set(config)]


def log_unused_fields(name: str, config: mc.ModelConfig) -> None:
    fields = unused_fields(config)
    if fields:
        log.warning("model '%s': config fields read but not acted on by Conveyor: %s", name,
                    "; ".join(f"{field} ({instead})" for field, instead in fields))
