"""An ensemble's steps as a DAG, read from ``ensemble_scheduling`` and checked on
their own (the checks against the composing models' configs happen in
``router/ensembles/state.py``, since those models load and change independently).

Tensor names are the ensemble's: its inputs, its outputs, and every value of a
step's ``input_map`` / ``output_map`` (the keys are the composing model's names).

Conveyor's conditional steps come from the ensemble's ``parameters`` (a plain
Triton config has none of these keys): ``conveyor.step.<i>.when`` runs step
``i`` only if its condition holds, ``conveyor.exit_when`` starts no further step
once its condition holds (see ``ensemble_conditions.py`` and docs/ENSEMBLES.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from conveyor.proto import model_config_pb2 as mc
from conveyor.proto.errors import ConveyorError, invalid_arg
from conveyor.router.spec.ensemble_conditions import Condition

_PARAMETER_PREFIX = "conveyor."
_STEP_WHEN = re.compile(r"conveyor\.step\.(\d+)\.when$")
_EXIT_WHEN = "conveyor.exit_when"


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    model: str
    version: str  # "" = the newest ready version (model_version -1)
    inputs: dict[str, str]  # composing model input -> ensemble tensor
    outputs: dict[str, str]  # composing model output -> ensemble tensor
    when: Condition | None = None  # run only if this holds (a Conveyor extension)

    def reads(self) -> list[str]:
        """The tensors that must exist before this step can start (or be skipped)."""
        inputs = list(self.inputs.values())
        return inputs if self.when is None else [*inputs, self.when.tensor]


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    producers: dict[str, int]  # tensor -> index of the step that makes it
    exit_when: Condition | None = None  # once this holds, no further step starts

    @property
    def conditional(self) -> bool:
        """Some step may not run: outputs that were not made are left out of the response."""
        return self.exit_when is not None or any(s.when is not None for s in self.steps)


def build_plan(config: mc.ModelConfig) -> EnsemblePlan:
    """The DAG of ``config``, or an INVALID_ARG error saying what is wrong with it."""
    if config.instance_group:
        raise invalid_arg("instance_group must not be given for an ensemble")
    if config.HasField("dynamic_batching") or config.HasField("sequence_batching"):
        raise invalid_arg("an ensemble is scheduled by its steps' models, not by a batcher")
    if not config.ensemble_scheduling.step:
        raise invalid_arg("the ensemble has no steps in ensemble_scheduling")
    inputs = tuple(t.name for t in config.input)
    outputs = tuple(t.name for t in config.output)
    steps: list[Step] = []
    producers: dict[str, int] = {}
    for i, raw in enumerate(config.ensemble_scheduling.step):
        if not raw.model_name:
            raise invalid_arg(f"step {i} names no model")
        if not raw.output_map:
            raise invalid_arg(f"step {i} (model '{raw.model_name}') has an empty output_map")
        step = Step(i, raw.model_name, str(raw.model_version) if raw.model_version > 0 else "",
                    dict(raw.input_map), dict(raw.output_map))
        for tensor in step.outputs.values():
            if tensor in inputs:
                raise invalid_arg(f"step {i} writes ensemble input '{tensor}'")
            if tensor in producers:
                raise invalid_arg(
                    f"tensor '{tensor}' is an output of both step {producers[tensor]} and step {i}"
                )
            producers[tensor] = i
        steps.append(step)
    exit_when = _conditions(config, steps)
    known = set(inputs) | set(producers)
    for step in steps:
        for tensor in step.reads():
            if tensor not in known:
                raise invalid_arg(
                    f"step {step.index} (model '{step.model}') reads tensor '{tensor}', "
                    "which is neither an ensemble input nor an output of any step"
                )
    if exit_when is not None and exit_when.tensor not in known:
        raise invalid_arg(f"{_EXIT_WHEN}: '{exit_when.tensor}' is neither an ensemble input nor an output of any step")
    for tensor in outputs:
        if tensor not in producers:
            raise invalid_arg(f"output '{tensor}' is not an output of any step")
    plan = EnsemblePlan(inputs, outputs, tuple(steps), producers, exit_when)
    _check_acyclic(plan)
    return plan


def _check_acyclic(plan: EnsemblePlan) -> None:
    """Kahn's algorithm: whatever cannot be ordered lies on a cycle."""
    needs = {s.index: {plan.producers[t] for t in s.reads() if t in plan.producers} for s in plan.steps}
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for index, deps in needs.items():
            if index not in done and deps <= done:
                done.add(index)
                progress = True
    stuck = sorted(set(needs) - done)
    if stuck:
        models = ", ".join(f"step {i} ('{plan.steps[i].model}')" for i in stuck)
        raise invalid_arg(f"the ensemble's steps form a cycle: {models}")


def _conditions(config: mc.ModelConfig, steps: list[Step]) -> Condition | None:
    """Puts each ``conveyor.step.<i>.when`` on its step; returns ``conveyor.exit_when``."""
    exit_when = None
    for key, param in sorted(config.parameters.items()):
        if not key.startswith(_PARAMETER_PREFIX):
            continue
        try:
            condition = Condition.parse(param.string_value)
        except ConveyorError as exc:
            raise invalid_arg(f"parameter '{key}': {exc.message}") from None
        found = _STEP_WHEN.match(key)
        if key == _EXIT_WHEN:
            exit_when = condition
        elif found is not None and int(found.group(1)) < len(steps):
            i = int(found.group(1))
            steps[i] = replace(steps[i], when=condition)
        else:
            raise invalid_arg(f"unknown ensemble parameter '{key}': expected conveyor.step.<i>.when (i < "
                              f"{len(steps)}) or {_EXIT_WHEN}")
    return exit_when


def ensemble_problem(config: mc.ModelConfig) -> str:
    """What is wrong with an ensemble config on its own, or ''."""
    try:
        build_plan(config)
    except ConveyorError as exc:
        return exc.message
    return ""


def unneeded_steps(plan: EnsemblePlan, wanted: Iterable[str]) -> frozenset[int]:
    """The steps that make none of ``wanted`` (requested outputs), directly or through the tensors the others
    read: Triton's ensemble runs only the steps a request's outputs need."""
    steps = {s.index: s for s in plan.steps}
    used: set[int] = set()
    todo = list(wanted)
    while todo:
        index = plan.producers.get(todo.pop())
        if index is None or index in used:
            continue
        used.add(index)
        todo += steps[index].reads()
    return frozenset(i for i in steps if i not in used)
