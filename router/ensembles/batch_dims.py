"""The batch dimension between an ensemble and composing models that batch differently.

A batching ensemble may hold a non-batching model (and the other way round), as in Triton: its
check refuses only a batching step whose ``max_batch_size`` is below the ensemble's. Each tensor of
a run then carries a batch dimension or not by where it was made: the ensemble's inputs as the
ensemble batches, a step's outputs as that step's model batches. Where a step's model (or the
ensemble's answer) sees it the other way, its shape is changed as Triton's ensemble scheduler
changes it (``ReshapeTensorDims``): a tensor without a batch dimension that matches the dims the
batching side declares gets a batch of 1 in front; a batched tensor that does not match the dims
the non-batching side declares, in a batch of 1, loses it. Otherwise it goes as it is (and the
model's own shape check answers). The bytes never move: only the shape of the reference changes.

Which tensors need it is known when the ensemble is checked against its composing models' configs
(``state.py``): a run over models that all batch as the ensemble does pays nothing per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from conveyor.proto import messages as m
from conveyor.proto import model_config_pb2 as mc
from conveyor.router.spec.ensemble_plan import EnsemblePlan


@dataclass(frozen=True, slots=True)
class Reshape:
    """How one tensor's shape changes where it is read: ``add`` a batch of 1 (the reader batches and
    the tensor has no batch dimension) or strip it (the reader does not batch)."""

    add: bool
    dims: tuple[int, ...]  # what the reader declares (without its batch dimension)

    def apply(self, ref: m.TensorRef) -> m.TensorRef:
        shape = ref.shape
        if self.add:
            if not _matches(self.dims, shape):
                return ref
            shape = [1, *shape]
        else:
            if _matches(self.dims, shape) or not shape or shape[0] != 1:
                return ref
            shape = shape[1:]
        return m.TensorRef(ref.name, ref.datatype, shape, ref.region, ref.offset, ref.nbytes)


@dataclass(frozen=True, slots=True)
class BatchDims:
    """The reshapes of an ensemble whose steps do not all batch as it does (none where they do)."""

    steps: dict[int, dict[str, Reshape]]  # step index -> its model's input name -> the reshape
    outputs: dict[str, Reshape]  # ensemble output -> the reshape of its answer


def batch_dims(config: mc.ModelConfig, plan: EnsemblePlan, configs: Sequence[mc.ModelConfig]) -> BatchDims | None:
    """The reshapes for ``plan`` over its steps' ``configs`` (in step order); None where every step
    batches as the ensemble does."""
    ensemble_batches = config.max_batch_size > 0
    if all((c.max_batch_size > 0) == ensemble_batches for c in configs):
        return None
    batched = {name: ensemble_batches for name in plan.inputs}  # tensor -> it has a batch dimension
    for step, step_config in zip(plan.steps, configs, strict=True):
        for tensor in step.outputs.values():
            batched[tensor] = step_config.max_batch_size > 0
    steps: dict[int, dict[str, Reshape]] = {}
    for step, step_config in zip(plan.steps, configs, strict=True):
        reader_batches = step_config.max_batch_size > 0
        declared = {t.name: tuple(t.dims) for t in step_config.input}
        for name, tensor in step.inputs.items():
            if batched.get(tensor, reader_batches) != reader_batches:
                steps.setdefault(step.index, {})[name] = Reshape(reader_batches, declared.get(name, ()))
    outputs = {t.name: Reshape(ensemble_batches, tuple(t.dims)) for t in config.output
               if batched.get(t.name, ensemble_batches) != ensemble_batches}
    return BatchDims(steps, outputs)


def _matches(dims: tuple[int, ...], shape: list[int]) -> bool:
    """Triton's ``CompareDimsWithWildcard``: as many dimensions, each equal or declared -1."""
    return len(dims) == len(shape) and all(d == -1 or d == s for d, s in zip(dims, shape, strict=True))
