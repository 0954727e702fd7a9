"""Where a decoupled step's responses flow: the levels of an ensemble's tensors and steps."""

from __future__ import annotations

import pytest

from conveyor.proto.errors import ConveyorError
from conveyor.proto.model_config import parse_text
from conveyor.router.ensembles.levels import build_levels
from conveyor.router.spec.ensemble_plan import EnsemblePlan, build_plan

LEVEL = "unit"


def plan(outputs: list[str], steps: list[tuple[str, dict[str, str], list[str]]]) -> EnsemblePlan:
    """Steps as (model, {input: tensor}, [output tensors]); input A and B."""
    text = ['name: "e" platform: "ensemble" max_batch_size: 0',
            "input [ " + ", ".join(f'{{ name: "{i}" data_type: TYPE_INT32 dims: [ 1 ] }}' for i in "AB") + " ]",
            "output [ " + ", ".join(f'{{ name: "{o}" data_type: TYPE_INT32 dims: [ 1 ] }}' for o in outputs) + " ]",
            "ensemble_scheduling { step ["]
    for i, (model, inputs, outs) in enumerate(steps):
        ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
        made = " ".join(f'output_map {{ key: "O{j}" value: "{t}" }}' for j, t in enumerate(outs))
        text.append(("," if i else "") + f'{{ model_name: "{model}" {ins} {made} }}')
    text.append("] }")
    return build_plan(parse_text("\n".join(text)))


def test_without_decoupled_steps_everything_is_the_request() -> None:
    levels = build_levels(plan(["OUT"], [("a", {"X": "A"}, ["t"]), ("b", {"X": "t"}, ["OUT"])]))
    assert not levels.streaming
    assert levels.of_step == (0, 0) and levels.response == 0
    assert [s.model for s in levels.steps_at[0]] == ["a", "b"]


def test_a_decoupled_step_opens_a_level_for_what_follows_it() -> None:
    # pre (plain) -> gen (decoupled) -> post (reads the response and the request's B) -> OUT
    p = plan(["OUT"], [("post", {"X": "tok", "Z": "B"}, ["OUT"]), ("gen", {"X": "pre"}, ["tok"]),
                       ("pre", {"X": "A"}, ["pre"])])
    levels = build_levels(p, [1])
    assert levels.streaming and levels.decoupled == {1}
    assert levels.of_step == (2, 0, 0)  # post runs once per response of gen (level 1 + 1)
    assert levels.of_tensor["tok"] == levels.of_tensor["OUT"] == 2 and levels.of_tensor["pre"] == 0
    assert levels.parent == {2: 0} and levels.response == 2
    assert levels.encloses(0, 2) and not levels.encloses(2, 0)
    assert [s.model for s in levels.steps_at[2]] == ["post"]
    # B lies in the request and is read by every response's run: kept until the request is done.
    assert levels.kept[0] == {"B"}
    assert levels.fed_from_above == set() and levels.feeds_below == set()  # B exists from the start


def test_a_plain_tensor_of_the_request_read_by_responses_may_come_later() -> None:
    p = plan(["OUT"], [("gen", {"X": "A"}, ["tok"]), ("slow", {"X": "B"}, ["b"]),
                       ("post", {"X": "tok", "Z": "b"}, ["OUT"])])
    levels = build_levels(p, [0])
    assert levels.fed_from_above == {1} and levels.feeds_below == {0}
    assert levels.kept[0] == {"b"}


def test_nested_decoupled_steps() -> None:
    p = plan(["OUT"], [("outer", {"X": "A"}, ["x"]), ("inner", {"X": "x"}, ["y"]),
                       ("post", {"X": "y", "Z": "x"}, ["OUT"])])
    levels = build_levels(p, [0, 1])
    assert levels.parent == {1: 0, 2: 1}
    assert levels.of_step == (0, 1, 2) and levels.response == 2


@pytest.mark.parametrize(("outputs", "steps", "problem"), [
    # Triton's rule: one step cannot pair the responses of two decoupled steps.
    (["OUT"], [("g1", {"X": "A"}, ["x"]), ("g2", {"X": "B"}, ["y"]), ("post", {"X": "x", "Z": "y"}, ["OUT"])],
     "step 2 \\(model 'post'\\) receives inputs originated from different decoupled models "
     "\\('g1' \\(step 0\\) and 'g2' \\(step 1\\)\\)"),
    # ... and the outputs neither.
    (["X1", "X2"], [("g1", {"X": "A"}, ["X1"]), ("g2", {"X": "B"}, ["X2"])],
     "the ensemble's outputs come from different decoupled models"),
])
def test_unrelated_decoupled_levels_do_not_mix(outputs: list[str], steps: list[tuple[str, dict[str, str], list[str]]],
                                               problem: str) -> None:
    with pytest.raises(ConveyorError, match=problem):
        build_levels(plan(outputs, steps), [0, 1])


def test_a_side_decoupled_step_makes_the_ensemble_decoupled() -> None:
    # As in Triton: the outputs come from the request's level, yet the ensemble is decoupled.
    p = plan(["OUT"], [("a", {"X": "A"}, ["OUT"]), ("side", {"X": "A"}, ["s"])])
    levels = build_levels(p, [1])
    assert levels.streaming and levels.response == 0
