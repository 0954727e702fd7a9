"""Readiness a model decides itself: a Python model whose ``model.py`` defines ``is_ready()``
(Triton 2.6x's user-defined readiness, ``TRITONBACKEND_ModelInstanceReady``).

``model_ready`` for such a version asks each serving instance that has one (``ReadyCheck``
to its worker, which runs ``is_ready()`` beside the instance's batches and joins a check
already running) and answers once all said yes, at the first no, or after
``TIMEOUT_S`` (not ready), as Triton's backend waits 5 s for its stub. A model without
``is_ready()`` is answered at once from its state, as before.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

from conveyor.proto import messages as m
from conveyor.proto.framing import PeerOutbox
from conveyor.router.control import ControlHandler
from conveyor.router.control_table import Caller
from conveyor.router.registry import ModelRegistry

TIMEOUT_S = 5.0


@dataclass
class _Pending:
    caller: Caller
    waiting: int  # instances yet to answer
    deadline: float


class UserReadiness:
    def __init__(self, registry: ModelRegistry, control: ControlHandler, front: PeerOutbox, back: PeerOutbox) -> None:
        self.registry = registry
        self.control = control
        self.front = front
        self.back = back
        self._checks = itertools.count(1)
        self._pending: dict[int, _Pending] = {}

    def model_ready(self, model: str, version: str, caller: Caller) -> None:
        """The ``model_ready`` control op (deferred): its answer now, or once the checks are in."""
        if not self.control.model_ready(model, version):  # raises for a malformed version, as before
            self._answer(caller, False)
            return
        state = self.registry.resolve(model, version)
        asked = [i for i in state.instances if i.serving and i.user_ready and i.worker is not None]
        if not asked:
            self._answer(caller, True)
            return
        check = next(self._checks)
        self._pending[check] = _Pending(caller, len(asked), time.monotonic() + TIMEOUT_S)
        for inst in asked:
            assert inst.worker is not None
            self.back.send(inst.worker, m.encode(m.ReadyCheck(state.model, state.label, inst.index, check)))

    def on_checked(self, msg: m.ReadyChecked) -> None:
        pending = self._pending.get(msg.check)
        if pending is None:
            return  # answered already (a no, or the time ran out)
        pending.waiting -= 1
        if not msg.ready or pending.waiting <= 0:
            del self._pending[msg.check]
            self._answer(pending.caller, msg.ready)

    def expire(self, now: float) -> None:
        """On the router's tick: checks past ``TIMEOUT_S`` answer not ready."""
        for check in [c for c, p in self._pending.items() if p.deadline <= now]:
            self._answer(self._pending.pop(check).caller, False)

    def _answer(self, caller: Caller, ready: bool) -> None:
        identity, cid = caller
        self.front.send(identity, m.encode(m.ControlReply(cid, result=ready)))
