"""Settling: after every event that can change an instance's state, staged reloads that
are ready swap in (or, failed, retire while the old entry keeps serving), the load calls
whose models settled are answered, and retired entries that are idle give up their
instances to unload."""

from __future__ import annotations

import logging
from collections.abc import Collection

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.lifecycle import instance_update
from conveyor.router.lifecycle.entry_state import failure_of, load_failed, loading, problem_of
from conveyor.router.lifecycle.loads import ModelLoads
from conveyor.router.lifecycle.records import Answer, LoadWaiter, Settled
from conveyor.router.models import UNLOADED, Instance, ModelEntry, add_dropped_versions, without_shared
from conveyor.router.scheduling.sequences import SequenceBatcher
from conveyor.router.spec.namespaces import name_of

log = logging.getLogger("conveyor.router.lifecycle")  # one name for all the lifecycle's log lines, as before


class Settling(ModelLoads):
    @property
    def busy(self) -> bool:
        """Anything for ``settle`` to do (checked on the router's hot path)."""
        return bool(self._waiters or self._answers or self.registry.staging or self.registry.retiring or self._fresh
                    or self._updating or self._leaving or self._lingering or self._deferred)

    def settle(self, running_instances: set[int], workers: Collection[bytes] | None = None) -> Settled:
        """Swap staged entries that are ready, drop those that failed, answer the
        calls whose model settled (and those answered later), and pick retired instances
        that are idle. ``running_instances`` holds ``id()`` of instances with a batch in flight;
        ``workers``, when given, the workers there are (an instance closing on one gone is closed)."""
        out = Settled(self._answers)
        self._answers = []
        registry = self.registry
        if self._updating or self._leaving or self._closing or self._lingering:
            self._settle_updates(out, running_instances, workers)
        for name, entry in list(registry.staging.items()):
            if loading(entry):
                continue
            del registry.staging[name]
            problem = problem_of(entry)
            if problem:
                log.error("reloading model '%s' failed, the loaded one keeps serving: %s", name, problem)
                log.info("failed to load '%s'", name_of(name))
                registry.retiring.append(without_shared(entry, registry.models.get(name)))
                self._answer(out, name, load_failed(name, problem))
                continue
            old = registry.models.get(name)
            registry.models[name] = entry
            registry.generation += 1
            if old is not None:
                add_dropped_versions(entry, old, registry.queue_cap, registry.next_index)
                registry.retiring.append(without_shared(old, entry))
            log.info("successfully loaded '%s'", name_of(name))  # Triton's line (the new versions serve)
            self._answer(out, name, None)
        for waiter in list(self._waiters):
            if not self._answerable(waiter) or waiter.name in registry.staging or waiter.name in self._updating:
                continue
            current = registry.models.get(waiter.name)
            if current is not None and loading(current):
                continue
            self._waiters.remove(waiter)
            error: ConveyorError | None
            if current is None:  # what Triton answers for the same miss
                error = ConveyorError(Status.INTERNAL, f"failed to load '{name_of(waiter.name)}', "
                                                       "unexpected miss in global map")
            else:
                problem = problem_of(current)
                error = load_failed(waiter.name, problem) if problem else None
            out.answers.append(Answer(waiter.reply_to, error))
        self._all_or_none(out)
        if self._deferred:
            self._apply_deferred()
        keep: list[ModelEntry] = []
        for entry in registry.retiring:
            states = list(entry.versions.values())
            if any(len(s.batcher) for s in states) or any(
                id(i) in running_instances for s in states for i in s.instances
            ):
                keep.append(entry)
                continue
            out.unload += [i for s in states for i in s.instances if i.worker is not None]
        registry.retiring = keep
        return out

    def _settle_updates(self, out: Settled, running: set[int], workers: Collection[bytes] | None) -> None:
        """Instance updates in place: once every added instance settled, the update commits (the removed
        instances leave) or is undone (the added ones leave); leaving instances that are idle are unloaded;
        an update whose removed instances are all closed answers its call."""
        if workers is not None:
            for closing, worker in list(self._closing.items()):
                if worker not in workers:  # its worker is gone, and the instance with it
                    del self._closing[closing]
        for key, update in list(self._updating.items()):
            if self.registry.models.get(key) is not update.entry:  # replaced or unloaded meanwhile
                del self._updating[key]
                continue
            if update.committed or update.adding():
                continue
            failure = update.failure()
            if not failure:
                gone, lingering = instance_update.commit(update)
                self._leaving += gone
                self._lingering += lingering
                continue
            self._leaving += instance_update.undo(update)
            del self._updating[key]
            self.registry.generation += 1
            log.error("updating the instances of model '%s' failed, it serves as it was: %s", key, failure)
            self._answer(out, key, ConveyorError(
                Status.INVALID_ARG, f"load failed for model '{name_of(key)}': {failure}\n"))
        for inst in list(self._lingering):  # removed with sequences: they leave once those end
            state = inst.version
            if inst not in state.instances:  # its version went whole (unloaded, replaced)
                self._lingering.remove(inst)
            elif not (isinstance(state.batcher, SequenceBatcher) and state.batcher.holds(inst)):
                self._lingering.remove(inst)
                state.instances = [i for i in state.instances if i is not inst]
                self._leaving.append(inst)
        keep: list[Instance] = []
        for inst in self._leaving:
            if inst.running or id(inst) in running:
                keep.append(inst)
                continue
            if inst.worker is not None:
                self._closing[(inst.version.model, inst.version.label, inst.index)] = inst.worker
            out.shrink.append(inst)
        self._leaving = keep
        for key, update in list(self._updating.items()):
            if update.committed and not any(
                    i in self._leaving or (i.version.model, i.version.label, i.index) in self._closing
                    for i in update.gone):
                del self._updating[key]
                log.info("successfully loaded '%s'", name_of(key))  # Triton's line for the load call
                self._answer(out, key, None)

    def closed(self, model: str, version: str, index: int) -> None:
        """A worker closed an instance the router unloaded (its model's ``finalize`` returned)."""
        self._closing.pop((model, version, index), None)

    def _all_or_none(self, out: Settled) -> None:
        """A model loaded in place whose versions all settled: if one failed, the others are unloaded
        (Triton's load tracker: a load succeeds for every version or for none). After the calls are
        answered: their answer names only the versions that failed, as Triton's."""
        for key in list(self._fresh):
            entry = self.registry.models.get(key)
            if entry is not None and not entry.spec.error and loading(entry):
                continue
            self._fresh.discard(key)
            if entry is None or entry.spec.error:
                continue
            failures = {v: failure_of(s) for v, s in entry.versions.items()}
            if not any(failures.values()):
                if entry.versions:
                    log.info("successfully loaded '%s'", name_of(key))  # Triton's line
                continue
            for v, state in entry.versions.items():
                if not state.ready:
                    continue
                state.error = failures[v] or UNLOADED  # a version with a failed instance keeps its reason
                out.unload += [i for i in state.instances if i.worker is not None]
                state.instances = []
            self.registry.generation += 1
            log.info("failed to load '%s'", name_of(key))

    def _answerable(self, waiter: LoadWaiter) -> bool:
        """Nothing its answer depends on is still being prepared."""
        return waiter.resolved and not any(key in self._preparing for key in waiter.keys)

    def _answer(self, out: Settled, name: str, error: ConveyorError | None) -> None:
        for waiter in [w for w in self._waiters if w.name == name and self._answerable(w)]:
            self._waiters.remove(waiter)
            out.answers.append(Answer(waiter.reply_to, error))
