"""Runtime LoRA adapters across the group: the ``lora_load`` / ``lora_unload`` control ops (the
OpenAI ingress's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``).

A load goes to every instance of the model that serves (``LoraUpdate`` to its worker, which gives
it to the engine: a bad path fails there) and is answered once all have it, or with the first
failure, after which the instances that took it drop it again. The adapter is then kept in the
``AdapterBook``: each instance of the model that becomes ready later gets it before its first batch
(messages to a worker arrive in order), so a worker restarted by its supervisor serves it again.
Each change bumps the repository generation: every ingress drops what it knew of the models and
reads the adapters again. Kept in the router's memory: a restarted router has none (as vLLM's
server forgets its runtime adapters when it restarts).
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from conveyor.proto import messages as m
from conveyor.proto.errors import ConveyorError, Status, invalid_arg
from conveyor.proto.framing import PeerOutbox
from conveyor.proto.lora import RUNTIME_PARAMETER, runtime_updates_allowed
from conveyor.router.control_table import Caller
from conveyor.router.lora_book import Adapter, AdapterBook
from conveyor.router.models import Instance, InstanceState
from conveyor.router.registry import ModelRegistry

log = logging.getLogger(__name__)

TIMEOUT_S = 120.0  # an engine loads an adapter in well under a second; this bounds a worker that hangs


@dataclass
class _Pending:
    caller: Caller
    name: str
    previous: Adapter | None  # the adapter a load in place replaces
    owed: dict[bytes, int]  # answers still owed, by worker: a worker lost owes none (``worker_lost``)
    deadline: float
    error: ConveyorError | None = None


class RuntimeLora:
    def __init__(self, registry: ModelRegistry, front: PeerOutbox, back: PeerOutbox) -> None:
        self.registry = registry
        self.front = front
        self.back = back
        self.book = AdapterBook()
        self._checks = itertools.count(1)
        self._pending: dict[int, _Pending] = {}

    def load(self, model: str, name: str, path: str, inplace: bool, caller: Caller) -> None:
        """The ``lora_load`` op (deferred): answered once every serving instance has the adapter."""
        entry = self.registry.entry(model)  # NOT_FOUND for a model the router does not know
        if not runtime_updates_allowed(entry.spec.config):
            raise invalid_arg(f"model '{model}' does not take LoRA adapters at run time: its config.pbtxt needs "
                              f"parameters {{ key: \"{RUNTIME_PARAMETER}\" value: {{ string_value: \"true\" }} }}")
        self.book.check_load(name, path, model, inplace, self.registry.models)
        targets = self._instances(model)
        if not targets:
            raise ConveyorError(Status.UNAVAILABLE, f"model '{model}' has no instance loaded to take the adapter")
        previous = self.book.begin(name, model, path)
        check = next(self._checks)
        owed: dict[bytes, int] = {}
        for inst in targets:
            assert inst.worker is not None
            owed[inst.worker] = owed.get(inst.worker, 0) + 1
        self._pending[check] = _Pending(caller, name, previous, owed, time.monotonic() + TIMEOUT_S)
        for inst in targets:
            self._send(inst, name, path, check)

    def unload(self, name: str) -> dict[str, str]:
        """The ``lora_unload`` op: forgotten at once; each instance drops it before its next batch."""
        adapter = self.book.remove(name)
        for inst in self._instances(adapter.model):
            self._send(inst, name, "", 0)
        self.registry.generation += 1
        log.info("LoRA adapter '%s' of model '%s' unloaded", name, adapter.model)
        return {"model": adapter.model, "message": f"Success: LoRA adapter '{name}' removed successfully."}

    def listing(self) -> dict[str, object]:
        """The ``lora_adapters`` op: the loaded adapters, and the generation they belong to."""
        return {"generation": self.registry.generation, "adapters": self.book.listing()}

    def on_ready(self, inst: Instance) -> None:
        """An instance became ready: it gets the model's runtime adapters before any batch."""
        for adapter in self.book.of_model(inst.version.model):
            self._send(inst, adapter.name, adapter.path, 0)

    def on_updated(self, worker: bytes, msg: m.LoraUpdated) -> None:
        pending = self._pending.get(msg.check)
        if pending is None:
            if msg.error is not None:  # an adapter given again to a new instance, or an answer too late
                log.warning("a runtime LoRA adapter could not be given to a model instance: %s", msg.error.message)
            return
        if msg.error is not None and pending.error is None:
            pending.error = ConveyorError(Status(msg.error.status), msg.error.message)
        left = pending.owed.get(worker, 0) - 1
        if left > 0:
            pending.owed[worker] = left
        else:
            pending.owed.pop(worker, None)
        self._settle_if_answered(msg.check)

    def worker_lost(self, worker: bytes) -> None:
        """A worker is gone: the loads waiting on it are answered by the others (its instances, placed
        again, get the adapter when they are ready: ``on_ready``)."""
        for check in [c for c, p in self._pending.items() if p.owed.pop(worker, None) is not None]:
            self._settle_if_answered(check)

    def _settle_if_answered(self, check: int) -> None:
        if not self._pending[check].owed:
            self._settle(self._pending.pop(check))

    def expire(self, now: float) -> None:
        """On the router's tick: loads not answered within ``TIMEOUT_S`` fail (and are undone)."""
        for check in [c for c, p in self._pending.items() if p.deadline <= now]:
            pending = self._pending.pop(check)
            pending.error = pending.error or ConveyorError(
                Status.UNAVAILABLE, f"LoRA adapter '{pending.name}' was not loaded by every instance within "
                                    f"{TIMEOUT_S:.0f} s")
            self._settle(pending)

    def _settle(self, pending: _Pending) -> None:
        adapter = self.book.adapters[pending.name]
        if pending.error is None:
            self.book.confirm(pending.name)
            self.registry.generation += 1
            log.info("LoRA adapter '%s' of model '%s' loaded from '%s'", adapter.name, adapter.model, adapter.path)
            self._answer(pending.caller, m.ControlReply(
                pending.caller[1], result={"message": f"Success: LoRA adapter '{adapter.name}' added successfully."}))
            return
        # Undone everywhere: the instances that took it drop it (or go back to the adapter it replaced).
        self.book.restore(pending.name, pending.previous)
        back_to = pending.previous.path if pending.previous is not None else ""
        for inst in self._instances(adapter.model):
            self._send(inst, pending.name, back_to, 0)
        error = pending.error
        self._answer(pending.caller, m.ControlReply(pending.caller[1], error=m.ErrorInfo(int(error.status),
                                                                                          error.message)))

    def _instances(self, model: str) -> list[Instance]:
        """Every loaded instance of the model, of each of its versions, serving or on their way out."""
        return [i for s in self.registry.every_version() if s.model == model for i in s.instances
                if i.worker is not None and i.state in (InstanceState.READY, InstanceState.DRAINING)]

    def _send(self, inst: Instance, name: str, path: str, check: int) -> None:
        assert inst.worker is not None
        state = inst.version
        self.back.send(inst.worker, m.encode(m.LoraUpdate(state.model, state.label, inst.index, check, name, path)))

    def _answer(self, caller: Caller, reply: m.ControlReply) -> None:
        self.front.send(caller[0], m.encode(reply))
