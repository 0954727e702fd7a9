"""Settling: after every event that can change an instance's state, staged reloads that
are ready swap in (or, failed, retire while the old entry keeps serving), the load calls
whose models settled are answered, and retired entries that are idle give up their
instances to unload."""

from __future__ import annotations

import logging

from conveyor.proto.errors import ConveyorError, Status
from conveyor.router.lifecycle.entry_state import load_failed, loading, problem_of
from conveyor.router.lifecycle.loads import ModelLoads
from conveyor.router.lifecycle.records import Answer, LoadWaiter, Settled
from conveyor.router.models import ModelEntry
from conveyor.router.spec.namespaces import name_of

log = logging.getLogger("conveyor.router.lifecycle")  # one name for all the lifecycle's log lines, as before


class Settling(ModelLoads):
    @property
    def busy(self) -> bool:
        """Anything for ``settle`` to do (checked on the router's hot path)."""
        return bool(self._waiters or self._answers or self.registry.staging or self.registry.retiring)

    def settle(self, running_instances: set[int]) -> Settled:
        """Swap staged entries that are ready, drop those that failed, answer the
        calls whose model settled (and those answered later), and pick retired instances
        that are idle. ``running_instances`` holds ``id()`` of instances with a batch in flight."""
        out = Settled(self._answers)
        self._answers = []
        registry = self.registry
        for name, entry in list(registry.staging.items()):
            if loading(entry):
                continue
            del registry.staging[name]
            problem = problem_of(entry)
            if problem:
                log.error("reloading model '%s' failed, the loaded one keeps serving: %s", name, problem)
                registry.retiring.append(entry)
                self._answer(out, name, load_failed(name, problem))
                continue
            old = registry.models.get(name)
            registry.models[name] = entry
            registry.generation += 1
            if old is not None:
                registry.retiring.append(old)
            log.info("model '%s' reloaded: the new versions serve", name)
            self._answer(out, name, None)
        for waiter in list(self._waiters):
            if not self._answerable(waiter) or waiter.name in registry.staging:
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

    def _answerable(self, waiter: LoadWaiter) -> bool:
        """Nothing its answer depends on is still being prepared."""
        return waiter.resolved and not any(key in self._preparing for key in waiter.keys)

    def _answer(self, out: Settled, name: str, error: ConveyorError | None) -> None:
        for waiter in [w for w in self._waiters if w.name == name and self._answerable(w)]:
            self._waiters.remove(waiter)
            out.answers.append(Answer(waiter.reply_to, error))
