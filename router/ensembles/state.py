"""An ensemble model version in the registry: ready only while every composing
model is, and checked against the composing models' configs.

Those checks (Triton's load-time rules: every step's model exists, the mapped
tensor names exist with matching data types, the ensemble's max_batch_size fits
every batching composing model's (a non-batching one fits any: ``batch_dims.py``),
no step reads the responses of two unrelated decoupled steps) are redone whenever
the repository generation changes, since composing models load, reload and unload
on their own. A failed check makes the ensemble
UNAVAILABLE with the reason. As in Triton, an ensemble with a decoupled step is
decoupled itself: the check writes ``model_transaction_policy.decoupled`` into
its config, which is what its metadata, config and the ingress's signature show.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError
from conveyor.router.ensembles.batch_dims import BatchDims, batch_dims
from conveyor.router.ensembles.levels import Levels, build_levels
from conveyor.router.ensembles.step_limits import StepLimit, step_limits
from conveyor.router.models import ModelEntry, VersionState
from conveyor.router.observability.histograms import HistogramConfig, LatencyMetrics, first_response_buckets_ms
from conveyor.router.observability.stats import ModelStats
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.spec.ensemble_plan import EnsemblePlan, Step, build_plan
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import step_key
from conveyor.router.spec.triton_rules import ensemble_branches_problem, ensemble_models_problem

if TYPE_CHECKING:
    from conveyor.router.registry import ModelRegistry


@dataclass(eq=False)
class EnsembleVersion(VersionState):
    plan: EnsemblePlan | None = None
    registry: ModelRegistry | None = None
    levels: Levels | None = None  # where decoupled steps' responses flow (set by the check)
    batch_dims: BatchDims | None = None  # where steps batch otherwise than the ensemble (set by the check)
    label_files: dict[str, str] = field(default_factory=dict)  # output -> its label_filename's path
    optional_inputs: frozenset[str] = frozenset()  # the inputs a request may leave out (set at build)
    step_limits: list[StepLimit] = field(default_factory=list)  # max_inflight_requests, by step index (none: 0)
    # Requested outputs (fewer than all) -> the steps they do not need, made once per set (``unneeded_steps``).
    unneeded: dict[frozenset[str], frozenset[int]] = field(default_factory=dict)
    _checked: tuple[int, str] = (-1, "")  # (registry generation, structural problem)
    _checking: bool = field(default=False)  # re-entered: ensembles that contain each other

    @property
    def ready(self) -> bool:
        return self.composing()[0] == "READY"

    @property
    def state(self) -> str:
        return self.composing()[0]

    @property
    def reason(self) -> str:
        return self.composing()[1]

    def composing(self) -> tuple[str, str]:
        """(READY | LOADING | UNAVAILABLE, reason), from the composing models."""
        if self.error:
            return "UNAVAILABLE", self.error
        if self._checking:
            return "UNAVAILABLE", f"ensemble '{self.model}' contains itself"
        self._checking = True
        try:
            return self._composing()
        finally:
            self._checking = False

    def _composing(self) -> tuple[str, str]:
        assert self.plan is not None and self.registry is not None
        registry = self.registry
        if self._checked[0] != registry.generation:
            self._checked = (registry.generation, self._structural_problem())
        if self._checked[1]:
            return "UNAVAILABLE", self._checked[1]
        for step in self.plan.steps:
            versions = _step_versions(registry.models[step.model], step)
            if any(v.ready for v in versions):
                continue
            if any(v.state == "LOADING" for v in versions):
                return "LOADING", f"waiting for composing model '{step.model}' to load"
            reasons = "; ".join(v.reason for v in versions if v.reason)
            return "UNAVAILABLE", f"composing model '{step.model}' is not ready: {reasons}"
        return "READY", ""

    def _structural_problem(self) -> str:
        assert self.plan is not None and self.registry is not None
        name = self.config.name
        problem = self._cycle(self.model, self.model, set())
        if problem:
            return problem
        raw = self.config.ensemble_scheduling.step
        missing = sorted({raw[s.index].model_name for s in self.plan.steps if s.model not in self.registry.models})
        if missing:  # Triton's dependency graph's words
            return f"ensemble {name} contains models that are not available or ambiguous: {', '.join(missing)}"
        types: dict[str, int] = {t.name: int(t.data_type) for t in self.config.input}
        configs: list[mc.ModelConfig] = []
        for step in self.plan.steps:  # first what each step makes, so any step order works
            found = self._step_config(step)
            if isinstance(found, str):
                return found
            configs.append(found)
        if len(configs) == len(raw):  # Triton's checks of the steps against their models, in its words
            problem = ensemble_models_problem(name, self.config, configs)
            if problem:
                return problem
        for step, found in zip(self.plan.steps, configs, strict=True):
            declared_out = {t.name: t for t in found.output}
            for key, tensor in step.outputs.items():
                if key not in declared_out:
                    return f"step {step.index}: composing model '{step.model}' has no output '{key}'"
                types[tensor] = int(declared_out[key].data_type)
        for step, config in zip(self.plan.steps, configs, strict=True):
            problem = _inputs_problem(step, config, types)
            if problem:
                return problem
        conditions = [s.when for s in self.plan.steps if s.when is not None] + (
            [self.plan.exit_when] if self.plan.exit_when is not None else [])
        for condition in conditions:
            if types.get(condition.tensor) == mc.TYPE_STRING:
                return f"condition '{condition.text}': '{condition.tensor}' is a string tensor"
        for t in self.config.output:
            if types[t.name] != t.data_type:
                return _type_mismatch(t.name, types[t.name], f"ensemble output '{t.name}'", t.data_type)
        decoupled = [s.index for s, c in zip(self.plan.steps, configs, strict=True)
                     if c.model_transaction_policy.decoupled]
        try:
            self.levels = build_levels(self.plan, decoupled)
        except ConveyorError as exc:  # in Triton's words where Triton refuses it too
            return (ensemble_branches_problem(self.config.name, self.config, configs)
                    or f"in ensemble '{self.model}', {exc.message}")
        self.batch_dims = batch_dims(self.config, self.plan, configs)
        policy = self.config.model_transaction_policy
        policy.SetInParent()  # Triton sets it, false too: its config shows the field
        if policy.decoupled != self.levels.streaming:  # Triton sets it the same way
            policy.decoupled = self.levels.streaming
        return ""

    def _cycle(self, start: str, current: str, seen: set[str]) -> str:
        """Triton's circular dependency check, upstream from ``current``: its words when a chain of ensembles
        leads back to ``start``."""
        assert self.registry is not None
        entry = self.registry.models.get(current)
        if entry is None or not entry.spec.config.HasField("ensemble_scheduling"):
            return ""
        for step in entry.spec.config.ensemble_scheduling.step:
            upstream = step.model_name
            if upstream == start:
                return f"circular dependency between ensembles: {start} -> ... -> {current} -> {start}"
            if upstream not in seen:
                seen.add(upstream)
                problem = self._cycle(start, upstream, seen)
                if problem:
                    return problem
        return ""

    def _step_config(self, step: Step) -> mc.ModelConfig | str:
        """The composing model's config, or why ``step`` cannot use it."""
        assert self.registry is not None
        where = f"step {step.index}"
        entry = self.registry.models.get(step.model)
        if entry is None:
            return f"{where}: composing model '{step.model}' is not found"
        if entry.spec.error:
            return f"{where}: composing model '{step.model}' is not available: {entry.spec.error}"
        if step.version and int(step.version) not in entry.versions:  # Triton's words
            return (f"ensemble '{self.config.name}' depends on '{step.model}' whose required version {step.version} "
                    "is not loaded.")
        for version in entry.versions.values():
            if isinstance(version, EnsembleVersion):
                version.composing()  # a nested ensemble: whether it is decoupled is known after its check
        config = entry.spec.config
        ours = self.config.max_batch_size
        # Triton's rule: a non-batching model (0) fits any ensemble, its requests reshaped (batch_dims.py).
        if config.max_batch_size != 0 and config.max_batch_size < ours:
            return (f"ensemble {self.config.name} allows maximum batch size {ours}, but it contains model "
                    f"{step.model} which only allows maximum batch size to be {config.max_batch_size}")
        return config


def _inputs_problem(step: Step, config: mc.ModelConfig, types: dict[str, int]) -> str:
    where = f"step {step.index}"
    declared_in = {t.name: t for t in config.input}
    for key, tensor in step.inputs.items():
        spec = declared_in.get(key)
        if spec is None:
            return f"{where}: composing model '{step.model}' has no input '{key}'"
        if types[tensor] != spec.data_type:
            return _type_mismatch(tensor, types[tensor], f"input '{key}' of '{step.model}'", spec.data_type)
    for spec in config.input:
        if spec.name not in step.inputs and not spec.optional:
            return f"{where}: input '{spec.name}' of composing model '{step.model}' is not mapped"
    return ""


def _step_versions(entry: ModelEntry, step: Step) -> Iterable[VersionState]:
    if step.version:
        return [entry.versions[int(step.version)]]
    return entry.versions.values()


def _type_mismatch(tensor: str, has: int, where: str, wants: int) -> str:
    return (f"tensor '{tensor}' is {mc.DataType.Name(has)} but {where} is {mc.DataType.Name(wants)}")


def build_ensemble_entry(spec: ModelSpec, registry: ModelRegistry) -> ModelEntry:
    """The registry entry of an ensemble: versions without instances (the router runs them)."""
    entry = ModelEntry(spec)
    plan = build_plan(spec.config)  # the repository checked it already
    if registry.namespaced:  # --model-namespacing: each step runs the model of its own repository
        steps = tuple(replace(s, model=step_key(spec.path, s.model, registry.namespaced)) for s in plan.steps)
        plan = replace(plan, steps=steps)
    versions = {v: "" for v in spec.version_errors} | dict(spec.versions)
    # The ensemble answers, so its own labels classify its outputs (whichever step makes them).
    label_files = {out.name: os.path.join(spec.path, out.label_filename)
                   for out in spec.config.output if out.label_filename}
    for v, path in sorted(versions.items()):
        state = EnsembleVersion(
            spec.registry_key, v, path, spec.config, ModelStats(spec.name, str(v)),
            DynamicBatcher(0, [], 0, enabled=False), plan=plan, registry=registry, levels=build_levels(plan),
        )
        if HistogramConfig.every_model:  # its time to first response, as Triton's histogram of every model
            state.latency = LatencyMetrics(first_response_buckets_ms(spec.config.model_metrics))
        state.error = spec.version_errors.get(v, "")
        state.label_files = label_files
        state.optional_inputs = frozenset(t.name for t in spec.config.input if t.optional)
        state.step_limits = step_limits(spec.config)  # each version's own, as Triton's scheduler of each
        entry.versions[v] = state
    return entry
