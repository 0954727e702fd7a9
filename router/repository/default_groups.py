"""Triton's default placement: a model with no ``instance_group``, or a group of
``KIND_AUTO``, goes to the GPU when the group has one (core ``NormalizeInstanceGroup``).

The router learns the GPUs from the workers (``WorkerHello.devices``), so the choice is
made when a version is first placed with workers present, not when its config is read:

- no ``instance_group``, a GPU backend (onnxruntime, pytorch, tensorrt) and GPUs in the
  group: one instance on every GPU (Triton's ``count: 1, kind: KIND_GPU, gpus: [all]``);
  without a GPU: Conveyor's CPU default, one instance on every worker;
- ``KIND_AUTO``: ``KIND_GPU`` on ``gpus`` (all GPUs when none are listed, ``count`` on
  each) when every listed GPU is present, else ``KIND_CPU``.

Python models stay on CPU (Triton would give them a GPU "kind" they rarely use).
``/v2/models/<m>/config`` shows the group that was filled in (``filled_config``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from conveyor.proto import model_config_pb2 as mc
from conveyor.router.models import Instance, InstanceState, VersionState
from conveyor.router.spec.triton_rules import default_count

if TYPE_CHECKING:
    from conveyor.router.pool import WorkerInfo

log = logging.getLogger(__name__)

GPU_BACKENDS = frozenset(("onnxruntime", "pytorch", "tensorrt"))
AUTO = "auto"  # Instance.device of a KIND_AUTO instance not resolved yet

_said_cpu = False  # "no GPU: ... on CPU" is logged once per router


def gpu_capable(config: mc.ModelConfig) -> bool:
    return config.backend in GPU_BACKENDS


def pool_gpus(devices: list[list[str]]) -> list[int]:
    """The GPU ids the workers report (``cuda:N``), sorted, each once."""
    ids = set()
    for worker_devices in devices:
        for d in worker_devices:
            if d.startswith("cuda:") and d[5:].isdigit():
                ids.add(int(d[5:]))
    return sorted(ids)


def backend_gpus(workers: Iterable[WorkerInfo], backend: str) -> list[int]:
    """The GPUs of the workers that can run ``backend`` on them (``WorkerHello.gpu_backends``)."""
    return pool_gpus([w.devices for w in workers if backend in w.gpu_backends])


def resolve(state: VersionState, gpus: list[int], next_index: Callable[[], int]) -> None:
    """Fill in ``state``'s default or KIND_AUTO instances now that workers are known."""
    if state.auto_gpus is not None or state.error:
        return
    capable = gpu_capable(state.config)
    if state.per_worker:
        state.auto_gpus = gpus if capable else []
        if state.auto_gpus:
            state.per_worker = False
            name = f"{state.config.name}_0"  # Triton's default group (named <model>): one instance per GPU
            state.instances = [Instance(state, next_index(), f"cuda:{g}", name=name) for g in gpus]
            log.info("model '%s' version %s has no instance_group: one instance on each GPU %s, as Triton",
                     state.model, state.label, gpus)
        elif capable:
            _no_gpu(state)
        return
    if not any(i.device.startswith(AUTO) for i in state.instances):
        state.auto_gpus = []
        return
    state.auto_gpus = gpus if capable else []
    resolved: list[Instance] = []
    for inst in state.instances:
        if not inst.device.startswith(AUTO) or inst.state is not InstanceState.UNPLACED:
            resolved.append(inst)
            continue
        # "auto": no gpus listed; "auto:<gpu>:<every gpu of its group>" (models.instance_devices)
        parts = inst.device.split(":")
        group = [int(g) for g in parts[2].split(",")] if len(parts) == 3 else []
        if not state.auto_gpus or any(g not in gpus for g in group):
            inst.device = "cpu"  # Triton: one listed GPU missing makes the whole group KIND_CPU
            resolved.append(inst)
        elif group:
            inst.device = f"cuda:{parts[1]}"
            resolved.append(inst)
        else:  # no gpus listed: its count on every GPU
            inst.device = f"cuda:{gpus[0]}"
            resolved.append(inst)
            resolved += [Instance(state, next_index(), f"cuda:{g}", name=inst.name) for g in gpus[1:]]
    if capable and not state.auto_gpus:
        _no_gpu(state)
    state.instances = resolved


def _no_gpu(state: VersionState) -> None:
    global _said_cpu
    if not _said_cpu:
        _said_cpu = True
        log.warning("no GPU that the backend can use (none on this host, or e.g. a CPU build of onnxruntime): "
                    "models without instance_group or with KIND_AUTO run on CPU (Triton places them on the GPU "
                    "where there is one); first: model '%s' (%s)", state.model, state.config.backend)


def filled_config(config: mc.ModelConfig, state: VersionState | None) -> mc.ModelConfig:
    """``config`` with the instance groups Triton would show: names ``<model>_<i>``, a
    count of at least 1, KIND_AUTO resolved, and the default group of a config without
    one (``config`` itself when there is nothing to fill)."""
    if state is None or config.HasField("ensemble_scheduling"):
        return config
    out = mc.ModelConfig()
    out.CopyFrom(config)
    G = mc.ModelInstanceGroup
    # Triton's defaults (NormalizeModelConfig), shown as Triton shows them: Conveyor stages no tensor in pinned memory.
    for field in ("input_pinned_memory", "output_pinned_memory"):
        if not out.optimization.HasField(field):
            getattr(out.optimization, field).enable = True
    if not out.instance_group:
        gpus = state.auto_gpus or []
        if gpus:
            out.instance_group.add(name=state.model, kind=G.KIND_GPU, count=1, gpus=gpus)
        else:
            out.instance_group.add(name=state.model, kind=G.KIND_CPU, count=max(1, len(state.instances)))
        return out
    for i, g in enumerate(out.instance_group):
        if not g.name:
            g.name = f"{state.model}_{i}"
        if g.count < 1:
            g.count = default_count(g.kind, config.backend)
        if g.kind == G.KIND_AUTO and state.auto_gpus is not None:
            on_gpu = bool(state.auto_gpus) and all(x in state.auto_gpus for x in g.gpus)
            g.kind = G.KIND_GPU if on_gpu else G.KIND_CPU
            if on_gpu and not g.gpus:
                g.gpus.extend(state.auto_gpus)
    return out
