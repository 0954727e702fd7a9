"""Start-up's loads and POLL mode: the repositories listed (by the agent), and what they
hold loaded; in POLL mode, on each tick, new and changed models loaded again and removed
ones unloaded."""

from __future__ import annotations

import logging

from conveyor.router.lifecycle.entry_state import loading, problem_of
from conveyor.router.lifecycle.loads import ModelLoads
from conveyor.router.lifecycle.records import ControlMode, Prep, Why
from conveyor.router.repository.cloud.roots import UnusableRepository
from conveyor.router.repository.prepare import Listing, listing
from conveyor.router.spec.namespaces import assign_keys, duplicated

log = logging.getLogger("conveyor.router.lifecycle")  # one name for all the lifecycle's log lines, as before


def not_found_at_start(name: str) -> str:
    """A --load-model name that no repository holds, in Triton's words (what its fixtures look for)."""
    return f"failed to poll model '{name}': model not found in any model repository"


class StartupAndPolling(ModelLoads):
    @property
    def starting(self) -> bool:
        """Start-up's models are not all read and entered yet: the server is not ready (then their
        versions' states say, as their instances load on the workers)."""
        return self._listing_at_start or self._startup_left > 0

    def startup(self) -> None:
        """Start-up's loads, waited for (tests and tools; the router's loop calls ``begin_startup``)."""
        self.begin_startup()
        self.agent.wait()

    def begin_startup(self) -> None:
        self._listing_at_start = True
        repos = self._repos()
        check = self._check

        def first_look() -> Listing:
            if check is not None:
                check()  # a root the server cannot start with: UnusableRepository
            return listing(repos, sync=True, quiet=False)

        self.agent.submit(self._listing_lane(), first_look, self._listed_at_start)

    def _listed_at_start(self, outcome: Listing | Exception) -> None:
        self._listing_at_start = False
        if isinstance(outcome, UnusableRepository):
            self.unusable = outcome  # the router says so and exits
            return
        if isinstance(outcome, Exception):
            log.error("cannot read the model repositories: %s", outcome)
            return
        names = outcome.on_disk
        if self.namespacing:
            self.registry.namespaced = duplicated(names)
        self.twice = outcome.twice
        if self.mode is ControlMode.EXPLICIT and "*" not in self.load_at_start:
            self._startup_disk = {k: p for k, p in names.items() if k not in outcome.twice}
            for name in self.load_at_start:
                if name in outcome.twice:
                    self._not_unique(name)
                    continue
                keys = self._keys(name, names)
                if not keys:
                    log.error("%s.", not_found_at_start(name))
                for key in keys:
                    self._prepare(Prep(key, names[key], Why.STARTUP))
            return
        if self.namespacing:
            for key, path in assign_keys(outcome.dirs).items():
                self._prepare(Prep(key, path, Why.STARTUP))
            return
        for entry, path in names.items():
            if entry in outcome.twice:
                self._not_unique(entry)
            else:
                self._prepare(Prep(entry, path, Why.STARTUP))

    def _not_unique(self, name: str) -> None:
        """A name several repositories hold: Triton loads neither (its poll failure), and unloads one it had."""
        log.error("failed to poll model '%s': not unique across all model repositories", name)
        self.poll_failures[name] = "not unique across all model repositories"
        if name in self.registry.models or name in self.registry.staging or name in self._preparing:
            self._unload(name)

    def startup_outcome(self) -> str | None:
        """After start-up: None while a model still loads, else why not every model is ready
        ('' when all are): what --exit-on-error decides on."""
        if self.starting:
            return None
        problems = []
        for name, entry in sorted(self.registry.models.items()):
            if loading(entry):
                return None
            problem = problem_of(entry)
            if problem:
                problems.append(f"failed to load '{name}': {problem}")
        for name, error in sorted(self.poll_failures.items()):
            problems.append(f"Poll failed for model directory '{name}': {error}")
        for name in self.load_at_start:
            if (name != "*" and name not in self.registry.models and name not in self.registry.namespaced
                    and name not in self.poll_failures):
                problems.append(not_found_at_start(name))
        return "; ".join(problems)

    def poll(self) -> None:
        """One poll, waited for (tests and tools; the router's loop calls ``begin_poll``)."""
        self.begin_poll()
        self.agent.wait()

    def begin_poll(self) -> None:
        """POLL mode: look at the repositories; then load new and changed models, unload removed ones."""
        if self._polling or self.starting:
            return  # the next tick asks again
        self._polling = True
        repos = self._repos()
        self.agent.submit(self._listing_lane(), lambda: listing(repos, sync=True, prints=True), self._polled)

    def _polled(self, outcome: Listing | Exception) -> None:
        self._polling = False
        if isinstance(outcome, Exception):
            log.error("polling the model repositories failed: %s", outcome)
            return
        names = outcome.on_disk
        self.twice = outcome.twice
        if self.namespacing:
            namespaced = duplicated(names)
            if namespaced != self.registry.namespaced:
                # Keys changed: ensembles resolve their steps again (they do on being built).
                self.registry.namespaced = namespaced
                for key, entry in self.registry.models.items():
                    if entry.spec.backend == "ensemble":
                        self._prints.pop(key, None)
        for name, path in sorted(names.items()):
            if name in outcome.twice:
                if name not in self.poll_failures:
                    self._not_unique(name)
                continue
            if (self._prints.get(name) != outcome.prints.get(name) and name not in self.registry.staging
                    and name not in self._preparing):
                log.info("model '%s' changed on disk: reloading", name)
                self._prepare(Prep(name, path, Why.POLL))
        for name in list(self.registry.models):
            if name not in names:
                log.info("model '%s' left the repository: unloading", name)
                self._unload(name)
