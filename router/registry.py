"""The router's models by name (``ModelRegistry``): the entries that serve requests, the reloads still
loading, those retiring, and which version serves a request. The entries' state is ``models.py``'s;
an ensemble's entry is ``ensembles/state.py``'s."""

from __future__ import annotations

import itertools
import os
import time

from conveyor.proto.errors import invalid_arg, not_found, unavailable
from conveyor.router.ensembles.state import build_ensemble_entry
from conveyor.router.models import Instance, ModelEntry, VersionState, build_entry, parse_version
from conveyor.router.scheduling.overload import WaitingBook
from conveyor.router.scheduling.queue_policy import DEFAULT_QUEUE_CAP
from conveyor.router.spec.model_spec import ModelSpec
from conveyor.router.spec.namespaces import ambiguous


class ModelRegistry:
    """Models by name. ``models`` serve requests; ``staging`` holds a reload whose
    instances are still loading (the old entry keeps serving until it is ready);
    ``retiring`` holds replaced or unloaded entries finishing their queued and
    running requests before their instances are unloaded."""

    def __init__(self, queue_cap: int = DEFAULT_QUEUE_CAP, slot_padding: bool = False) -> None:
        self.models: dict[str, ModelEntry] = {}
        self.staging: dict[str, ModelEntry] = {}
        self.retiring: list[ModelEntry] = []
        self.unloaded: dict[str, str] = {}  # name -> why, for the repository index
        # --model-namespacing: name -> the keys of the models of that name in several
        # repositories (router/spec/namespaces.py); empty without it. Read on lookup misses only.
        self.namespacing = False
        self.namespaced: dict[str, list[str]] = {}
        self.queue_cap = queue_cap  # per model version; 0 = none
        self.slot_padding = slot_padding  # --sequence-slot-padding
        self.waiting = WaitingBook()  # each version's waiting requests, across its reloads
        self.next_index = itertools.count().__next__
        # Starts from the clock so a restarted router never repeats a generation
        # that ingress caches already hold.
        self.generation = time.time_ns() // 1_000_000 % (1 << 40)

    def build(self, spec: ModelSpec) -> ModelEntry:
        entry: ModelEntry
        if spec.backend == "ensemble" and not spec.error:
            entry = build_ensemble_entry(spec, self)
        else:
            entry = build_entry(spec, self.queue_cap, self.next_index, self.slot_padding)
        for state in entry.versions.values():
            state.waiting = self.waiting.of(state.model, state.version)
            if self.namespacing:
                state.namespace = os.path.dirname(spec.path)
        return entry

    def replace(self, specs: dict[str, ModelSpec]) -> None:
        self.models = {name: self.build(spec) for name, spec in specs.items()}
        self.generation += 1

    def versions(self) -> list[VersionState]:
        """The versions that serve requests."""
        return [v for e in self.models.values() for v in e.versions.values()]

    def live_versions(self) -> list[VersionState]:
        """Serving and staged versions: those that get instances placed."""
        return self.versions() + [v for e in self.staging.values() for v in e.versions.values()]

    def every_version(self) -> list[VersionState]:
        """Everything with instances on workers, retiring entries included."""
        return self.live_versions() + [v for e in self.retiring for v in e.versions.values()]

    def find_instance(self, model: str, version: str, index: int) -> Instance | None:
        for state in self.every_version():
            if state.model == model and state.label == version:
                for inst in state.instances:
                    if inst.index == index:
                        return inst
        return None

    def entry(self, model: str) -> ModelEntry:
        entry = self.models.get(model)
        if entry is None:
            return self._miss(model)
        return entry

    def _miss(self, model: str) -> ModelEntry:
        """A name that is no key: with --model-namespacing, a name several repositories hold
        (one of them loaded: that one; more: Triton's ambiguity error)."""
        if model in self.unloaded:  # Triton keeps an unloaded model's entry, with no version ready
            raise not_found(f"Request for unknown model: '{model}' has no available versions")
        if not self.namespacing:
            raise not_found(f"Request for unknown model: '{model}' is not found")
        loaded = [key for key in self.namespaced.get(model, ()) if key in self.models]
        if len(loaded) == 1:
            return self.models[loaded[0]]
        if loaded:
            raise ambiguous(model, len(loaded))
        # Triton's namespaced lookup (FindModelIdentifier) refuses an unknown name as INVALID_ARG.
        raise invalid_arg(f"Request for unknown model: '{model}' is not found")

    def resolve(self, model: str, version: str) -> VersionState:
        """The version serving a request: the one named, or the newest ready one."""
        number = parse_version(version) if version else -1  # first, as Triton's front ends do
        entry = self.models.get(model)
        if entry is None:
            entry = self._miss(model)
        if entry.spec.error:  # its load failed: Triton's model with no version, and why
            if version:
                raise not_found(f"Request for unknown model: '{model}' version {version} is not found")
            raise unavailable(f"Request for unknown model: '{model}' has no available versions: {entry.spec.error}")
        if version:
            state = entry.versions.get(number)
            if state is None:
                raise not_found(f"Request for unknown model: '{model}' version {version} is not found")
            if not state.ready:
                raise unavailable(
                    f"Request for unknown model: '{model}' version {version} is not at ready state: {state.reason}"
                )
            return state
        newest: VersionState | None = None
        for s in entry.versions.values():  # the newest ready one, without a list or a key function
            if s.ready and (newest is None or s.version > newest.version):
                newest = s
        if newest is None:
            reasons = "; ".join(s.reason for s in entry.versions.values() if s.reason)
            raise unavailable(
                f"Request for unknown model: '{model}' has no available versions"
                + (f": {reasons}" if reasons else "")
            )
        return newest
