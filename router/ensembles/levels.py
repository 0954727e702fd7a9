"""Where a decoupled step's responses flow in an ensemble: *levels*.

Level 0 is the request itself. Each response of a decoupled step (index ``i``)
starts its own run of the steps that read its outputs: those outputs, and every
tensor computed from them, lie at level ``i + 1``, nested in the level the
decoupled step runs at. A step runs at the deepest level of the tensors it
reads, once per run of that level.

Triton requires every tensor a step reads to come from the same decoupled step
("receives inputs originated from different decoupled models"). Conveyor also
lets a step read tensors of enclosing levels (the request's inputs, or an outer
decoupled step's response), which exist once for all the runs nested in them;
tensors of two levels that do not nest are refused, as in Triton. The same rule
holds for the ensemble's outputs: the deepest of their levels is the one whose
runs each answer the client with one response.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from conveyor.proto.errors import invalid_arg
from conveyor.router.spec.ensemble_plan import EnsemblePlan, Step

REQUEST = 0  # the level of the request's own tensors


@dataclass(frozen=True, slots=True)
class Levels:
    of_step: tuple[int, ...]  # the level each step runs at, by step index
    of_tensor: dict[str, int]  # the level each ensemble tensor lies at
    parent: dict[int, int]  # a decoupled step's level -> the level that step runs at
    response: int  # the level whose runs answer the client
    decoupled: frozenset[int]  # the decoupled steps, by index
    steps_at: dict[int, tuple[Step, ...]]  # the steps each run of a level starts with
    # Tensors a run keeps until it is done: read by nested levels, or outputs of nested responses.
    kept: dict[int, frozenset[str]]
    # Levels whose steps read tensors that plain steps of an enclosing level make (they may come later).
    fed_from_above: frozenset[int]
    # Levels some plain step of which makes a tensor a nested level reads.
    feeds_below: frozenset[int]
    streaming: bool  # the ensemble is decoupled: any number of responses, then the final flag

    def encloses(self, outer: int, level: int) -> bool:
        """``outer`` is ``level`` or a level it is nested in."""
        while True:
            if level == outer:
                return True
            if level == REQUEST:
                return False
            level = self.parent[level]


def build_levels(plan: EnsemblePlan, decoupled: Iterable[int] = ()) -> Levels:
    """The levels of ``plan`` when the steps ``decoupled`` (indexes) are; INVALID_ARG when
    a step, or the outputs, read tensors of levels that do not nest."""
    stream = frozenset(decoupled)
    of_tensor = dict.fromkeys(plan.inputs, REQUEST)
    parent: dict[int, int] = {}
    of_step = [REQUEST] * len(plan.steps)

    def deepest(levels: set[int], what: str) -> int:
        ordered = sorted(levels, key=lambda lv: _depth(lv, parent))
        for outer, inner in itertools.pairwise(ordered):
            if not _encloses(outer, inner, parent):
                models = [_origin(plan, lv) for lv in (outer, inner)]
                raise invalid_arg(f"{what} different decoupled models ({' and '.join(models)})")
        return ordered[-1] if ordered else REQUEST

    for step in _in_order(plan):
        level = deepest({of_tensor[t] for t in step.reads()},
                        f"step {step.index} (model '{step.model}') receives inputs originated from")
        of_step[step.index] = level
        made = level
        if step.index in stream:
            made = step.index + 1
            parent[made] = level
        for tensor in step.outputs.values():
            of_tensor[tensor] = made
    response = deepest({of_tensor[t] for t in plan.outputs}, "the ensemble's outputs come from")
    steps_at: dict[int, list[Step]] = {}
    for step in plan.steps:
        steps_at.setdefault(of_step[step.index], []).append(step)
    kept: dict[int, set[str]] = {}
    fed_from_above: set[int] = set()
    feeds_below: set[int] = set()
    for step in plan.steps:
        here = of_step[step.index]
        for tensor in step.reads():
            there = of_tensor[tensor]
            if there == here:
                continue
            kept.setdefault(there, set()).add(tensor)
            producer = plan.producers.get(tensor)
            if producer is not None and producer not in stream:
                fed_from_above.add(here)
                feeds_below.add(there)
    for tensor in plan.outputs:
        if of_tensor[tensor] != response:
            kept.setdefault(of_tensor[tensor], set()).add(tensor)
    return Levels(
        tuple(of_step), of_tensor, parent, response, stream,
        {lv: tuple(steps) for lv, steps in steps_at.items()},
        {lv: frozenset(ts) for lv, ts in kept.items()}, frozenset(fed_from_above), frozenset(feeds_below),
        bool(stream),
    )


def _in_order(plan: EnsemblePlan) -> list[Step]:
    """The steps, each after the steps that make what it reads (the plan has no cycle)."""
    done: set[int] = set()
    order: list[Step] = []
    while len(order) < len(plan.steps):
        for step in plan.steps:
            needs = {plan.producers[t] for t in step.reads() if t in plan.producers}
            if step.index not in done and needs <= done:
                done.add(step.index)
                order.append(step)
    return order


def _depth(level: int, parent: dict[int, int]) -> int:
    depth = 0
    while level != REQUEST:
        level = parent[level]
        depth += 1
    return depth


def _encloses(outer: int, level: int, parent: dict[int, int]) -> bool:
    while level != outer:
        if level == REQUEST:
            return False
        level = parent[level]
    return True


def _origin(plan: EnsemblePlan, level: int) -> str:
    return "the request" if level == REQUEST else f"'{plan.steps[level - 1].model}' (step {level - 1})"
