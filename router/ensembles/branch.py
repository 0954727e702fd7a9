"""One run of an ensemble level (``ensemble_levels``): the request itself, or one
response of a decoupled step with everything computed from it.

A branch keeps the tensors made at its level and finds the others in the
branches it is nested in. It is done (``closed``) once nothing can happen in
it any more: no step of it waiting for tensors that can still come, none
running, no decoupled step of it still sending, every nested branch done.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from conveyor.proto import messages as m
from conveyor.router.spec.ensemble_plan import Step


def block_key(flag: m.Release) -> tuple[str, int]:
    return (flag.region, flag.offset)


@dataclass(eq=False)
class Branch:
    level: int
    parent: Branch | None
    waiting: list[Step]  # steps of this level not started yet
    tensors: dict[str, m.TensorRef] = field(default_factory=dict)  # made at this level
    # Known to be absent: an optional ensemble input the request left out, or an output a step did not
    # produce (Triton's empty placeholder): a step that reads one runs without that input.
    absent: set[str] = field(default_factory=set)
    blocks: dict[str, m.Release] = field(default_factory=dict)  # tensor -> the held block it lies in
    held: dict[tuple[str, int], m.Release] = field(default_factory=dict)  # blocks this branch holds
    running_plain: int = 0  # steps on a worker that answer once
    running_streams: int = 0  # decoupled steps that have not sent their final response
    children: list[Branch] = field(default_factory=list)  # nested branches not done yet
    # Nested branches whose responses the client gets, in the order the decoupled step sent them,
    # until each has sent all it will.
    queue: deque[Branch] = field(default_factory=deque)
    response: m.InferResponse | None = None  # made, waiting for its turn to be sent
    answered: bool = False  # its response was made (or it has none to make)
    stopped: bool = False  # exit_when held: no further step starts here or below
    exit_checked: bool = False
    closed: bool = False

    def find(self, tensor: str) -> tuple[m.TensorRef, m.Release | None] | None:
        """Where ``tensor`` lies and its held block, looking here and in the enclosing branches."""
        branch: Branch | None = self
        while branch is not None:
            ref = branch.tensors.get(tensor)
            if ref is not None:
                return ref, branch.blocks.get(tensor)
            branch = branch.parent
        return None

    def has(self, tensor: str) -> bool:
        """``tensor`` was made (or is known to be absent) here or in an enclosing branch."""
        branch: Branch | None = self
        while branch is not None:
            if tensor in branch.tensors or tensor in branch.absent:
                return True
            branch = branch.parent
        return False

    def take(self, outputs: list[m.TensorRef], names: dict[str, str], release: list[m.Release]) -> list[m.Release]:
        """A step's outputs become this branch's tensors (renamed by ``names``, composing ->
        ensemble); returns the flags it must hold (one block per response)."""
        block = release[0] if release else None
        made: set[str] = set()
        for ref in outputs:
            tensor = names.get(ref.name)
            if tensor is None:
                continue
            made.add(tensor)
            self.tensors[tensor] = m.TensorRef(tensor, ref.datatype, ref.shape, ref.region, ref.offset, ref.nbytes)
            if block is not None:
                self.blocks[tensor] = block
        self.absent.update(t for t in names.values() if t not in made)
        for flag in release:
            self.held[block_key(flag)] = flag
        return release

    def lying_in(self, flag: m.Release) -> set[str]:
        key = block_key(flag)
        return {t for t, b in self.blocks.items() if block_key(b) == key}
