"""Reading ensemble configs: Triton's structural rules and Conveyor's condition parameters."""

from __future__ import annotations

import pytest

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError
from conveyor.proto.model_config import parse_text
from conveyor.router.ensembles.scheduler import MAX_OUTPUT_SETS, EnsembleScheduler
from conveyor.router.ensembles.state import EnsembleVersion
from conveyor.router.observability.stats import ModelStats
from conveyor.router.scheduling.batcher import DynamicBatcher
from conveyor.router.spec.ensemble_conditions import Condition
from conveyor.router.spec.ensemble_plan import EnsemblePlan, build_plan, unneeded_steps

LEVEL = "unit"

HEAD = '''
name: "e"
platform: "ensemble"
max_batch_size: 4
input [ { name: "A" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''


def plan_of(steps: str, extra: str = "") -> EnsemblePlan:
    return build_plan(parse_text(HEAD + f"ensemble_scheduling {{ step [ {steps} ] }}\n" + extra))


def step(model: str, src: str, dst: str) -> str:
    return f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "X" value: "{src}" }} ' \
           f'output_map {{ key: "Y" value: "{dst}" }} }}'


def test_a_chain_reads_as_steps_and_producers() -> None:
    plan = build_plan(parse_text(HEAD + f"ensemble_scheduling {{ step [ {step('m', 'A', 't')}, "
                                        f"{step('n', 't', 'OUT')} ] }}"))
    assert [s.model for s in plan.steps] == ["m", "n"]
    assert plan.producers == {"t": 0, "OUT": 1}
    assert plan.steps[0].version == "" and not plan.conditional


@pytest.mark.parametrize(("steps", "extra", "problem"), [
    ("", "", "no steps"),
    (step("m", "A", "t"), "", "output 'OUT' is not an output of any step"),
    (f"{step('m', 'A', 'OUT')}, {step('n', 'A', 'OUT')}", "", "output of both step 0 and step 1"),
    (f"{step('m', 'nowhere', 'OUT')}", "", "reads tensor 'nowhere'"),
    (f"{step('m', 'y', 'x')}, {step('n', 'x', 'y')}, {step('o', 'A', 'OUT')}", "", "cycle"),
    (step("m", "A", "A"), "", "writes ensemble input 'A'"),
    (step("m", "A", "OUT"), 'instance_group [{ count: 1 }]', "instance_group"),
    (step("m", "A", "OUT"), 'parameters { key: "conveyor.step.3.when" value { string_value: "A > 1" } }',
     "unknown ensemble parameter 'conveyor.step.3.when'"),
    (step("m", "A", "OUT"), 'parameters { key: "conveyor.exit_when" value { string_value: "A ~ 1" } }',
     "expected '<tensor> <op> <value>'"),
    # A step cannot wait for a condition on its own output.
    (step("m", "A", "OUT"), 'parameters { key: "conveyor.step.0.when" value { string_value: "OUT > 1" } }',
     "cycle"),
])
def test_structural_problems(steps: str, extra: str, problem: str) -> None:
    with pytest.raises(ConveyorError, match=problem):
        plan_of(steps, extra)


def test_conditions_attach_to_their_step() -> None:
    plan = plan_of(f"{step('m', 'A', 'flag')}, {step('n', 'A', 'OUT')}",
                   'parameters { key: "conveyor.step.1.when" value { string_value: "flag == true" } }\n'
                   'parameters { key: "unrelated" value { string_value: "kept for the model" } }')
    assert plan.steps[1].when == Condition("flag", "==", 1.0, "flag == true")
    assert plan.steps[1].reads() == ["A", "flag"]
    assert plan.conditional


def test_condition_values() -> None:
    assert Condition.parse("x >= -2.5").value == -2.5
    assert Condition.parse("x != FALSE").value == 0.0
    with pytest.raises(ConveyorError, match="not a number"):
        Condition.parse("x == maybe")


def test_the_steps_a_requested_output_set_does_not_need() -> None:
    two_outputs = HEAD.replace('output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]',
                               'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, '
                               '{ name: "T" data_type: TYPE_INT32 dims: [ 1 ] } ]')
    # m: A -> t; n: t -> OUT; o: A -> T.
    plan = build_plan(parse_text(two_outputs + f"ensemble_scheduling {{ step [ {step('m', 'A', 't')}, "
                                               f"{step('n', 't', 'OUT')}, {step('o', 'A', 'T')} ] }}"))
    assert unneeded_steps(plan, ["OUT"]) == {2}
    assert unneeded_steps(plan, ["T"]) == {0, 1}
    assert unneeded_steps(plan, ["OUT", "T"]) == set()


def test_an_ensemble_remembers_at_most_max_output_sets() -> None:
    outputs = [f"O{i}" for i in range(8)]
    head = HEAD.replace('output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]', "output [ " + ", ".join(
        f'{{ name: "{o}" data_type: TYPE_INT32 dims: [ 1 ] }}' for o in outputs) + " ]")
    plan = build_plan(parse_text(head + "ensemble_scheduling { step [ " + ", ".join(
        step("m", "A", o) for o in outputs) + " ] }"))
    state = EnsembleVersion("e", 1, "", parse_text(head), ModelStats("e", "1"), DynamicBatcher(0, [], 0, False),
                            plan=plan)
    subsets = [frozenset(o for i, o in enumerate(outputs) if mask >> i & 1) for mask in range(1, 2 ** 7)]
    for wanted in subsets:  # 127 sets, each asked for: the cache stops growing at its bound
        specs = {o: m.OutputSpec(o) for o in wanted}
        assert EnsembleScheduler._unneeded(state, specs) == unneeded_steps(plan, wanted)
    assert len(state.unneeded) == MAX_OUTPUT_SETS
